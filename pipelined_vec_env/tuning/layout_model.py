"""A model of a single-caller rollout loop: predicts env steps/s of a layout from costs.

Used by `pipelined_vec_env.tuning.tuner.tune`. The design notes' overlap bound (``../shared/design.md``)
and the overlap benchmark's closed form for one worker per stage,

    rate = N / max(N * B, k * Te + k * B, N * Te / min(cores, stages)),

hold for fixed step times and a policy whose cost is ``B`` per observation. Here step times
are random (a measured distribution per env), the policy has a fixed cost per call, each
message to a worker costs caller CPU and latency, and envs may be CPU-bound (they share the
machine's cores) or sleep (a GPU, a remote simulator). Rather than a closed form for each
case, `simulate` plays the loop forward over resampled step times, in simulated time, with
the machine's cores handed out in time slices, as Linux's scheduler does (or shared
continuously by every task that wants CPU: processor sharing, where no slice is given). The
order statistics a closed form would need (the slowest of a stage's workers, the ``b``-th of
``N`` envs to finish in decoupled mode) come out of the simulation. With constant step times
and no overheads it gives the closed form above (tested).

Two loops, as a single caller thread runs them:

- ``staged``: all stages stepped after the reset; then round robin: wait for stage ``s``,
  run the policy on its ``n_s`` observations, send stage ``s``'s actions, go to ``s + 1``.
  A worker steps its envs one after the other, or at once where they wait off the CPU
  (`worker_steps_concurrently`, the workers' own rule); a stage is done when its last
  worker is.
- ``decoupled``: one env per worker; wait until at least ``b`` envs have results, run the
  policy on all that are ready, send their actions (EnvPool's ``recv``/``send``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..workers.step_profile import steps_concurrently

__all__ = [
    "Costs",
    "Layout",
    "nice_weight",
    "overlap_bound",
    "rank",
    "simulate",
    "worker_steps_concurrently",
]


@dataclass(frozen=True)
class Layout:
    """One way of running ``N`` envs with one caller.

    Attributes:
        mode: ``"staged"`` (round robin over stages) or ``"decoupled"`` (``recv``/``send``).
        num_stages: Pipeline stages (1 in decoupled mode).
        envs_per_worker: Envs per worker process (1 in decoupled mode).
        batch_size: The ``recv`` batch of decoupled mode (least results per policy call);
            None when staged.
        worker_nice: The workers' nice value (``PipelinedVectorEnv(worker_nice=...)``),
            ``"idle"`` (``SCHED_IDLE``), or None: the caller's (equal priority).
    """

    mode: str
    num_stages: int = 1
    envs_per_worker: int = 1
    batch_size: int | None = None
    worker_nice: int | str | None = None

    @property
    def name(self) -> str:
        """``"staged 2x4"`` (stages x envs per worker) or ``"decoupled b=4"``, with
        ``" nice 10"`` appended when ``worker_nice`` is set."""
        if self.mode == "staged":
            name = f"staged {self.num_stages}x{self.envs_per_worker}"
        else:
            name = f"decoupled b={self.batch_size}"
        return name if self.worker_nice is None else f"{name} nice {self.worker_nice}"


@dataclass(frozen=True)
class Costs:
    """What the model needs, measured (see `pipelined_vec_env.tuning.tuner.tune`). Seconds.

    Attributes:
        step_cpu: Per env, samples of one step's CPU time in its worker (float64
            ``(n_i,)``).
        step_sleep: Per env, the same steps' off-CPU time (sleep, I/O, an accelerator;
            waiting for a core excluded), paired with ``step_cpu`` (float64 ``(n_i,)``).
        message_latency: Off-CPU time of one command round trip to a worker (wake-ups).
        message_cpu: Caller CPU per worker message sent and received; a policy call costs
            one more (the loop's fixed overhead).
        worker_message_cpu: A worker's CPU per command beyond its envs' steps (reading
            actions, writing results).
        policy_batch_sizes: Batch sizes the policy was timed at (int, ascending).
        policy_wall: Wall time of one policy call at each of those sizes.
        policy_cpu: Caller CPU time of one policy call at each size (<= wall).
        cores: Cores the workers and the caller share (may be fractional: a share of the
            machine).
        background_load: Other processes' demand on those cores, as this many always
            busy tasks sharing them with ours (0 on an idle machine).
        caller_nice: The caller's nice value; a layout's ``worker_nice`` counts relative
            to it.
        slice_seconds: The scheduler's time slice: CPU segments that oversubscribe the
            cores take turns in slices this long, a woken task of a higher weight (a
            caller beside niced workers) taking a lighter one's core at once; None:
            processor sharing (every runnable task progresses at once, at its weight's
            share).
    """

    step_cpu: Sequence[np.ndarray]
    step_sleep: Sequence[np.ndarray]
    message_latency: float
    message_cpu: float
    policy_batch_sizes: np.ndarray
    policy_wall: np.ndarray
    policy_cpu: np.ndarray
    cores: float
    background_load: float = 0.0
    worker_message_cpu: float = 0.0
    caller_nice: int = 0
    slice_seconds: float | None = None

    @property
    def num_envs(self) -> int:
        """``N``."""
        return len(self.step_cpu)

    def policy(self, batch: int) -> tuple[float, float]:
        """``(wall, cpu)`` seconds of one policy call on ``batch`` observations: linear
        between the timed sizes, extended linearly past the largest (at least the largest
        size's cost) and flat below the smallest."""
        sizes = np.asarray(self.policy_batch_sizes, dtype=np.float64)
        out = []
        for values in (self.policy_wall, self.policy_cpu):
            values = np.asarray(values, dtype=np.float64)
            if batch <= sizes[-1] or len(sizes) == 1:
                out.append(float(np.interp(batch, sizes, values)))
            else:
                slope = max(0.0, (values[-1] - values[-2]) / (sizes[-1] - sizes[-2]))
                out.append(float(values[-1] + slope * (batch - sizes[-1])))
        return out[0], min(out[0], out[1])


def overlap_bound(
    num_envs: int, num_stages: int, step_seconds: float, policy_per_obs: float, cores: int
) -> float:
    """The overlap bound (docs/benchmarks_rollout.md) in env steps/s: one worker per stage holding its ``k`` envs,
    fixed step time ``Te`` (CPU-bound), a policy costing ``B`` per observation, off-CPU.

    Returns:
        ``N / max(N * B, k * Te + k * B, N * Te / min(cores, stages))``, ``k = N / stages``.
    """
    k = num_envs / num_stages
    round_time = max(
        num_envs * policy_per_obs,
        k * step_seconds + k * policy_per_obs,
        num_envs * step_seconds / min(cores, num_stages),
    )
    return num_envs / round_time


def nice_weight(nice: int | str) -> float:
    """Linux CFS's share weight of a task at ``nice`` relative to nice 0 (about 1.25x per
    step: ``sched_prio_to_weight``, 1024 at 0, 110 at 10, 15 at 19); ``"idle"``
    (``SCHED_IDLE``): 3 of 1024."""
    if nice == "idle":
        return 3 / 1024
    return 1.25 ** (-int(nice))


def _shares(weights: list[float], cores: float) -> list[float]:
    """Weighted processor sharing of ``cores``: each task's rate (at most one core),
    proportional to its weight, the capacity a capped task leaves going to the others."""
    rates = [0.0] * len(weights)
    left = cores
    open_ = sorted(range(len(weights)), key=lambda i: -weights[i])
    while open_:
        total = sum(weights[i] for i in open_)
        i = open_[0]  # the heaviest reaches the cap of one core first
        if left * weights[i] / total >= 1.0:
            rates[i] = 1.0
            left -= 1.0
            open_.pop(0)
            continue
        for j in open_:
            rates[j] = left * weights[j] / total
        break
    return rates


class _Machine:
    """Tasks in simulated time: each a list of ``("cpu" | "off", seconds)`` segments and a
    CFS weight; off-CPU segments just wait. CPU segments share ``cores`` with
    ``background`` always busy tasks of other processes (weight 1), one of two ways:

    - ``slice_seconds`` None: processor sharing, in proportion to the weights (at most one
      core each). Tasks that start together finish together.
    - ``slice_seconds`` q: time slices, as Linux's EEVDF scheduler hands them out:
      ``ceil(cores)`` slots (each at ``cores / slots`` of a core) serve a run queue in
      turn, a task runs for at most ``q`` before going to the back; a task that wakes (its
      CPU segment follows an off-CPU one, or starts it) joins the front, heavier weights
      first, and takes the slot of a lighter running task at once, else waits for a slice
      to end or a slot to free. CPU-bound tasks that start together finish one after
      another, a woken caller waits for its equals' slice to end but not for niced ones.
    """

    def __init__(
        self, cores: float, background: float = 0.0, slice_seconds: float | None = None
    ) -> None:
        self.cores = cores
        self.background = background
        self.slice = slice_seconds
        self.now = 0.0
        self.tasks: dict[int, list] = {}  # id -> [segments, index, remaining, on_done, weight]
        self._next_id = 0
        # time slices: running task -> slice left; waiting tasks in order
        self.slots = max(1, math.ceil(cores - 1e-9))
        self.running: dict[int, float] = {}
        self.queue: list[int] = []
        if slice_seconds is not None:
            whole, frac = int(background), background - int(background)
            weights = [1.0] * whole + ([frac] if frac > 0 else [])
            for i, w in enumerate(weights):  # background: negative ids, never done
                self.tasks[-1 - i] = [[("cpu", math.inf)], 0, math.inf, None, w]
                self.queue.append(-1 - i)
            self._fill()

    def start(
        self, segments: list[tuple[str, float]], on_done: Callable[[], None], weight: float = 1.0
    ) -> None:
        segments = [s for s in segments if s[1] > 0.0]
        if not segments:
            on_done()
            return
        key = self._next_id
        self.tasks[key] = [segments, 0, segments[0][1], on_done, weight]
        self._next_id += 1
        if self.slice is not None and segments[0][0] == "cpu":
            self._wake(key)

    def _wake(self, key: int) -> None:
        weight = self.tasks[key][4]
        at = next((i for i, k in enumerate(self.queue) if self.tasks[k][4] <= weight), None)
        self.queue.insert(len(self.queue) if at is None else at, key)
        self._fill()
        if key in self.running or len(self.running) < self.slots:
            return
        lightest = min(self.running, key=lambda k: self.tasks[k][4])
        if self.tasks[lightest][4] < weight:  # preempted: it goes first among its equals
            del self.running[lightest]
            self.queue.remove(key)
            self.running[key] = self.slice  # type: ignore[assignment]
            self._wake(lightest)

    def _fill(self) -> None:
        while self.queue and len(self.running) < self.slots:
            self.running[self.queue.pop(0)] = self.slice  # type: ignore[assignment]

    def _rates(self) -> dict[int, float]:
        if self.slice is not None:
            return dict.fromkeys(self.running, self.cores / self.slots)
        on_cpu = [key for key, t in self.tasks.items() if t[0][t[1]][0] == "cpu"]
        if not on_cpu:  # every task waits off the CPU (a message in flight, a sleep)
            return {}
        weights = [self.tasks[key][4] for key in on_cpu]
        if len(set(weights)) <= 1 and (
            not self.background or weights[0] == 1.0
        ):  # equal sharing (the common case, in closed form)
            rate = min(1.0, self.cores / (len(on_cpu) + self.background)) if on_cpu else 1.0
            return dict.fromkeys(on_cpu, rate)
        # the background's whole tasks take part as weight-1 tasks, fractions pro rata
        whole, frac = int(self.background), self.background - int(self.background)
        extra = [1.0] * whole + ([frac] if frac > 0 else [])
        rates = _shares(weights + extra, self.cores)
        return dict(zip(on_cpu, rates[: len(on_cpu)], strict=True))

    def advance(self) -> None:
        """Run until the next segment (or time slice) ends; call the callbacks of tasks
        that finished."""
        if not any(key >= 0 for key in self.tasks):
            raise RuntimeError("simulation stalled: no task is running")
        rates = self._rates()
        sliced = self.slice is not None
        dt = math.inf
        for key, t in self.tasks.items():
            if t[0][t[1]][0] == "off":
                dt = min(dt, t[2])
            elif key in rates:
                dt = min(dt, t[2] / rates[key])
                if sliced:
                    dt = min(dt, self.running[key] / rates[key])
        self.now += dt
        done, woken, expired = [], [], []
        for key, t in list(self.tasks.items()):
            on_cpu = t[0][t[1]][0] == "cpu"
            if on_cpu and key not in rates:
                continue  # waiting for a core
            progress = dt * rates[key] if on_cpu else dt
            t[2] -= progress
            if sliced and on_cpu:
                self.running[key] -= progress
            if t[2] <= 1e-12:
                t[1] += 1
                if t[1] < len(t[0]):
                    t[2] = t[0][t[1]][1]
                    now_cpu = t[0][t[1]][0] == "cpu"
                    if sliced and on_cpu and not now_cpu:
                        del self.running[key]
                    elif sliced and not on_cpu and now_cpu:
                        woken.append(key)
                else:
                    done.append(key)
                    if sliced and on_cpu:
                        del self.running[key]
            if sliced and key in self.running and self.running[key] <= 1e-12:
                expired.append(key)
        if sliced:
            for key in expired:
                del self.running[key]
                self.queue.append(key)
            self._fill()
            for key in woken:
                self._wake(key)
        for key in done:
            self.tasks.pop(key)[3]()


def _split(layout: Layout, num_envs: int) -> list[list[list[int]]]:
    """Stages -> workers -> env ids, split like ``np.array_split`` (as the env does)."""
    stages = []
    for ids in np.array_split(np.arange(num_envs), layout.num_stages):
        workers = math.ceil(len(ids) / layout.envs_per_worker)
        stages.append([list(map(int, w)) for w in np.array_split(ids, workers)])
    return stages


class _Loop:
    """The state one `simulate` call shares between its steps: the simulated machine, the
    resampled step times, and the caller's policy calls counted so far."""

    def __init__(self, layout: Layout, costs: Costs, seed: int) -> None:
        self.costs = costs
        self.rng = np.random.default_rng(seed)
        self.machine = _Machine(costs.cores, costs.background_load, costs.slice_seconds)
        self.latency = max(0.0, costs.message_latency)
        # workers' CPU share against the caller's (weight 1): CFS weights of their nice values
        self.worker_weight = (
            1.0
            if layout.worker_nice is None
            else nice_weight(layout.worker_nice) / nice_weight(costs.caller_nice)
        )
        self.counted: list[tuple[float, int]] = []  # (time, env steps handed to the policy)
        self.busy = False  # the caller is in a policy call
        self.steps = 0  # env steps handed to the policy

    def step_segments(self, env: int) -> list[tuple[str, float]]:
        """One step of ``env``, resampled from its measured steps."""
        costs = self.costs
        j = int(self.rng.integers(len(costs.step_cpu[env])))
        return [("cpu", float(costs.step_cpu[env][j])), ("off", float(costs.step_sleep[env][j]))]

    def policy_segments(self, batch: int, messages: int) -> list[tuple[str, float]]:
        """One policy call on ``batch`` observations that came in ``messages`` messages."""
        wall, cpu = self.costs.policy(batch)
        return [("cpu", cpu + (messages + 1) * self.costs.message_cpu), ("off", wall - cpu)]

    def hand_to_policy(self, size: int) -> None:
        """The caller takes ``size`` env steps' results into a policy call."""
        self.busy = True
        self.counted.append((self.machine.now, size))
        self.steps += size

    def rate(self) -> float:
        """Env steps/s over the counted policy calls after the first quarter (warm-up)."""
        end = self.counted[-1][0]
        start = end / 4
        window = [(t, c) for t, c in self.counted if t > start]
        if len(window) < 2 or end <= start:
            return float("nan")
        first = window[0][0]
        return sum(c for _, c in window[1:]) / (end - first)


def simulate(layout: Layout, costs: Costs, *, env_steps: int | None = None, seed: int = 0) -> float:
    """Predicted env steps/s of ``layout`` under ``costs``.

    Args:
        layout: The layout.
        costs: Measured costs.
        env_steps: Env steps to simulate (default ``max(400, 60 * N)``); the first quarter
            of the simulated time is a warm-up and not counted.
        seed: Seed of the resampled step times.

    Returns:
        Env steps per second of the loop in steady state.
    """
    n = costs.num_envs
    loop = _Loop(layout, costs, seed)
    total = env_steps or max(400, 60 * n)
    if layout.mode == "staged":
        _start_staged(loop, _split(layout, n))
    elif layout.mode == "decoupled":
        _start_decoupled(loop, int(layout.batch_size or 1), n)
    else:
        raise ValueError(f"layout.mode: expected 'staged' or 'decoupled', got {layout.mode!r}")
    while loop.steps < total:
        loop.machine.advance()
    return loop.rate()


def worker_steps_concurrently(costs: Costs, worker: Sequence[int]) -> bool:
    """Whether a worker of the envs ``worker`` steps them concurrently, by the workers' own
    rule (`pipelined_vec_env.workers.step_profile.steps_concurrently`) on their measured
    mean step CPU and off-CPU times."""
    if len(worker) < 2:
        return False
    cpu = sum(float(np.mean(costs.step_cpu[e])) for e in worker)
    off = sum(float(np.mean(costs.step_sleep[e])) for e in worker)
    return steps_concurrently(cpu, cpu + off)


def start_worker(loop: _Loop, worker: Sequence[int], on_done: Callable[[], None]) -> None:
    """One command to a worker of the envs ``worker``: its message, then its envs' steps,
    one after another, or at once on its threads (`worker_steps_concurrently`);
    ``on_done`` when the last is done."""
    machine, weight = loop.machine, loop.worker_weight
    message = [("off", loop.latency), ("cpu", loop.costs.worker_message_cpu)]
    if not worker_steps_concurrently(loop.costs, worker):
        segments = message + [seg for env in worker for seg in loop.step_segments(env)]
        machine.start(segments, on_done, weight)
        return
    left = {"envs": len(worker)}

    def env_done() -> None:
        left["envs"] -= 1
        if left["envs"] == 0:
            on_done()

    def steps() -> None:
        for env in worker:
            machine.start(loop.step_segments(env), env_done, weight)

    machine.start(message, steps, weight)


def _start_staged(loop: _Loop, stages: list[list[list[int]]]) -> None:
    """Stage stepping: every stage's workers step their envs; the caller serves the
    stages in turn, each once all its workers answered, and sends it its next step."""
    machine = loop.machine
    pending = [0] * len(stages)
    done = [False] * len(stages)
    turn = {"s": 0}

    def launch(s: int) -> None:
        pending[s] = len(stages[s])
        for worker in stages[s]:
            start_worker(loop, worker, lambda s=s: worker_done(s))

    def worker_done(s: int) -> None:
        pending[s] -= 1
        if pending[s] == 0:
            done[s] = True
            serve()

    def serve() -> None:
        s = turn["s"]
        if loop.busy or not done[s]:
            return
        done[s] = False
        size = sum(len(w) for w in stages[s])
        loop.hand_to_policy(size)

        def served() -> None:
            loop.busy = False
            launch(s)
            turn["s"] = (s + 1) % len(stages)
            serve()

        machine.start(loop.policy_segments(size, len(stages[s])), served)

    for s in range(len(stages)):
        launch(s)


def _start_decoupled(loop: _Loop, batch: int, n: int) -> None:
    """Decoupled stepping: each env steps on its own; the caller takes every ready env
    once ``batch`` are ready, and sends each its next step."""
    machine = loop.machine
    ready: list[int] = []

    def launch_env(env: int) -> None:
        segments = [
            ("off", loop.latency),
            ("cpu", loop.costs.worker_message_cpu),
            *loop.step_segments(env),
        ]
        machine.start(segments, lambda: env_done(env), loop.worker_weight)

    def env_done(env: int) -> None:
        ready.append(env)
        serve_ready()

    def serve_ready() -> None:
        if loop.busy or len(ready) < batch:
            return
        taken = ready[:]
        ready.clear()
        loop.hand_to_policy(len(taken))

        def served() -> None:
            loop.busy = False
            for env in taken:
                launch_env(env)
            serve_ready()

        machine.start(loop.policy_segments(len(taken), len(taken)), served)

    for env in range(n):
        launch_env(env)


def rank(layouts: Sequence[Layout], costs: Costs, *, seed: int = 0) -> list[tuple[Layout, float]]:
    """Every layout with its predicted steps/s, best first (ties: fewer workers first)."""
    predicted = [(layout, simulate(layout, costs, seed=seed)) for layout in layouts]
    return heapq.nlargest(len(predicted), predicted, key=lambda p: (p[1], -_workers(p[0], costs)))


def _workers(layout: Layout, costs: Costs) -> int:
    return sum(len(stage) for stage in _split(layout, costs.num_envs))
