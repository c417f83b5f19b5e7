"""Camera frames out of shared memory: what ``copy=True`` and ``copy=False`` steps return,
the copy made worker by worker as each answers, and the one-copy row writer.

The envs are `CameraEnv` (two pre-built camera frames and a state); every batch is
compared with each env stepped alone in this process.
"""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory
from gymnasium.vector.utils import write_to_shared_memory as gymnasium_write

from pipelined_vec_env.debug_envs import CameraEnv
from pipelined_vec_env.shared_memory import RowWriter, SharedMemoryAllocator, release

from .conftest import camera_frames_alone

KEYS = ("camera0_image", "camera1_image", "state")
SIDE = 128  # 98 KB of frames an env: 3 envs' batch is over ROW_COPY_MIN_BYTES


def stepped_alone(n: int, steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    items = camera_frames_alone(n, steps, seed, side=SIDE, state_size=4)
    return {key: np.stack([item[key] for item in items]) for key in KEYS}


def assert_equal(batch: dict, expected: dict) -> None:
    for key in KEYS:
        assert batch[key].dtype == expected[key].dtype
        np.testing.assert_array_equal(batch[key], expected[key])


@pytest.mark.parametrize("copy", [True, False])
def test_steps_return_each_envs_frames_copied_or_as_views(make_pipelined, copy):
    envs = make_pipelined(
        [lambda: CameraEnv(side=SIDE, state_size=4) for _ in range(6)],
        envs_per_worker=2,
        num_stages=2,
        copy=copy,
    )
    envs.reset(seed=0)
    shared = envs.shared_observations
    kept = []
    for t in range(1, 4):
        obs = envs.step(np.zeros((6, 7), np.float32))[0]
        assert_equal(obs, stepped_alone(6, t))
        for key in KEYS:
            assert np.shares_memory(obs[key], shared[key]) is (not copy)
        kept.append(obs)
    # copies keep their step; views show the latest
    assert [o["state"][0, 0] for o in kept] == ([1.0, 2.0, 3.0] if copy else [3.0] * 3)
    envs.step_async(np.zeros((3, 7), np.float32), stage=1)
    obs = envs.step_wait(stage=1)[0]
    assert_equal(obs, {key: value[3:] for key, value in stepped_alone(6, 4).items()})


def test_a_workers_rows_are_copied_when_it_answers_not_after_the_last(make_pipelined):
    """Worker 0's envs step at once, worker 1's take 0.2 s: worker 0's rows are copied
    (an ``"observation copy"`` span of the profiler) before worker 1's answer came."""
    fns = [lambda: CameraEnv(side=SIDE, state_size=4)] * 2 + [
        lambda: CameraEnv(side=SIDE, state_size=4, step_seconds=0.2)
    ] * 2
    envs = make_pipelined(fns, envs_per_worker=2, profile=True)
    assert envs.shared_observations is not None  # read: steps copy (no ring of buffers)
    envs.reset(seed=0)
    envs.profiler.clear()

    obs = envs.step(np.zeros((4, 7), np.float32))[0]

    assert_equal(obs, stepped_alone(4, 1))
    records = envs.profiler.records()
    received = {w: t_received for w, name, _, _, _, t_received, _ in records["commands"]}
    copies = sorted(
        (t0, t1) for name, _, _, t0, t1 in records["spans"] if name == "observation copy"
    )
    assert len(copies) >= 2  # worker 0's rows as it answered, then the end's
    assert copies[0][1] < received[1] - 0.1e9  # long before the slow worker answered


@pytest.mark.parametrize(
    "space, value",
    [
        (
            spaces.Dict(
                {
                    "image": spaces.Box(0, 255, (4, 5, 3), np.uint8),
                    "pair": spaces.Tuple((spaces.Discrete(3), spaces.Box(-1, 1, (2,)))),
                }
            ),
            {"image": np.arange(60, dtype=np.uint8).reshape(4, 5, 3), "pair": (2, [0.5, -1.0])},
        ),
        (spaces.Box(-1, 1, (2, 3), np.float32), np.arange(6, dtype=np.float64).reshape(2, 3)),
        (spaces.Box(-1, 1, (6,), np.float32), np.arange(6, dtype=np.float32).reshape(2, 3)),
        (spaces.Dict({"text": spaces.Text(5), "n": spaces.Discrete(4)}), {"text": "abc", "n": 3}),
    ],
    ids=["dict-tuple", "cast", "reshape", "text-fallback"],
)
def test_row_writer_writes_what_gymnasiums_write_does(space, value):
    buffers = []
    try:
        for _ in range(2):
            allocator = SharedMemoryAllocator()
            buffers.append((create_shared_memory(space, n=3, ctx=allocator), allocator.arrays))
        (ours, _), (theirs, _) = buffers
        writer = RowWriter(space, ours, 3)
        writer.write(1, value)
        gymnasium_write(space, 1, value, theirs)
        a = repr(read_from_shared_memory(space, ours, n=3))
        b = repr(read_from_shared_memory(space, theirs, n=3))
        assert a == b
        del writer  # its views, before the segments go
    finally:
        for _, arrays in buffers:
            release(arrays)


def test_a_copy_reuses_a_batch_nothing_references_and_never_one_that_is_held(make_pipelined):
    envs = make_pipelined([lambda: CameraEnv(side=SIDE, state_size=4) for _ in range(4)])
    assert envs.shared_observations is not None  # read: steps copy (no ring of buffers)
    actions = np.zeros((4, 7), np.float32)
    envs.reset(seed=0)
    seen = []
    for _ in range(6):  # dropped at once: the store's kept batches come round again
        obs = envs.step(actions)[0]
        seen.append(id(obs["camera0_image"]))
    assert len(set(seen)) < len(seen)

    held, view, tensor_source = [], None, None
    for t in range(7, 15):
        obs = envs.step(actions)[0]
        assert_equal(obs, stepped_alone(4, t))
        assert list(obs) == list(KEYS)  # never the batch changed at t == 10
        if t == 7:
            view = obs["camera1_image"][1:3]  # a view holds its batch's array
        elif t == 8:
            held.append(obs)  # a rollout's list
        elif t == 9:
            tensor_source = np.asarray(obs["state"]).view(np.int32)  # another view
        elif t == 10:
            obs["extra"] = np.zeros(1)  # a batch the caller changed, then dropped
    np.testing.assert_array_equal(view, stepped_alone(4, 7)["camera1_image"][1:3])
    assert_equal(held[0], stepped_alone(4, 8))
    np.testing.assert_array_equal(tensor_source.view(np.float32), stepped_alone(4, 9)["state"])


def test_recv_copies_runs_of_rows_into_reused_batches_and_keeps_held_ones(make_pipelined):
    envs = make_pipelined(
        [lambda: CameraEnv(side=SIDE, state_size=4) for _ in range(6)], envs_per_worker=1
    )
    envs.async_reset(seed=0)
    steps = np.zeros(6, dtype=np.int64)  # per env, the steps its received result is at
    held, seen = [], []
    for r in range(12):
        obs, *_, infos = envs.recv(batch_size=6)
        ids = infos["env_id"]
        for k, g in enumerate(ids.tolist()):
            alone_g = {key: value[g] for key, value in stepped_alone(6, int(steps[g])).items()}
            for key in KEYS:
                np.testing.assert_array_equal(obs[key][k], alone_g[key])
        seen.append(id(obs["camera0_image"]))
        if r == 2:
            held.append((obs, ids.copy(), steps.copy()))
        order = ids[::-1].copy()  # send back in another order: the next recv's ids differ
        envs.send(np.zeros((6, 7), np.float32), order)
        steps[order] += 1
    assert len(set(seen)) < len(seen)  # dropped batches came round again
    obs, ids, at = held[0]
    for k, g in enumerate(ids.tolist()):
        np.testing.assert_array_equal(obs["state"][k], stepped_alone(6, int(at[g]))["state"][g])


def test_store_rows_follow_the_ids_runs_in_any_order():
    from pipelined_vec_env.observations import ObservationStore

    space = CameraEnv(side=SIDE, state_size=4).observation_space
    store = ObservationStore(space, 6, shared=True)
    try:
        items = []
        for g in range(6):
            env = CameraEnv(side=SIDE, state_size=4)
            item = env.reset(seed=g)[0]
            item["state"][2] = g
            store.write(g, item)
            items.append(item)
        ids = np.array([3, 4, 0, 1, 5, 2])
        batch = store.rows(ids)
        for k, g in enumerate(ids.tolist()):
            for key in KEYS:
                np.testing.assert_array_equal(batch[key][k], items[g][key])
        assert not np.shares_memory(batch["camera0_image"], store.views["camera0_image"])
        del batch
    finally:
        store.release()
