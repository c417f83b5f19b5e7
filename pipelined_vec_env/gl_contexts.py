"""Each simulator renders through its own GL context, whatever else renders in its process.

robosuite 1.4's ``MjRenderContext`` makes its GL context current only when it is built and
when it uploads a texture; its ``render`` and ``read_pixels`` draw with whatever context is
current in the thread. gymnasium 1.x's ``MujocoRenderer`` makes a viewer's context current
only when that one env has several viewers. So once a second env has built its renderer in
the process, the first draws through the second's context with its own ``MjrContext``,
whose mesh and texture ids name the other model's uploads: its frames show parts of the
other scene (floors, skies, objects), silently. Freeing an ``MjrContext`` in another env's
context deletes that env's uploads too.

`own_robosuite_context` and `own_gymnasium_contexts` give one env's renderer a subclass (the
class of that one object: no library function is replaced for anyone else) that makes its
own GL context current before it draws, reads pixels or frees, and releases it afterwards,
so that envs of one process may render in any order and from any thread. EGL and OSMesa
are released explicitly; GLFW (a window) is made current but left to its window.
`own_gl_contexts` applies whichever fits an env (workers call it on every env they build).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

__all__ = ["own_gl_contexts", "own_gymnasium_contexts", "own_robosuite_context", "releaser"]


def releaser(gl_ctx: Any) -> Callable[[], None]:
    """A function that leaves no GL context current in the calling thread, for the backend
    of ``gl_ctx`` (robosuite's or MuJoCo's EGL or OSMesa context); a no-op for others."""
    module = type(gl_ctx).__module__
    if module.endswith("osmesa_context") or module == "mujoco.osmesa":
        from OpenGL import GL, osmesa

        return lambda: osmesa.OSMesaMakeCurrent(None, None, GL.GL_FLOAT, 0, 0)
    if module.endswith("egl_context") or module == "mujoco.egl":
        import importlib

        owner = importlib.import_module(module)
        egl = owner.EGL
        return lambda: egl.eglMakeCurrent(
            owner.EGL_DISPLAY, egl.EGL_NO_SURFACE, egl.EGL_NO_SURFACE, egl.EGL_NO_CONTEXT
        )
    return lambda: None


# ----------------------------------------------------------------------------- robosuite


@functools.cache
def _robosuite_class(base: type) -> type:
    """``base`` (robosuite's ``MjRenderContextOffscreen``) drawing in its own context."""

    class OwnContext(base):  # type: ignore[misc, valid-type]
        """robosuite's offscreen render context, current only while it draws or frees."""

        owns_gl_context = True

        def render(self, *args: Any, **kwargs: Any) -> Any:
            # also covers update_offscreen_size, which render may call (a new MjrContext)
            self.gl_ctx.make_current()
            return super().render(*args, **kwargs)

        def read_pixels(self, *args: Any, **kwargs: Any) -> Any:
            self.gl_ctx.make_current()
            try:
                return super().read_pixels(*args, **kwargs)
            finally:
                releaser(self.gl_ctx)()

        def __del__(self) -> None:
            # free this context's uploads, not another's (at interpreter exit EGL may be
            # terminated already: nothing is left to free then)
            with contextlib.suppress(Exception):
                self.gl_ctx.make_current()
            super().__del__()

    OwnContext.__qualname__ = OwnContext.__name__ = f"OwnContext{base.__name__}"
    return OwnContext


def own_robosuite_context(sim: Any) -> None:
    """Make robosuite simulator ``sim`` render only through its own GL context.

    Call it once the env built its offscreen renderer (robosuite does at construction);
    without one it does nothing. Idempotent.

    Args:
        sim: A ``robosuite.utils.binding_utils.MjSim``.
    """
    context = sim._render_context_offscreen
    if context is None or getattr(context, "owns_gl_context", False):
        return
    from robosuite.utils.binding_utils import _MjSim_render_lock

    with _MjSim_render_lock:  # no render of another thread sees the class change midway
        context.__class__ = _robosuite_class(type(context))
        releaser(context.gl_ctx)()  # robosuite left it current at construction


# ----------------------------------------------------------------------------- gymnasium


@functools.cache
def _gymnasium_class(base: type) -> type:
    """``base`` (gymnasium's ``MujocoRenderer``) drawing each viewer in its own context."""

    class OwnContext(base):  # type: ignore[misc, valid-type]
        """gymnasium's MuJoCo renderer, each viewer current only while it draws or frees."""

        owns_gl_context = True

        def _get_viewer(self, render_mode: str | None) -> Any:
            viewer = super()._get_viewer(render_mode)
            viewer.make_context_current()
            return viewer

        def render(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().render(*args, **kwargs)
            finally:
                if self.viewer is not None and hasattr(self.viewer, "opengl_context"):
                    releaser(self.viewer.opengl_context)()

        def close(self) -> None:
            for viewer in self._viewers.values():
                with contextlib.suppress(Exception):
                    viewer.make_context_current()
                    viewer.con.free()  # in its own context, before the context goes
            super().close()

    OwnContext.__qualname__ = OwnContext.__name__ = f"OwnContext{base.__name__}"
    return OwnContext


def own_gymnasium_contexts(renderer: Any) -> None:
    """Make gymnasium MuJoCo renderer ``renderer`` (``env.unwrapped.mujoco_renderer``) draw
    each of its viewers only through that viewer's GL context. Idempotent."""
    if not getattr(renderer, "owns_gl_context", False):
        renderer.__class__ = _gymnasium_class(type(renderer))


def own_gl_contexts(env: Any) -> Any:
    """Make ``env`` render through its own GL contexts where it is a gymnasium MuJoCo env
    (its ``unwrapped.mujoco_renderer``); other envs are left as they are. Returns ``env``."""
    renderer = getattr(getattr(env, "unwrapped", None), "mujoco_renderer", None)
    if renderer is not None and type(renderer).__module__.startswith("gymnasium.envs.mujoco"):
        own_gymnasium_contexts(renderer)
    return env
