"""Serial or concurrent stepping of one worker's envs, decided from their step profile.

A worker steps its envs one after another, unless their steps spend most of their time
off the CPU (a sleep, an accelerator, a remote simulator, I/O: waits that release the
GIL): then it steps them concurrently on threads of its own, so the waits overlap as they
would across processes, and a step of ``k`` envs takes about the slowest one's time
instead of the sum.

The measurement needs no message: while serial, the worker times its steps, wall time
against the whole **process's** CPU time (``time.process_time``: an env that renders on
helper threads, such as llvmpipe's, keeps the process busy while its stepping thread
waits) and the stepping thread's time runnable but waiting for a core (Linux's
``/proc/thread-self/schedstat``: a busy host does not make CPU-bound steps look idle).
Windows stepped in the worker's first `WARM_SECONDS` are not counted, nor is the first
window of `WINDOW_STEPS` env steps after them: a fresh worker's first steps run imports and
fill caches, and a native thread pool set up at the worker's start spins on a core for a
while before it sleeps (OpenBLAS's server threads, started when the worker caps them,
spin for about 0.1 s: counted, they made envs that sleep look CPU-bound). After a second
window it decides with `steps_concurrently`, and every
`REVISIT_BATCHES` commands it measures one window serially again and decides anew (a
concurrent worker's steps cannot be told apart from waits for the GIL).

An env can say what it is instead: ``metadata["step_concurrency"]`` ``"serial"`` (never
stepped beside another of its worker's envs: one that shares a GL context, a global random
generator or other unguarded state) or ``"concurrent"`` (always, when the worker has several
envs); absent, the measurement decides. Results are assembled in env order whatever the
threads' timing, so the same seeds give the same trajectories in both modes.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Literal

__all__ = [
    "METADATA_KEY",
    "OFF_CPU_SHARE",
    "REVISIT_BATCHES",
    "Route",
    "WARM_SECONDS",
    "WINDOW_STEPS",
    "StepProfile",
    "declared_concurrency",
    "off_cpu_share",
    "step_profile_of",
    "steps_concurrently",
]

logger = logging.getLogger(__name__)

#: The env metadata key by which an env says how it may be stepped.
METADATA_KEY = "step_concurrency"
#: Steps whose off-CPU share of their wall time is above this are stepped concurrently.
OFF_CPU_SHARE = 0.5
#: Env steps measured before a decision.
WINDOW_STEPS = 16
#: Seconds from the worker's set-up during which no window counts (see the module notes).
WARM_SECONDS = 0.5
#: Steps (commands) between two serial measurement windows of a concurrent worker.
REVISIT_BATCHES = 1000

_MODES = ("serial", "concurrent")
#: How one command's envs step (`StepProfile.route`).
Route = Literal["plain", "measured", "concurrent"]
# the worker's step profiles by id of each env they step (see `step_profile_of`)
_PROFILES: dict[int, StepProfile] = {}


def off_cpu_share(cpu: float, wall: float, waited: float = 0.0) -> float:
    """The share of ``wall`` seconds spent neither on a CPU (``cpu``: the process's CPU
    seconds) nor runnable waiting for one (``waited``), in ``[0, 1]``; 0 for no wall time."""
    if wall <= 0.0:
        return 0.0
    return min(1.0, max(0.0, (wall - cpu - waited) / wall))


def steps_concurrently(cpu: float, wall: float, waited: float = 0.0) -> bool:
    """The rule: steps that took ``wall`` seconds, of which ``cpu`` CPU seconds of the
    process and ``waited`` seconds runnable waiting for a core, are stepped concurrently
    when their `off_cpu_share` is above `OFF_CPU_SHARE`."""
    return off_cpu_share(cpu, wall, waited) > OFF_CPU_SHARE


def declared_concurrency(metadata: Sequence[dict[str, Any]]) -> str | None:
    """What the envs' ``metadata["step_concurrency"]`` says: ``"serial"`` if any env says
    so, ``"concurrent"`` if every env does, else None (measure).

    Raises:
        ValueError: A value other than ``"serial"`` or ``"concurrent"``.
    """
    values = [m.get(METADATA_KEY) for m in metadata]
    for value in values:
        if value is not None and value not in _MODES:
            raise ValueError(
                f"env metadata[{METADATA_KEY!r}]: expected 'serial' or 'concurrent', got {value!r}"
            )
    if "serial" in values:
        return "serial"
    if values and all(v == "concurrent" for v in values):
        return "concurrent"
    return None


class _ThreadWaits:
    """The calling thread's time runnable but waiting for a core so far (seconds), from
    ``/proc/thread-self/schedstat``; always 0 where there is none."""

    def __init__(self) -> None:
        try:
            self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self.fd = -1

    def seconds(self) -> float:
        if self.fd < 0:
            return 0.0
        try:
            return int(os.pread(self.fd, 128, 0).split()[1]) * 1e-9
        except (OSError, ValueError, IndexError):
            return 0.0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class StepProfile:
    """One worker's stepping mode and the measurement it comes from.

    Args:
        envs: The worker's envs (registered for `step_profile_of`).
        env_indices: Their global indices (for messages).
        warm_seconds: Seconds from now during which no measurement window counts
            (`WARM_SECONDS`).

    Raises:
        ValueError: An env's ``metadata["step_concurrency"]`` is not a known value.

    Attributes:
        mode: ``"serial"`` or ``"concurrent"``.
        reason: Why, in words.
        declared: What the envs' metadata said, or None (measured).
    """

    def __init__(
        self, envs: Sequence[Any], env_indices: Sequence[int], warm_seconds: float = WARM_SECONDS
    ) -> None:
        self.env_ids = [id(env) for env in envs]
        self.env_indices = tuple(env_indices)
        self.declared = declared_concurrency([getattr(env, "metadata", {}) or {} for env in envs])
        self.mode = self.declared or "serial"
        self.reason = (
            f"metadata[{METADATA_KEY!r}] = {self.declared!r}"
            if self.declared
            else "not measured yet"
        )
        self.measure = self.declared is None and len(envs) > 1
        self.batches = 0  # commands stepped since the last decision
        self.window = [0.0, 0.0, 0.0, 0]  # wall, process CPU, waited, env steps
        self.last: dict[str, float] = {}
        self.warm = False  # whether a first window was stepped (and not counted)
        self._warm_at = time.monotonic() + warm_seconds  # no window counts before then
        self._waits = _ThreadWaits() if self.measure else None
        self._threads: ThreadPoolExecutor | None = None
        for key in self.env_ids:
            _PROFILES[key] = self

    def route(self, count: int) -> Route:
        """Count one command of ``count`` envs and say how it steps: ``"plain"`` (one
        after another on the calling thread, unmeasured: the common case, which a caller
        may run itself with no per-env callback), ``"measured"`` (serially, in a
        measurement window; none while the worker's set-up settles, `WARM_SECONDS`) or
        ``"concurrent"`` (on the worker's threads)."""
        self.batches += 1
        if (
            self.measure
            and (not self.last or self.batches > REVISIT_BATCHES)
            and (self.last or time.monotonic() >= self._warm_at)
        ):
            return "measured"
        if self.mode == "concurrent" and count > 1:
            return "concurrent"
        return "plain"

    def run(self, step: Callable[[int], None], count: int, how: Route | None = None) -> None:
        """``step(k)`` for ``k`` in ``range(count)`` (the envs of one command), as
        ``how`` says (default: `route`, which counts the command); each ``step(k)`` must
        touch only the k-th env's state and results.

        Raises:
            Exception: The first (in ``k`` order) that a step raised; concurrently, once
                every other step of the call has ended.
        """
        how = self.route(count) if how is None else how
        if how == "measured":
            self._measured(step, count)
        elif how == "concurrent":
            self._concurrently(step, count)
        else:
            for k in range(count):
                step(k)

    def count_env_step(self) -> None:
        """Count one env's own step (a decoupled `Command.STEP_ENV`) toward the next
        serial measurement window (`REVISIT_BATCHES` commands)."""
        self.batches += 1

    def concurrent_now(self) -> bool:
        """Whether commands of single envs may step now: the mode is concurrent and no
        serial measurement window is due (that one needs commands through `run`)."""
        due = self.measure and self.batches > REVISIT_BATCHES
        return self.mode == "concurrent" and not due

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run ``fn(*args)`` on the worker's threads (one per env); return its future."""
        if self._threads is None:
            self._threads = ThreadPoolExecutor(
                max_workers=len(self.env_ids), thread_name_prefix="env-step"
            )
        return self._threads.submit(fn, *args)

    def _concurrently(self, step: Callable[[int], None], count: int) -> None:
        futures = [self.submit(step, k) for k in range(count)]
        # every step ends before the answer (or the first error, in env order): a next
        # command never finds one of its envs still stepping
        wait(futures)
        for future in futures:
            future.result()

    def _measured(self, step: Callable[[int], None], count: int) -> None:
        assert self._waits is not None
        wall0, cpu0, waited0 = time.perf_counter(), time.process_time(), self._waits.seconds()
        for k in range(count):
            step(k)
        window = self.window
        window[0] += time.perf_counter() - wall0
        window[1] += time.process_time() - cpu0
        window[2] += self._waits.seconds() - waited0
        window[3] += count
        if window[3] >= WINDOW_STEPS:
            if self.warm:
                self._decide()
            else:  # the first steps of a fresh worker are no guide (imports, caches)
                self.window, self.warm = [0.0, 0.0, 0.0, 0], True

    def _decide(self) -> None:
        wall, cpu, waited, steps = self.window
        share = off_cpu_share(cpu, wall, waited)
        mode = "concurrent" if steps_concurrently(cpu, wall, waited) else "serial"
        first = not self.last
        self.last = {
            "wall_ms_per_step": wall / steps * 1e3,
            "cpu_ms_per_step": cpu / steps * 1e3,
            "waited_ms_per_step": waited / steps * 1e3,
            "off_cpu_share": share,
            "steps": steps,
        }
        comparison = ">" if mode == "concurrent" else "<="
        self.reason = (
            f"measured: {share:.0%} of the step off the CPU over {steps} serial steps "
            f"({comparison} {OFF_CPU_SHARE:.0%})"
        )
        if first or mode != self.mode:
            logger.debug("envs %s: stepping %s (%s)", self.env_indices, mode, self.reason)
        self.mode = mode
        self.window = [0.0, 0.0, 0.0, 0]
        self.batches = 0

    def describe(self) -> dict[str, Any]:
        """``{"stepping", "reason", "declared", "envs_in_worker", **last measurement}``."""
        return {
            "stepping": self.mode,
            "reason": self.reason,
            "declared": self.declared,
            "envs_in_worker": len(self.env_ids),
            **self.last,
        }

    def close(self) -> None:
        """Stop the threads and forget the envs."""
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None
        if self._waits is not None:
            self._waits.close()
        for key in self.env_ids:
            if _PROFILES.get(key) is self:
                del _PROFILES[key]


def step_profile_of(env: Any) -> dict[str, Any]:
    """Called in a worker (``envs.call_at(None, step_profile_of)``): how the worker of
    ``env`` steps it and why (`StepProfile.describe`)."""
    profile = _PROFILES.get(id(env))
    if profile is None:
        return {"stepping": "serial", "reason": "unknown env", "declared": None}
    return profile.describe()
