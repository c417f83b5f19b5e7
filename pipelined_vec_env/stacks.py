"""Python stacks of a worker process, dumped on request without stopping it.

Each worker of the multiprocessing backend registers `faulthandler` on ``SIGUSR1``
with a file the caller made for it (`StackFile`). ``faulthandler`` writes from its C
signal handler, so a dump comes even while the worker's main thread is stuck in a loop,
in Python or in native code that does not block signals. The caller sends the signal,
waits (bounded) for the text and reads it; the worker goes on with what it was doing.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import tempfile
import time
from typing import IO

__all__ = ["DUMP_SIGNAL", "StackFile", "innermost_frames", "install_stack_dump"]

#: The signal that asks a worker for its stacks.
DUMP_SIGNAL = signal.SIGUSR1

_open_files: list[IO[str]] = []  # kept open for faulthandler, for the worker's life


def install_stack_dump(path: str | None) -> None:
    """In a worker: dump every thread's stack to ``path`` on `DUMP_SIGNAL` (None: no-op)."""
    if path is None or not hasattr(faulthandler, "register"):
        return
    handle = open(path, "a")  # noqa: SIM115 - faulthandler writes to it until exit
    _open_files.append(handle)
    with contextlib.suppress(OSError):
        os.unlink(path)  # the caller holds it open: nothing is left when both are gone
    faulthandler.register(DUMP_SIGNAL, file=handle, all_threads=True, chain=False)


class StackFile:
    """The caller's side: a temporary file a worker dumps its stacks into.

    The caller keeps it open and reads it through its descriptor; the worker unlinks the
    name once it has opened it, so the file goes away with the two processes, even when
    both are killed.
    """

    def __init__(self) -> None:
        self.fd, self.path = tempfile.mkstemp(prefix="pipelined-vec-env-stacks-", suffix=".txt")

    def request(self, pid: int | None, timeout: float = 1.0) -> str | None:
        """Signal process ``pid`` and return the stacks it wrote within ``timeout`` s.

        Returns:
            faulthandler's text (every thread, most recent call first), or None when the
            process is gone or wrote nothing in time.
        """
        if pid is None:
            return None
        start = self._size()
        try:
            os.kill(pid, DUMP_SIGNAL)
        except (ProcessLookupError, PermissionError):
            return None
        deadline = time.monotonic() + timeout
        size = start
        while time.monotonic() < deadline:
            time.sleep(0.01)
            now = self._size()
            if now > start and now == size:  # grew, then stopped growing: complete
                break
            size = now
        if size <= start:
            return None
        try:
            text = os.pread(self.fd, size - start, start)
        except OSError:
            return None
        return text.decode(errors="replace") or None

    def _size(self) -> int:
        try:
            return os.fstat(self.fd).st_size
        except OSError:
            return 0

    def remove(self) -> None:
        """Close the file and delete its name if the worker has not (idempotent)."""
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def innermost_frames(stacks: str, per_thread: int = 3) -> str:
    """The ``per_thread`` most recent frames of each thread in faulthandler's ``stacks``.

    Returns:
        Lines ``<thread header>`` then ``  File "...", line N in name``, one block per
        thread (the current thread first, as faulthandler writes them).
    """
    out: list[str] = []
    taken = 0
    for line in stacks.splitlines():
        if line.startswith(("Thread ", "Current thread ")):
            out.append(line.rstrip(":").replace(" (most recent call first)", ""))
            taken = 0
        elif line.strip().startswith("File ") and taken < per_thread:
            out.append("  " + line.strip())
            taken += 1
    return "\n".join(out)
