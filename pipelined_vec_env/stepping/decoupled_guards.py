"""The checks that keep stage calls and decoupled ``send``/``recv`` off each other's envs.

Stage calls (``step``, ``reset``, ``step_async``/``step_wait`` per stage) and decoupled
stepping share the workers: an env whose result is in flight or waits to be returned by
``recv`` belongs to decoupled stepping until it is received, and an ``async_reset`` needs
every stage and env idle. Both checks read the public state of a
[`DecoupledState`][pipelined_vec_env.stepping.decoupled.DecoupledState].
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .decoupled import DecoupledState

__all__ = ["check_can_reset", "check_free"]


def check_free(state: DecoupledState, envs: slice, op: str) -> None:
    """Refuse a stage ``op`` (``"step"`` or ``"reset"``) on envs that decoupled stepping
    drives.

    A reset may take envs that were received and not sent (it ends their decoupled use:
    they are forgotten by ``state``); anything in flight must be received first.

    Raises:
        RuntimeError: Mixing ``step_*``/``reset_*`` and ``send``/``recv`` on the same envs.
    """
    if not state.active:
        return
    ready_ids = {g for r in state.ready for g in r.ids}
    pending = (state.in_flight | ready_ids) & set(range(envs.start, envs.stop))
    held = state.received & set(range(envs.start, envs.stop))
    if pending or (held and op != "reset"):
        ids = sorted(pending | (held if op != "reset" else set()))
        raise RuntimeError(
            f"envs {ids} are driven by send/recv (decoupled mode); "
            f"{'recv their results' if pending else 'send their actions'} before `{op}`, "
            "or reset them once they are received"
        )
    if op == "reset":
        state.received -= held
        for g in held:
            state.restarted.pop(g, None)
        state.active = bool(state.in_flight or state.received or state.ready)


def check_can_reset(state: DecoupledState) -> None:
    """Refuse an ``async_reset`` while stage calls or decoupled commands are in flight.

    Raises:
        RuntimeError: A stage has a call in flight, or envs are in flight from ``send``.
    """
    stages = state.env.stages
    if any(s.busy for s in stages):
        busy = [s.index for s in stages if s.busy]
        raise RuntimeError(f"async_reset: stages {busy} have calls in flight; wait for them first")
    if state.in_flight or state.ready:
        raise RuntimeError("async_reset: envs are still in flight from send/recv; recv them first")
