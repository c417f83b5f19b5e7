"""An answer pickled for the pipe: plain pickle, else cloudpickle, else a `Raised` naming
the env, the key and the type of the first observation or info value that cannot be sent.

The worker's serve loop pickles each answer before writing any of it, so one that cannot
be pickled becomes its `Raised` and the caller still gets exactly one answer. Finding the
value at fault (pickling each part, innermost first) runs only on that failure path.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import cloudpickle

from .protocol import Answer, Command, Ok, Raised, to_wire
from .worker_envs import WorkerEnvs

__all__ = ["answer_locator", "locate_unsendable", "pickle_answer", "step_locator"]


def pickle_answer(message: Any, locate: Callable[[], Exception | None] | None = None) -> bytes:
    """``message`` pickled as `worker.send_answer` does: plain pickle, else cloudpickle;
    one that neither can pickle becomes its `Raised` (with ``locate``, the exception it
    returns: one naming the env and key of the value that cannot be sent), so the caller
    always gets an answer.

    Returns:
        The bytes to write to the pipe (protocol 5).
    """
    try:
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        pass
    try:
        return cloudpickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        located = locate() if locate is not None else None
        if located is not None:
            try:
                raise located from exc
            except type(located) as chained:
                exc = chained
        return pickle.dumps(to_wire(Raised.from_exception(exc)), protocol=pickle.HIGHEST_PROTOCOL)


def _sendable(value: Any) -> bool:
    try:
        cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return False
    return True


def _innermost_unsendable(value: Any, path: str) -> tuple[str, Any] | None:
    """``(path, value)`` of the innermost part of ``value`` that cannot be pickled (keys
    of nested dicts, indices of lists and tuples), or None when all of it can."""
    if _sendable(value):
        return None
    children: Any = ()
    if isinstance(value, dict):
        children = ((f"{path}[{key!r}]", item) for key, item in value.items())
    elif isinstance(value, (list, tuple)):
        children = ((f"{path}[{i}]", item) for i, item in enumerate(value))
    for child_path, item in children:
        found = _innermost_unsendable(item, child_path)
        if found is not None:
            return found
    return path, value


def locate_unsendable(
    envs: WorkerEnvs, targets: Any, items: Any, infos: list[list[dict]]
) -> Exception | None:
    """A `TypeError` naming the env, the key and the type of the first observation or
    info value of ``targets`` (local env indices, in answer order) that cannot be sent."""
    for k, local in enumerate(targets):
        parts = [("observation", items[k])] if items is not None else []
        parts += [("info", info) for info in infos[k]]
        for name, value in parts:
            found = _innermost_unsendable(value, name)
            if found is not None:
                path, leaf = found
                kind = f"{type(leaf).__module__}.{type(leaf).__qualname__}"
                return TypeError(
                    f"env {envs.env_indices[local]}: {path} holds a {kind}, which cannot be "
                    "pickled to send it to the caller; return something picklable there "
                    "(or keep it inside the env)"
                )
    return None


def step_locator(
    envs: WorkerEnvs, request: Any, items: Any, infos: list[list[dict]]
) -> Callable[[], Exception | None]:
    """For a fast step's ``request`` (``(local_indices or None, actions)``), a
    `locate_unsendable` of its observation ``items`` (None: in the buffers) and ``infos``."""
    targets = range(len(envs.envs)) if request[0] is None else request[0]
    return lambda: locate_unsendable(envs, targets, items, infos)


def answer_locator(
    envs: WorkerEnvs, command: Command, payload: Any, answer: Answer
) -> Callable[[], Exception | None] | None:
    """For a step or reset answer, a `locate_unsendable` of its observations and infos;
    None for any other answer."""
    if not isinstance(answer, Ok) or command not in (Command.STEP, Command.RESET):
        return None
    if command == Command.STEP:
        targets = range(len(envs.envs)) if payload[0] is None else payload[0]
        items, infos = answer.payload[0], answer.payload[4]
    else:
        targets = [request[0] for request in payload]
        items, infos = answer.payload
    return lambda: locate_unsendable(envs, targets, items, infos)
