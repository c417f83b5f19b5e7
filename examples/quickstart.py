"""Quickstart: a pipelined rollout with two stages, and the profile that shows the overlap.

While stage 0's simulators step in their worker processes, the policy infers for stage 1,
and the other way round. The env's step and the policy each take about a millisecond here
(a sleep stands in for a slow simulator and for a network's forward pass), so the overlap
has something to hide. The env records a profile (``profile=True``); at the end the script
prints how much of the policy's time the other stage's envs spent stepping, the policy's
idle share (the bubble: the caller's waits for the envs and its own work), what one stage,
with no overlap, would take and the profiler's bottleneck, in short lines.
Run: ``python examples/quickstart.py``.
"""

from __future__ import annotations

import re
import textwrap
import time

import gymnasium as gym
import numpy as np

from pipelined_vec_env import PipelinedVectorEnv
from pipelined_vec_env.wrappers import RecordEpisodeStatistics

STEP_S = 0.001
"""Seconds a simulator step takes (a sleep in the worker)."""
INFER_S = 0.001
"""Seconds the policy takes per batch (a sleep in this process)."""


class SlowStep(gym.Wrapper):
    """CartPole whose step takes ``STEP_S`` longer, as a slow simulator's would."""

    def step(self, action):
        time.sleep(STEP_S)
        return self.env.step(action)


def make_env() -> gym.Env:
    return SlowStep(gym.make("CartPole-v1"))


RNG = np.random.default_rng(0)


def policy(obs: np.ndarray) -> np.ndarray:
    """A noisy hand-written controller: push the cart towards where the pole leans,
    with one action in four random; ``INFER_S`` stands in for a forward pass."""
    time.sleep(INFER_S)
    greedy = (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)
    random = RNG.integers(0, 2, size=len(obs))
    return np.where(RNG.random(len(obs)) < 0.25, random, greedy)


def overlap_fraction(envs: PipelinedVectorEnv) -> float:
    """Share of the policy's inference time during which the workers of another stage
    were stepping (from the profiler's raw records: inference spans of stage ``s`` against
    step commands of the other stages' workers, on the caller's clock)."""
    records = envs.profiler.records()
    stage_of = {w: stage for w, (stage, _) in envs.profiler.layout()[0].items()}
    steps = [
        (stage_of[w], start, end)
        for w, command, _, start, end, _, _ in records["commands"]
        if command == "step" and start is not None
    ]
    inferred = covered = 0
    for name, stage, _, t0, t1 in records["spans"]:
        if name != "inference":
            continue
        inferred += t1 - t0
        busy = sorted(
            (max(t0, a), min(t1, b)) for s, a, b in steps if s != stage and a < t1 and b > t0
        )
        end = t0
        for a, b in busy:  # the union of the other stages' steps within the span
            covered += max(0, b - max(a, end))
            end = max(end, b)
    return covered / inferred if inferred else 0.0


def main(num_envs: int = 8, num_stages: int = 2, rounds: int = 300) -> list[float]:
    """Run ``rounds`` pipelined steps per stage, print what the profile shows; return the
    finished episodes' returns."""
    envs = RecordEpisodeStatistics(
        PipelinedVectorEnv(
            [make_env for _ in range(num_envs)],
            num_stages=num_stages,
            envs_per_worker=2,
            profile=True,
        )
    )
    pipeline = envs.unwrapped
    try:
        obs, _ = envs.reset(seed=0)
        stage_obs = [obs[s] for s in pipeline.stage_slices]
        pipeline.profiler.clear()  # the rollout only, not the workers' start
        for s in range(num_stages):  # fill the pipeline: every stage gets its first actions
            with pipeline.profiler.span("inference", stage=s):
                actions = policy(stage_obs[s])
            envs.step_async(actions, stage=s)
        for _ in range(rounds):
            for s in range(num_stages):
                # stage s's results; the other stages keep stepping meanwhile
                stage_obs[s], _, _, _, _ = envs.step_wait(stage=s)
                with pipeline.profiler.span("inference", stage=s):
                    actions = policy(stage_obs[s])
                envs.step_async(actions, stage=s)
        for s in range(num_stages):  # drain the pipeline
            envs.step_wait(stage=s)
        returns = list(envs.return_queue)
        profile = pipeline.profiler.summary()
        overlap = overlap_fraction(pipeline)
    finally:
        envs.close()
    steps, wall = num_envs * (rounds + 1), profile["wall_s"]
    print(f"{num_envs} envs in {num_stages} stages, {steps:,} env steps in {wall:.2f} s")
    print(f"{len(returns)} episodes finished, mean return {np.mean(returns):.1f}")
    print(
        f"while the policy inferred for one stage, another stage's envs were stepping "
        f"{overlap:.0%} of that time"
    )
    # the bubble splits into the caller's waits for a stage (step_wait) and its own work
    idle = round(100 * profile["policy_idle_fraction"])
    waited = round(100 * (1.0 - profile["caller_busy_fraction"]))
    print(
        f"the policy sat idle {idle}% of the time (the bubble): {waited}% waiting in "
        f"step_wait for a stage's envs,\n  {idle - waited}% in the loop's own work "
        "(sending actions, bookkeeping)"
    )
    one_stage = profile["predicted_speedup"]["stages"].get("1")
    if one_stage:
        print(f"one stage, with no overlap, would run at {one_stage:.2f}x this speed (predicted)")
    kind, reason = profile["bottleneck_reason"].split(": ", 1)
    print(f"bottleneck: {kind}")
    for sentence in re.split(r"(?<=\.) ", reason):  # the profiler's sentences, wrapped
        print(textwrap.fill(sentence, width=88, initial_indent="  ", subsequent_indent="  "))
    return returns


if __name__ == "__main__":
    main()
