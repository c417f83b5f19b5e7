"""`tune`: choose a layout (stages, envs per worker, or decoupled mode) from measurements.

Which layout is fastest depends on the env's step-time distribution, the policy's latency
against batch size and the machine's cores. `tune` measures those through the public API
of `PipelinedVectorEnv`, predicts every candidate layout with the model of
`pipelined_vec_env.tuning.layout_model` (the overlap benchmark's bound, generalised to random step
times, per-call policy costs, message costs and shared cores), then runs the best few for a
short while, in rounds, and returns the fastest measured (`pipelined_vec_env.tuning.selection`
decides between those the rounds cannot separate). PufferLib's ``autotune`` runs a grid of full
configurations instead; predicting first keeps the measured runs to a few.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from gymnasium import Env

from ..vector_env import PipelinedVectorEnv
from .arguments import MODES, TuneArguments, check_tune_arguments, positive_seconds
from .candidates import NICED_WORKERS, candidate_layouts, policy_sizes, with_nices, worker_nices
from .layout_model import Costs, Layout, rank
from .measurement import measure_costs
from .result import TuneResult, table_rows, tune_result
from .verification import (
    PROBE_LAYOUT,
    Budget,
    VectorEnvs,
    Verification,
    measure_layout,
    verify,
)

__all__ = ["NICED_WORKERS", "TuneResult", "measure_layout", "tune"]


def tune(
    env_fns: Sequence[Callable[[], Env]],
    policy: Callable[[Any], Any],
    *,
    max_seconds: float = 60.0,
    modes: Sequence[str] = MODES,
    num_stages: Sequence[int] | None = None,
    envs_per_worker: Sequence[int] | None = None,
    batch_sizes: Sequence[int] | None = None,
    verify_top: int = 2,
    verify_close: float = 0.15,
    verify_rounds: int = 2,
    verify_max: int = 8,
    worker_nice: Sequence[int | str | None] | None = None,
    probe_steps: int = 32,
    probe_seconds: float = 1.0,
    verify_seconds: float = 0.5,
    cores: int | None = None,
    seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
) -> TuneResult:
    """Choose the fastest layout for ``env_fns`` driven by ``policy`` from one caller thread.

    1. Measure, on one vector env with one env per worker: each env's step time, timed
       inside its worker over steps of random actions (wall time, CPU time and time
       runnable but waiting for a core, per step), the round-trip latency of a no-op
       command, the caller's CPU per worker message and the workers' CPU per env step
       (from ``step()`` rounds on the policy's own actions), and the policy's wall and CPU
       time at the batch sizes the layouts need.
    2. Predict every candidate layout's env steps/s with
       `pipelined_vec_env.tuning.layout_model.simulate` (the overlap bound of the design notes,
       generalised; see ``docs/tune.md``).
    3. Verify: the ``verify_top`` best predicted, every other layout predicted within
       ``verify_close`` of the best (at most ``verify_top + 2`` in all), and the best of the
       other mode when it is within 20% of the top, each run with `measure_layout` for the
       same number of env steps (``verify_seconds`` at the first run's rate); after those
       first runs, every other layout predicted at or above the best rate measured so far
       (best predicted first; the model over-predicts some layouts), up to ``verify_max``
       layouts in all. That is round 1.
    4. Race (`pipelined_vec_env.tuning.selection`): the layouts measured within
       ``verify_close`` of the best in round 1 run in ``verify_rounds - 1`` more rounds
       (interleaved, every other one in reverse order, each layout's vector env kept
       between rounds, so a drifting load hits all of them alike); the others, measured
       further below the best than the model's own error, are not run again (nor is a
       best that is left alone: it has won). Then, if the
       best and the runner-up are not *separated* (their per-round rates overlap), both
       run one more round, if all of it fits in the time left. A layout's rate is the
       median of its rounds (one run caught by a burst of other work does not decide);
       the winner is the best rated, except that among the layouts not separated from it
       the workers at the caller's priority are preferred to niced ones (the
       measurements cannot tell them apart, and niced workers give way to any other job
       on the machine). Without any run, the best predicted.

    Worker priority is a candidate dimension where it matters: when the envs' CPU demand
    (``num_envs`` times their CPU fraction) reaches the cores, so that the caller's own
    CPU (policy, messages) waits for a core behind the simulators, every layout is also
    considered with the workers at nice `NICED_WORKERS` (``worker_nice``), modelled by
    CFS's weights (see ``docs/tune.md``); otherwise, or when ``env_kwargs`` sets
    ``worker_nice``, the workers keep the caller's priority (``worker_nice=None``).

    The whole call stays within ``max_seconds`` (plus the time to close the last vector
    env): each phase gets a share, verification runs that would not fit are skipped.

    Args:
        env_fns: One constructor per env, as for `PipelinedVectorEnv`.
        policy: ``policy(obs) -> actions``: a batch of observations in gymnasium's layout
            (numpy) to a batch of as many actions (numpy), run in the calling thread.
        max_seconds: Bound of the whole call (seconds).
        modes: Modes to consider: ``"staged"`` and/or ``"decoupled"``.
        num_stages: Stage counts to consider (default: powers of two up to ``num_envs``).
        envs_per_worker: Envs per worker to consider (default: 1 and the whole stage in
            one worker).
        batch_sizes: Decoupled ``recv`` batch sizes (default: powers of two up to
            ``num_envs``).
        verify_top: Layouts verified with a real run (0: trust the model).
        verify_close: Also verify layouts predicted within this fraction of the best
            (up to ``verify_top + 2`` in all): the model cannot rank those; and run again
            after round 1 only those measured within this fraction of the best.
        verify_rounds: Interleaved rounds of verification runs of the layouts still in the
            race (>= 1; a runoff round may follow, see 4.).
        verify_max: Most layouts verified in all (worker priorities counted apart), which
            bounds the time the rule "predicted at or above the best measured" may take.
        worker_nice: The workers' nice values to consider (None in it: the caller's;
            ``"idle"``: ``SCHED_IDLE``, opt-in, see ``docs/tune.md``); default:
            ``(None, NICED_WORKERS)`` when the envs oversubscribe the cores, else
            ``(None,)``; ignored when ``env_kwargs`` sets ``worker_nice``.
        probe_steps: Most steps per env timed for the step-time distribution.
        probe_seconds: Time for those steps (and, half of it, for timing the policy).
        verify_seconds: Length of each verification run.
        cores: Cores the workers and the policy share (default: the cores this process
            may run on).
        seed: Seed of resets, random actions and the model's resampling.
        env_kwargs: Other `PipelinedVectorEnv` arguments (``context``, ``autoreset_mode``,
            ``worker_threads`` ...), used for every vector env and returned in ``kwargs``.

    Returns:
        A [`TuneResult`][pipelined_vec_env.tuning.result.TuneResult].

    Raises:
        ValueError: A bad argument (checked before any worker starts), or a policy that
            does not return one action per observation.
        WaitTimeoutError: The envs did not start, or a step did not finish, within the
            time left.

    Examples:
        >>> import numpy as np
        >>> from pipelined_vec_env import tune
        >>> from pipelined_vec_env.debug_envs import BusyEnv
        >>> fns = [lambda: BusyEnv(step_seconds=0.001, action_dim=2)] * 4
        >>> result = tune(fns, lambda obs: np.zeros((len(obs), 2), np.float32), max_seconds=20)
        >>> result.mode in ("staged", "decoupled"), result.seconds < 30
        (True, True)
    """
    budget = Budget(positive_seconds("max_seconds", max_seconds))
    env_fns, search = check_tune_arguments(
        env_fns,
        policy,
        modes=modes,
        num_stages=num_stages,
        envs_per_worker=envs_per_worker,
        batch_sizes=batch_sizes,
        verify_top=verify_top,
        verify_close=verify_close,
        verify_rounds=verify_rounds,
        verify_max=verify_max,
        worker_nice=worker_nice,
        probe_steps=probe_steps,
        probe_seconds=probe_seconds,
        verify_seconds=verify_seconds,
        cores=cores,
        seed=seed,
        env_kwargs=env_kwargs,
    )
    n = len(env_fns)
    layouts = candidate_layouts(
        n, search.modes, search.num_stages, search.envs_per_worker, search.batch_sizes
    )
    vector_envs = VectorEnvs(env_fns, search.env_kwargs)  # each kept for every round
    try:
        probe, start_cost = _start_probe(vector_envs, budget)
        costs, summary = _measure(probe, policy, layouts, search, budget)
        ranked, nices = _predict(layouts, costs, summary, search, n)
        table = table_rows(ranked, search.env_kwargs)
        verification = Verification(vector_envs, policy, budget, search, start_cost, n)
        winner = verify(verification, ranked, nices, search, table)
    finally:
        vector_envs.close()
    return tune_result(table, winner, summary, budget.elapsed())


def _start_probe(vector_envs: VectorEnvs, budget: Budget) -> tuple[PipelinedVectorEnv, float]:
    """Start the vector env phase 1 measures on (`PROBE_LAYOUT`, one env per worker: the
    layout decoupled mode uses); returns it and the seconds its start took."""
    started = time.perf_counter()
    probe = vector_envs.build(PROBE_LAYOUT, budget.left())
    return probe, time.perf_counter() - started


def _measure(
    probe: PipelinedVectorEnv,
    policy: Callable[[Any], Any],
    layouts: list[Layout],
    search: TuneArguments,
    budget: Budget,
) -> tuple[Costs, dict[str, Any]]:
    """Phase 1: the model's costs measured on ``probe`` (`measurement.measure_costs`), the
    policy timed at the batch sizes ``layouts`` call it with, within a share of the time
    left."""
    share = min(search.probe_seconds, max(0.05, 0.2 * budget.left()))
    return measure_costs(
        probe,
        policy,
        policy_sizes(probe.num_envs, layouts),
        search.cores,
        search.probe_steps,
        share,
        search.seed,
        max(1.0, budget.left()),
    )


def _predict(
    layouts: list[Layout],
    costs: Costs,
    summary: dict[str, Any],
    search: TuneArguments,
    num_envs: int,
) -> tuple[list[tuple[Layout, float]], tuple[int | str | None, ...]]:
    """Phase 2: every layout of ``layouts``, at each worker priority considered (a
    dimension where the envs oversubscribe the cores; noted in ``summary``), ranked by the
    model's env steps/s, best first; and those priorities."""
    nices = worker_nices(search, num_envs * summary["cpu_fraction"], costs.cores)
    summary["worker_nice_considered"] = list(nices)
    ranked = rank(with_nices(layouts, nices), costs, seed=search.seed)
    return ranked, nices
