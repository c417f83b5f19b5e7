"""The caller's `__main__` script in the workers: loaded only when something needs it.

`spawn` and `forkserver` children normally re-run the parent's main script (as
`__mp_main__`) before anything else, so that objects pickled by reference to `__main__`
resolve. For a script that imports torch that costs each worker seconds and hundreds of
MB, and most workers never need it: env constructors travel by value (cloudpickle).
So workers start without it (the parent hides its main module while starting them, see
`worker_handle.py`) and get a stand-in `__main__` (also registered as `__mp_main__`)
that runs the script the first time it is asked for a name it does not have:

- unpickling something defined in the script by reference (a class of a script that
  itself runs in a spawned child, where it is `__mp_main__.MyEnv`);
- an entry point `"__main__:MyEnv"` (gymnasium looks the class up on `__main__`);
- an env id registered by the script (`gym.register(...)` at module level): the worker
  catches gymnasium's `UnregisteredEnv` from an env constructor, loads the script, and
  calls the constructor again.

The script runs with `__name__ == "__mp_main__"`, as `multiprocessing.spawn` runs it, so
code under `if __name__ == "__main__":` does not run. With `fork` nothing is hidden: the
child has the parent's `__main__` already.
"""

from __future__ import annotations

import logging
import multiprocessing.process
import os
import runpy
import sys
import time
import types
from typing import Any

__all__ = ["install_lazy_main", "load_main", "main_reference"]

logger = logging.getLogger(__name__)

#: The installed stand-in's state (one per worker process).
_state: dict[str, Any] = {"ref": None, "module": None, "loaded": False, "loading": False}


def main_reference() -> tuple[str, str] | None:
    """How a worker can load this process's main module, as `multiprocessing.spawn` would.

    Returns:
        `("name", module_name)` for `python -m module`, `("path", absolute_path)` for a
        script, or None where there is nothing to load (an interactive session, a
        package's `__main__`, which spawn does not re-run either).
    """
    main = sys.modules.get("__main__")
    if main is None:
        return None
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        if name == "__main__" or name.endswith(".__main__"):
            return None
        return ("name", name)
    path = getattr(main, "__file__", None)
    if path is None:
        return None
    if not os.path.isabs(path) and multiprocessing.process.ORIGINAL_DIR is not None:
        path = os.path.join(multiprocessing.process.ORIGINAL_DIR, path)
    return ("path", os.path.normpath(path))


class _LazyMain(types.ModuleType):
    """A `__main__` that runs the caller's script on the first lookup of a missing name."""

    def __getattr__(self, name: str) -> Any:
        if not (name.startswith("__") and name.endswith("__")) and load_main():
            try:
                return self.__dict__[name]
            except KeyError:
                pass
        raise AttributeError(f"module '__main__' has no attribute {name!r}")


def install_lazy_main(ref: tuple[str, str] | None) -> None:
    """Make `sys.modules["__main__"]` (and `"__mp_main__"`) the stand-in for ``ref``.

    Args:
        ref: What `main_reference` returned in the caller; None installs nothing.
    """
    if ref is None:
        return
    module = _LazyMain("__mp_main__")
    _state.update(ref=ref, module=module, loaded=False, loading=False)
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module


def load_main() -> bool:
    """Run the caller's main script into the stand-in `__main__`, once.

    Returns:
        Whether the script is loaded (False: nothing installed, or a load in progress,
        as when the script itself looks up a missing name while it runs).

    Raises:
        Exception: Whatever the script raised while loading (it is not retried).
    """
    if _state["loaded"] or _state["loading"] or _state["ref"] is None:
        return bool(_state["loaded"])
    kind, value = _state["ref"]
    module = _state["module"]
    _state["loading"] = True
    start = time.perf_counter()
    try:
        if kind == "name":
            content = runpy.run_module(value, run_name="__mp_main__", alter_sys=True)
        else:
            content = runpy.run_path(value, run_name="__mp_main__")
    finally:
        _state["loading"] = False
        _state["loaded"] = True  # once: a script that failed is not run again
        sys.modules["__main__"] = sys.modules["__mp_main__"] = module
    module.__dict__.update(content)
    logger.debug("loaded the caller's main module %s in %.2f s", value, time.perf_counter() - start)
    return True
