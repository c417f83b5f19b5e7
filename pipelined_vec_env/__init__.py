"""pipelined-vec-env: staged subprocess vector environments that overlap policy inference
with simulator stepping."""

from __future__ import annotations

import logging

from . import moved_modules
from .arguments import default_envs_per_worker
from .errors import (
    ObservationError,
    RemoteTraceback,
    StageFailedError,
    WaitTimeoutError,
    WorkerCrashedError,
    WorkerError,
)
from .libero.registration import register_libero_envs
from .registration import make_vec, register
from .shared_memory import SharedMemoryFallbackWarning, SharedMemoryFullError
from .tuning.tuner import TuneResult, tune
from .vector_env import PipelinedVectorEnv

__version__ = "0.1.0"

__all__ = [
    "ObservationError",
    "PipelinedVectorEnv",
    "RemoteTraceback",
    "SharedMemoryFallbackWarning",
    "SharedMemoryFullError",
    "StageFailedError",
    "TuneResult",
    "WaitTimeoutError",
    "WorkerCrashedError",
    "WorkerError",
    "__version__",
    "default_envs_per_worker",
    "make_vec",
    "register",
    "tune",
]

moved_modules.install(__name__)  # old module paths (before the layer folders) still import
logging.getLogger(__name__).addHandler(logging.NullHandler())
register_libero_envs()  # gymnasium ids only; imports nothing from LIBERO
