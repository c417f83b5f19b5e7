"""Bounded waits: deadlines on one clock (``time.monotonic``) and polling descriptors.

Every wait of the package is bounded by a deadline made here, and every wait on
descriptors (a worker's pipe and process sentinel, the inference channel's wake pipe)
goes through `poll_fds`.
"""

from __future__ import annotations

import math
import select
import time
from multiprocessing.connection import wait

__all__ = ["deadline_after", "poll_fds", "remaining"]

_HAS_POLL = hasattr(select, "poll")


def poll_fds(fds: list[int], timeout: float | None) -> list[int]:
    """Return those of ``fds`` readable within ``timeout`` seconds (None: no limit).

    ``select.poll`` where the platform has it (cheaper per call than building a selector),
    else `multiprocessing.connection.wait`.
    """
    if _HAS_POLL:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        ms = None if timeout is None else math.ceil(timeout * 1000)
        return [fd for fd, _ in poller.poll(ms)]
    return list(wait(fds, timeout))  # pragma: no cover - platforms without poll()


def remaining(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (a ``time.monotonic()`` value), or None."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def deadline_after(timeout: float | None) -> float | None:
    """The ``time.monotonic()`` value ``timeout`` seconds from now, or None."""
    return None if timeout is None else time.monotonic() + timeout
