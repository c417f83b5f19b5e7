"""Phase 3 of `tune`: verify the layouts it predicts best with short real runs, in rounds.

`measure_layout` times one run of the single-caller loop the model predicts; a
`Verification` runs layouts with it, the same env steps per run, within `tune`'s time
`Budget`, keeping each layout's vector env (`VectorEnvs`) between rounds; `verify` picks
the layouts of round 1, races the close ones over more rounds and a runoff
(`pipelined_vec_env.tuning.selection`), and returns the winner.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from gymnasium import Env

from ..batching import batch_slice
from ..vector_env import PipelinedVectorEnv
from .arguments import TuneArguments
from .layout_model import Layout
from .result import record_rounds
from .selection import choose, rate, runoff, survivors

__all__ = ["PROBE_LAYOUT", "Budget", "Verification", "VectorEnvs", "measure_layout", "verify"]

logger = logging.getLogger(__name__)


class Budget:
    """A wall-clock budget (seconds), counted from its creation."""

    def __init__(self, seconds: float) -> None:
        self.start = time.perf_counter()
        self.seconds = seconds

    def elapsed(self) -> float:
        """Seconds since the start."""
        return time.perf_counter() - self.start

    def left(self) -> float:
        """Seconds left (negative once overrun)."""
        return self.seconds - self.elapsed()


def measure_layout(
    envs: PipelinedVectorEnv,
    policy: Callable[[Any], Any],
    *,
    batch_size: int | None = None,
    env_steps: int | None = None,
    seconds: float | None = None,
    timeout: float = 60.0,
    seed: int = 0,
) -> dict[str, float]:
    """Run the single-caller loop that `tune` models and time it.

    Staged (``batch_size=None``): every stage is stepped after a reset, then round robin:
    ``step_wait(stage=s)``, ``policy(obs)``, ``step_async(actions, stage=s)``. Decoupled
    (``batch_size=b``): ``async_reset``, then ``recv(b)``, ``policy(obs)``, ``send``.
    One round of ``num_envs`` env steps is a warm-up and not timed; at the end, whatever is
    in flight is collected, so ``envs`` can be reset and reused.

    Args:
        envs: The vector env (any layout).
        policy: ``policy(obs) -> actions``, numpy batches in and out, in this thread.
        batch_size: None for the staged loop, else the ``recv`` batch size.
        env_steps: Timed env steps (rounded up to whole policy calls).
        seconds: Or: time the loop for this long (one of the two is needed).
        timeout: Bound of every wait (seconds).
        seed: Reset seed.

    Returns:
        ``{"steps": env steps timed, "seconds": their wall time, "steps_per_s": ...}``.

    Raises:
        ValueError: Neither or both of ``env_steps`` and ``seconds``; a bad ``batch_size``.
        WaitTimeoutError: A wait took longer than ``timeout``.
    """
    if (env_steps is None) == (seconds is None):
        raise ValueError("measure_layout: pass exactly one of env_steps and seconds")
    n = envs.num_envs
    if batch_size is not None and not 1 <= batch_size <= n:
        raise ValueError(f"batch_size: expected None or an int in [1, {n}], got {batch_size!r}")
    warmup = n
    counted, start = 0, None
    total = -warmup

    def more() -> bool:
        if start is None:
            return True
        if env_steps is not None:
            return counted < env_steps
        return time.perf_counter() - start < seconds

    if batch_size is None:
        obs, _ = envs.reset(seed=seed)
        space = envs.single_observation_space
        for s, envs_slice in enumerate(envs.stage_slices):
            envs.step_async(policy(batch_slice(space, obs, envs_slice)), stage=s)
        s = 0
        while more():
            obs_s, *_ = envs.step_wait(stage=s, timeout=timeout)
            total += envs.stage_slices[s].stop - envs.stage_slices[s].start
            if start is None and total >= 0:
                start = time.perf_counter()
            elif start is not None:
                counted = total
            envs.step_async(policy(obs_s), stage=s)
            s = (s + 1) % envs.num_stages
        end = time.perf_counter()
        for k in range(envs.num_stages):
            envs.step_wait(stage=(s + k) % envs.num_stages, timeout=timeout)
    else:
        envs.async_reset(seed=seed)
        while more():
            obs, _, _, _, infos = envs.recv(batch_size, timeout=timeout)
            ids = infos["env_id"]
            total += len(ids)
            if start is None and total >= 0:
                start = time.perf_counter()
            elif start is not None:
                counted = total
            envs.send(policy(obs), ids)
        end = time.perf_counter()
        envs.recv(n, timeout=timeout)
    assert start is not None
    elapsed = max(end - start, 1e-9)
    return {"steps": float(counted), "seconds": elapsed, "steps_per_s": counted / elapsed}


#: The layout `tune` measures on: one env per worker, which decoupled mode uses too.
PROBE_LAYOUT = Layout("staged", 1, 1)


class VectorEnvs:
    """The vector envs `tune` built, by the layout each was built for, kept until `close`."""

    def __init__(self, env_fns: list[Callable[[], Env]], env_kwargs: dict[str, Any]) -> None:
        self.env_fns = env_fns
        self.env_kwargs = env_kwargs
        self.built: dict[Layout, PipelinedVectorEnv] = {}

    def build(self, layout: Layout, timeout: float) -> PipelinedVectorEnv:
        envs = PipelinedVectorEnv(
            self.env_fns,
            num_stages=layout.num_stages,
            envs_per_worker=layout.envs_per_worker,
            **{
                "start_timeout": max(1.0, timeout),
                "worker_nice": layout.worker_nice,
                **self.env_kwargs,
            },
        )
        self.built[layout] = envs
        return envs

    def host(self, layout: Layout) -> Layout | None:
        """The layout of a vector env built so far that runs ``layout`` as is."""
        return next((b for b in self.built if same_workers(layout, b)), None)

    def close(self) -> None:
        for envs in self.built.values():
            envs.close()


class Verification:
    """`tune`'s verification runs: each layout's runs so far, all of the same length."""

    def __init__(
        self,
        vector_envs: VectorEnvs,
        policy: Callable[[Any], Any],
        budget: Budget,
        search: TuneArguments,
        start_cost: float,
        num_envs: int,
    ) -> None:
        self.vector_envs = vector_envs
        self.policy = policy
        self.budget = budget
        self.search = search
        self.start_cost = start_cost  # seconds to start the probe's vector env
        self.num_envs = num_envs
        self.runs: dict[Layout, list[dict[str, float]]] = {}
        self.env_steps: int | None = None  # of every run after the first

    def per_round(self) -> dict[Layout, list[float]]:
        """Each layout run so far: its env steps/s in each of its runs, in order."""
        return {k: [r["steps_per_s"] for r in v] for k, v in self.runs.items()}

    def in_race(self, racing: list[Layout]) -> dict[Layout, list[float]]:
        """`per_round` of the layouts ``racing`` (of all run, if none)."""
        rates = self.per_round()
        return {k: rates[k] for k in racing} if racing else rates

    def expected_seconds(self, layout: Layout) -> float:
        """How long a run of ``layout`` should take, from the rates measured so far."""
        if self.env_steps is None:
            return self.search.verify_seconds
        rates = self.per_round()
        speed = rate(rates[layout]) if layout in rates else 0.0
        speed = speed or max((rate(v) for v in rates.values()), default=0.0)
        return self.env_steps / speed if speed > 0 else self.search.verify_seconds

    def run_once(self, layout: Layout) -> bool:
        """One verification run of ``layout`` (False: no time left for it)."""
        budget = self.budget
        host = self.vector_envs.host(layout)
        start_cost_here = 2 * self.start_cost if host is None else 0.0
        if budget.left() < self.expected_seconds(layout) + 0.5 + start_cost_here:
            logger.info("tune: no time left to verify %s", layout.name)
            return False
        if host is None:
            host = layout
            self.vector_envs.build(layout, budget.left())
        stats = measure_layout(
            self.vector_envs.built[host],
            self.policy,
            batch_size=layout.batch_size,
            **(
                {"seconds": min(self.search.verify_seconds, max(0.05, 0.5 * budget.left()))}
                if self.env_steps is None
                else {"env_steps": self.env_steps}
            ),
            timeout=max(1.0, budget.left()),
            seed=self.search.seed,
        )
        if self.env_steps is None:  # every later run: as many env steps as this one
            self.env_steps = max(self.num_envs, int(stats["steps"]))
        self.runs.setdefault(layout, []).append(stats)
        return True


def verify(
    verification: Verification,
    ranked: list[tuple[Layout, float]],
    nices: tuple[int | str | None, ...],
    search: TuneArguments,
    table: list[dict[str, Any]],
) -> Layout | None:
    """Phase 3 of `tune`: the verification rounds, their rates written into ``table``;
    returns the winner (None: no layout was run)."""
    distinct = _distinct(ranked)
    picks = _first_picks(ranked, distinct, nices, search.verify_top, search.verify_close)
    del picks[search.verify_max :]
    # layouts the probe env can run need no start-up: run them first
    picks.sort(key=lambda layout: not same_workers(layout, PROBE_LAYOUT))
    for layout in picks:  # round 1
        verification.run_once(layout)
    # the model over-predicts some layouts: every other layout predicted at or above
    # the best rate measured so far may be faster than it, so it is run too (best
    # predicted first, at most verify_max layouts in all, while time is left)
    for layout, predicted in distinct if verification.runs else ():
        if len(picks) >= search.verify_max:
            break
        if layout in picks:
            continue
        if predicted < max(rate(v) for v in verification.per_round().values()):
            break  # distinct is best predicted first: none of the rest qualifies
        if not verification.run_once(layout):
            break
        picks.append(layout)
    # the race (see tune_selection): later rounds only for the layouts measured within
    # verify_close of the best in round 1, interleaved, every other round reversed
    racing = []
    if verification.runs and search.verify_rounds > 1:
        kept = set(survivors(verification.per_round(), search.verify_close))
        racing = [layout for layout in picks if layout in kept]
    for r in range(1, search.verify_rounds if len(racing) > 1 else 1):  # a lone one has won
        for layout in racing[::-1] if r % 2 == 1 else racing:
            verification.run_once(layout)
    # a runoff round for the best and the runner-up when their rounds overlap; all of
    # it or none (a third run of only one of them would not be a fair comparison)
    close = runoff(verification.in_race(racing)) if racing else []
    left = verification.budget.left()
    if close and left >= sum(verification.expected_seconds(k) for k in close) + 0.5:
        for layout in close[::-1] if search.verify_rounds % 2 == 1 else close:
            verification.run_once(layout)
    record_rounds(table, verification.per_round())
    # among layouts the rounds cannot separate, the workers at the caller's priority
    final = verification.in_race(racing)
    return choose(final, prefer=lambda k: k.worker_nice is not None) if final else None


def _distinct(ranked: list[tuple[Layout, float]]) -> list[tuple[Layout, float]]:
    """``ranked`` with each layout at its best predicted worker priority only."""
    distinct, seen = [], set()
    for layout, predicted in ranked:
        base = dataclasses.replace(layout, worker_nice=None)
        if base not in seen:
            seen.add(base)
            distinct.append((layout, predicted))
    return distinct


def _first_picks(
    ranked: list[tuple[Layout, float]],
    distinct: list[tuple[Layout, float]],
    nices: tuple[int | str | None, ...],
    verify_top: int,
    verify_close: float,
) -> list[Layout]:
    """The layouts of round 1: the ``verify_top`` best predicted (each at its best predicted
    priority), those predicted within ``verify_close`` of the best, the other mode's best,
    then the best one's other priorities (the model does not see what nicing buys in
    wake-ups)."""
    picks = [layout for layout, _ in distinct[:verify_top]]
    if verify_top:
        top = ranked[0][1]
        for layout, predicted in distinct[verify_top:]:
            if len(picks) >= verify_top + 2 or predicted < (1 - verify_close) * top:
                break
            picks.append(layout)
        other = next((lp for lp in distinct if lp[0].mode != ranked[0][0].mode), None)
        if other is not None and other[0] not in picks and other[1] >= 0.8 * top:
            picks.append(other[0])
        picks += [
            dataclasses.replace(picks[0], worker_nice=nice)
            for nice in nices
            if nice != picks[0].worker_nice
        ]
    return picks


def same_workers(layout: Layout, built: Layout) -> bool:
    """Whether a vector env built for ``built`` runs ``layout`` as is."""
    if layout.worker_nice != built.worker_nice:
        return False
    if layout.mode == "decoupled":
        return built.envs_per_worker == 1  # stages do not matter to send/recv
    return (layout.num_stages, layout.envs_per_worker) == (built.num_stages, built.envs_per_worker)
