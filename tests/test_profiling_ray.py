"""The profiler with Ray actor workers: round trips on the caller's clock, no worker times."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from pipelined_vec_env import PipelinedVectorEnv
from pipelined_vec_env.debug_envs import CountingEnv

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def ray_local() -> Iterator[None]:
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()  # never leave Ray processes behind


def test_ray_workers_are_profiled_by_round_trip(ray_local):
    envs = PipelinedVectorEnv(
        [CountingEnv] * 2, num_stages=2, backend="ray", ray_options={"num_cpus": 0.25}, profile=True
    )
    try:
        envs.reset(seed=0)
        for _ in range(5):
            for s in range(2):
                envs.step_async(np.zeros(1, dtype=np.int64), stage=s)
            for s in range(2):
                envs.step_wait(stage=s)
        summary = envs.profiler.summary()
        trace = envs.profiler.chrome_trace()
    finally:
        envs.close()
    for w in ("0", "1"):
        worker = summary["workers"][w]
        assert worker["commands"] == 6  # a reset and five steps
        assert worker["step_p50_s"] > 0  # the round trip: Ray answers carry no worker times
        assert worker["transport_overhead_s"] is None
    steps = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "command"]
    assert len(steps) == 12
    assert all(e["dur"] == pytest.approx(e["args"]["round_trip_us"]) for e in steps)
    assert summary["bottleneck"] in ("env", "policy", "transport", "straggler")
