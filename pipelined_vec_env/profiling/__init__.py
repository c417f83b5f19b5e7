"""The profiler: per-call records in the caller and the workers, their summary, and two
pictures (a Chrome trace, a timeline PNG).

``profiler.Profiler`` is what ``PipelinedVectorEnv(profile=True)`` holds; ``records`` the
record types; ``summary`` the per-phase table and bottleneck; ``chrome_trace`` and
``timeline`` the exports.

May import: nothing else of the package (the layers above call it through record hooks).
"""

from __future__ import annotations

from .profiler import BOTTLENECKS, Profiler, ProfilingDisabledError

__all__ = ["BOTTLENECKS", "Profiler", "ProfilingDisabledError"]
