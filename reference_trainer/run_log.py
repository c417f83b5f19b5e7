"""A copy of the run's log lines in the run directory (``train.log``).

The console shows them once and they are gone with the terminal's scroll-back; the run
directory keeps the config, the curves and the videos, so it keeps the log too.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["LOG_FORMAT", "RunLog"]

#: The scripts' console format (``logging.basicConfig`` in train.py, train_libero.py).
LOG_FORMAT = "%(asctime)s %(name)s: %(message)s"


class RunLog:
    """While open, every record the root logger passes on is also appended to ``path``.

    The records are the console's: a logger's level still decides (the scripts log at
    INFO; a library caller that left logging unconfigured gets warnings only).

    A root handler that already writes to ``path`` (a `RunLog` the caller opened for its
    whole job, e.g. the LIBERO main job before it calls `train`) is left to do so: this
    one adds no second handler, so no line is written twice, and its `close` leaves that
    handler open.

    Args:
        path: The log file (created, or appended to by a resumed run).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handler: logging.Handler | None = None
        root = logging.getLogger()
        target = os.path.abspath(path)  # as `logging.FileHandler` stores its file
        if any(
            isinstance(h, logging.FileHandler) and h.baseFilename == target for h in root.handlers
        ):
            return
        self._handler = logging.FileHandler(path, encoding="utf-8")
        self._handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(self._handler)

    def close(self) -> None:
        """Stop copying and close the file (again is fine)."""
        if self._handler is not None:
            logging.getLogger().removeHandler(self._handler)
            self._handler.close()
            self._handler = None
