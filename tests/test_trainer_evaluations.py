"""Held-out evaluations of a trainer run: full ones before and after training, a subset of
the same episodes during it, the deadline planning that makes room for both, and the
assignment of evaluation episodes to the envs."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from pipelined_vec_env.debug_envs import ReachEnv
from reference_trainer.agent import ActorCritic
from reference_trainer.config import TrainConfig
from reference_trainer.envs import make_vector_env
from reference_trainer.rollout import RolloutCollector
from reference_trainer.scheduled_resets import PARK_KEY, SCHEDULE_KEY, ScheduledResets
from reference_trainer.train import train
from reference_trainer.vector_eval import evaluate_on_vector_env

from .conftest import ReachFactory, tiny_train_config


def _config(tmp_path: Path, **overrides) -> TrainConfig:
    config = tiny_train_config(tmp_path, eval_at_start=True, eval_episodes=4)
    return dataclasses.replace(config, **overrides)


@pytest.mark.parametrize("decoupled", [False, True])
def test_evaluations_during_training_play_the_first_episodes_and_land_in_the_summary(
    tmp_path, decoupled
):
    summary = train(
        _config(
            tmp_path,
            eval_every=1,
            eval_during_episodes=2,
            total_timesteps=96,
            decoupled=decoupled,
        )
    )
    on_disk = json.loads((Path(summary["run_dir"]) / "summary.json").read_text())
    evaluations = on_disk["evaluations"]
    # before (full), after iterations 1 and 2 (subsets; none after the last), after (full)
    assert [e["iteration"] for e in evaluations] == [0, 1, 2, 3]
    assert [int(e["episodes"]) for e in evaluations] == [4, 2, 2, 4]
    assert [e["subset"] for e in evaluations] == [False, True, True, False]
    assert on_disk["eval_episodes"] == 4 and on_disk["final_eval"]["episodes"] == 4
    assert all(e["video"] is None for e in evaluations)


def test_zero_means_every_episode_during_training_too(tmp_path):
    summary = train(_config(tmp_path, eval_every=1, total_timesteps=64))
    assert [int(e["episodes"]) for e in summary["evaluations"]] == [4, 4, 4]
    assert not any(e["subset"] for e in summary["evaluations"])


def test_a_negative_subset_is_refused(tmp_path):
    with pytest.raises(ValueError, match="eval_during_episodes"):
        train(_config(tmp_path, eval_during_episodes=-1))


def test_subset_evaluations_never_run_past_the_deadline(tmp_path, capsys):
    """Evaluations due after every iteration (``eval_every_minutes`` tiny) with a
    deadline (the trainer keeps 5 s spare): training stops in time for the last subset
    and the final evaluation, and the bar says so (not that the deadline was reached)."""
    budget_s = 12.0
    start = time.time()
    summary = train(
        _config(
            tmp_path,
            deadline=start + budget_s,
            eval_every_minutes=1e-6,
            eval_during_episodes=2,
            total_timesteps=10**7,
            eval_video_s=0.5,
            progress=True,
        )
    )
    assert time.time() <= start + budget_s
    assert summary["stopped_early"]
    err = capsys.readouterr().err
    assert "final evaluation (time kept for it)" in err and "deadline reached" not in err
    during = summary["evaluations"][1:-1]
    assert during, "no evaluation during training"
    assert all(int(e["episodes"]) == 2 and e["subset"] for e in during)
    # none right before the final evaluation: training went on after the last one
    assert during[-1]["iteration"] < summary["evaluations"][-1]["iteration"]


def test_a_deadline_before_any_iteration_keeps_the_first_evaluation_as_the_final_one(tmp_path):
    """A deadline already past after the evaluation before training: no iteration runs and
    the same episodes are not played a second time."""
    summary = train(_config(tmp_path, deadline=time.time() + 1.0, total_timesteps=10**7))
    assert summary["global_step"] == 0
    assert [e["iteration"] for e in summary["evaluations"]] == [0]
    assert summary["final_eval"]["episodes"] == summary["evaluations"][0]["episodes"] == 4


def _collector(num_envs: int, gain: float) -> tuple[Any, RolloutCollector]:
    """Envs and a collector whose policy's mean is ``gain * (goal - position)`` on the
    first action entry: episodes of a few steps, longer from init states far apart."""
    envs = make_vector_env(ReachFactory(), num_envs, num_stages=2, envs_per_worker=1)
    agent = ActorCritic(envs.single_observation_space, envs.single_action_space, ())
    with torch.no_grad():
        linear = agent.actor_mean[-1]
        linear.weight.copy_(torch.tensor([[-gain, gain], [0.0, 0.0]]))
        linear.bias.zero_()
    agent.eval()
    return envs, RolloutCollector(envs, agent, 5, torch.device("cpu"))


@pytest.mark.parametrize(("num_envs", "episodes"), [(3, 17), (4, 6), (5, 3), (2, 9)])
def test_dynamic_assignment_gives_the_static_ones_per_episode_results(num_envs, episodes):
    factory = ReachFactory()
    envs, collector = _collector(num_envs, gain=0.6)
    try:
        static, dynamic, static_after, again = (
            evaluate_on_vector_env(
                collector, factory, episodes, 100, then_reset_seed=7, assignment=how
            )
            for how in ("static", "dynamic", "static", "dynamic")
        )
    finally:
        envs.close()
    assert len(set(static.lengths)) > 1  # the envs free up at different times
    assert static.successes is not None
    assert static_after.returns == static.returns  # training resets unpark the envs
    assert dynamic.returns == static.returns
    assert dynamic.lengths == static.lengths
    assert dynamic.successes == static.successes
    assert again.returns == dynamic.returns  # dynamic is the default, the same every time
    assert len(dynamic.returns) == episodes


def test_a_parked_env_steps_nothing_until_its_schedule_is_extended():
    env = ScheduledResets(ReachEnv(num_init_states=10))
    obs, info = env.reset(options={SCHEDULE_KEY: [(None, {"init_state_id": 2})], PARK_KEY: True})
    assert info["init_state_id"] == 2
    done = False
    while not done:
        *_, terminated, truncated, _ = env.step(np.ones(2, np.float32))
        done = terminated or truncated
    parked_obs, _ = env.reset()  # the autoreset after the last scheduled episode parks
    assert np.array_equal(parked_obs, obs)
    for _ in range(3):
        step_obs, reward, terminated, truncated, _ = env.step(np.ones(2, np.float32))
        assert np.array_equal(step_obs, obs) and reward == 0.0 and not (terminated or truncated)
    env.extend_schedule([(None, {"init_state_id": 5})])
    assert env.step(np.ones(2, np.float32))[3]  # truncated: the parked stretch ends
    assert env.reset()[1]["init_state_id"] == 5
    assert env.reset(seed=4)[1]["init_state_id"] == 4  # an explicit reset ends parking
    _, info = env.reset(options={SCHEDULE_KEY: [], PARK_KEY: True})  # nothing to play
    assert env.step(np.ones(2, np.float32))[1] == 0.0
    with pytest.raises(TypeError, match="reset_schedule"):
        env.reset(options={SCHEDULE_KEY: []})  # empty without parking


def test_sampled_evaluation_repeats_per_noise_seed_and_leaves_the_training_noise_alone():
    factory = ReachFactory()
    envs, collector = _collector(3, gain=0.6)
    try:
        with torch.no_grad():
            collector.policy.actor_log_std.fill_(-0.5)
        training_noise = collector.generator_state().clone()
        mean = evaluate_on_vector_env(collector, factory, 6, 100)
        sampled = [
            evaluate_on_vector_env(collector, factory, 6, 100, noise_seed=s) for s in (1, 1, 2)
        ]
        assert torch.equal(collector.generator_state(), training_noise)
    finally:
        envs.close()
    assert sampled[0].returns == sampled[1].returns  # the same seed, the same episodes
    assert sampled[2].returns != sampled[0].returns
    assert sampled[0].returns != mean.returns  # the noise is in the actions


def test_an_unknown_assignment_is_refused():
    envs, collector = _collector(2, gain=1.0)
    try:
        with pytest.raises(ValueError, match="assignment"):
            evaluate_on_vector_env(collector, ReachFactory(), 2, 0, assignment="random")  # type: ignore[arg-type]
    finally:
        envs.close()


def test_the_learning_curve_shows_every_held_out_point_and_marks_the_subsets(tmp_path, monkeypatch):
    """learning_curve.png of the LIBERO main job: the full evaluations and the subsets
    during training all on the held-out axes, the subsets with their own marker and
    their episode count in the legend."""
    from matplotlib.axes import Axes
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from reference_trainer import job_plots as module

    drawn: list[tuple[Axes, list, dict]] = []
    plot = Axes.plot

    def spy(self, *args, **kwargs):
        drawn.append((self, list(args), kwargs))
        return plot(self, *args, **kwargs)

    monkeypatch.setattr(Axes, "plot", spy)

    def entry(step: int, rate: float, episodes: int, subset: bool) -> dict[str, Any]:
        states = [45] if subset else [45, 46]
        return {
            "global_step": step,
            "success_rate": rate,
            "episodes": float(episodes),
            "subset": subset,
            "init_states": states,
            "success_rate_per_task": [rate, rate],
        }

    summary = {
        "evaluations": [
            entry(0, 0.5, 4, False),
            entry(100, 0.5, 2, True),
            entry(200, 1.0, 2, True),
            entry(300, 0.75, 4, False),
        ],
        "eval_episodes": 4,
        "mode": "finetune",
        "run_dir": str(tmp_path),
    }
    path = module.plot_learning_curve(summary, {}, tmp_path / "learning_curve.png")
    assert Path(path).stat().st_size > 0
    held_out = drawn[0][0]
    labelled = {kw.get("label"): args for ax, args, kw in drawn if ax is held_out}
    full = next(
        v for k, v in labelled.items() if k and "before and after training: 4 held-out" in k
    )
    subset = next(v for k, v in labelled.items() if k and "during training: 2 held-out" in k)
    assert list(full[0]) == [0, 300] and list(subset[0]) == [100, 200]
    assert full[2] != subset[2]  # their own marker
    assert "(1 init state per task)" in next(k for k in labelled if k and "during" in k)
    # no line joins the points (a straight line between two measurements reads as a
    # measured curve), and no label covers a point
    assert held_out.get_lines() and all(
        line.get_linestyle() == "None" for line in held_out.get_lines()
    )
    renderer = FigureCanvasAgg(held_out.figure).get_renderer()  # the closed figure's layout
    points = held_out.transData.transform(
        [(e["global_step"], e["success_rate"]) for e in summary["evaluations"]]
    )
    texts = {text.get_text(): text.get_window_extent(renderer) for text in held_out.texts}
    assert {"before 0.50", "after 0.75", "0.50", "1.00"} <= set(texts), texts
    for text, box in texts.items():
        covered = [tuple(p) for p in points if box.padded(7).contains(*p)]
        assert not covered, (text, covered)

    # --bc-control: no env steps between its evaluations; they stand at the minutes of
    # further BC, and that BC's per-epoch errors are drawn below
    drawn.clear()
    before, after = entry(0, 0.5, 4, False), entry(0, 0.75, 4, False)
    before["bc_minutes"], after["bc_minutes"] = 0.0, 12.5
    control = {**summary, "mode": "bc_control", "evaluations": [before, after]}
    curves = {"bc_long_curve": [[1, 0.5, 0.6], [2, 0.3, 0.4], [3, 0.2, 0.35]]}
    module.plot_learning_curve(control, curves, tmp_path / "control.png")
    held_out = drawn[0][0]
    suite = next(args for ax, args, kw in drawn if ax is held_out and args[2:3] == ["o"])
    assert list(suite[0]) == [0.0, 12.5] and list(suite[1]) == [0.5, 0.75]
    errors = {kw.get("label"): args for ax, args, kw in drawn if ax is not held_out}
    assert list(errors["held-out demos"][0]) == [1, 2, 3]
    assert list(errors["held-out demos"][1]) == [0.6, 0.4, 0.35]


def test_the_deadline_plans_a_measured_evaluation_from_itself_and_its_episodes_lengths():
    """With a full evaluation measured, the next one is planned from it (times 1.2), longer
    when the latest evaluation's episodes ran longer than the same episodes did in it, and
    not from the last rollout's throughput (low after an evaluation's resets)."""
    from reference_trainer.budget import eval_estimate

    full = {"episodes": 4, "wall_s": 110.0, "video_s": 10.0, "lengths": [10, 10, 20, 20]}
    same = {"episodes": 2, "wall_s": 30.0, "video_s": 0.0, "lengths": [10, 10]}
    longer = {"episodes": 2, "wall_s": 30.0, "video_s": 0.0, "lengths": [15, 15]}
    slow_rollout = 1.0  # env steps/s: the worst case from it, 2 waves * 20 steps * 2 envs = 80 s
    assert eval_estimate([full], 4, 2, 20, slow_rollout) == pytest.approx(120.0)
    assert eval_estimate([full, same], 4, 2, 20, slow_rollout) == pytest.approx(120.0)
    assert eval_estimate([full, longer], 4, 2, 20, slow_rollout) == pytest.approx(180.0)
    # nothing of that size measured yet: the worst case at the rollout's throughput
    assert eval_estimate([same], 4, 2, 20, slow_rollout) == pytest.approx(80.0)


class _SlowFrames(gym.Wrapper):
    """ReachEnv that never ends before its horizon (the goal is out of reach) and takes
    10 ms per rendered frame."""

    def step(self, action):
        obs, reward, _, truncated, info = self.env.step(np.zeros_like(action))
        return obs, reward, False, truncated, {**info, "is_success": False}

    def render(self):
        time.sleep(0.01)
        return np.zeros((16, 16, 3), dtype=np.uint8)


class _SlowVideoFactory(ReachFactory):
    def env_fn(self, index: int, *, render: bool = False):
        return lambda: _SlowFrames(ReachEnv(horizon=2000, num_init_states=10))


def test_a_video_with_a_time_limit_ends_there_and_is_still_written(tmp_path, caplog):
    """The final evaluation's video under a deadline: the episode (2000 steps of 10 ms
    frames, 20 s) is cut once its 0.5 s have passed, what was recorded is saved, and the
    log says it was cut."""
    import imageio.v2 as imageio

    from reference_trainer.evaluation import record_video

    env = ReachEnv()
    agent = ActorCritic(env.observation_space, env.action_space, ())
    path = tmp_path / "after.mp4"
    with caplog.at_level("WARNING", logger="reference_trainer.evaluation"):
        written = record_video(agent, _SlowVideoFactory(), torch.device("cpu"), path, 0, 20, 0.5)
    assert written == str(path) and path.stat().st_size > 0
    frames = imageio.mimread(path)
    assert 2 <= len(frames) < 1000
    assert "video cut at" in caplog.text


class _FastVideoFactory(ReachFactory):
    def env_fn(self, index: int, *, render: bool = False):
        return lambda: _SlowFrames(ReachEnv(horizon=5, num_init_states=10))


def test_a_video_that_ends_within_its_limit_is_not_reported_cut(tmp_path, caplog):
    """An episode that ends by itself (5 steps, 60 ms of frames) inside its 30 s is whole:
    no cut is logged and every frame (the reset's and one per step) is written."""
    import imageio.v2 as imageio

    from reference_trainer.evaluation import record_video

    env = ReachEnv()
    agent = ActorCritic(env.observation_space, env.action_space, ())
    path = tmp_path / "after.mp4"
    with caplog.at_level("WARNING", logger="reference_trainer.evaluation"):
        written = record_video(agent, _FastVideoFactory(), torch.device("cpu"), path, 0, 20, 30.0)
    assert written == str(path)
    assert len(imageio.mimread(path)) == 6
    assert "video cut" not in caplog.text


def test_the_per_task_picture_writes_each_bar_s_value_so_a_task_at_zero_shows(
    tmp_path, monkeypatch
):
    from matplotlib.axes import Axes

    from reference_trainer import job_plots as module

    written: list[str] = []
    text = Axes.text

    def spy(self, x, y, s, *args, **kwargs):
        written.append(s)
        return text(self, x, y, s, *args, **kwargs)

    monkeypatch.setattr(Axes, "text", spy)
    summary = {
        "eval_success_rate_per_task_initial": [0.0, 0.4],
        "eval_success_rate_per_task_final": [0.0, 1.0],
        "eval_success_rate_initial": 0.2,
        "eval_success_rate_final": 0.5,
        "eval_episodes": 10,
        "tasks": [0, 1],
        "language_instructions": ["open the drawer", "close it"],
        "mode": "finetune",
    }
    path = module.plot_per_task(summary, tmp_path / "per_task.png")
    assert Path(path).stat().st_size > 0
    assert sorted(written) == ["0.0", "0.0", "0.4", "1.0"]


def test_training_success_per_task_pools_the_envs_of_each_task_and_the_report_shows_it():
    from reference_trainer.libero_tasks import per_task_training_success

    # 4 envs on 2 tasks: envs 0 and 2 train task 0, envs 1 and 3 task 1; env 3 ended nothing
    half = {"episodes": [2, 4, 2, 0], "success_rate": [0.5, 0.25, 1.0, None]}
    assert per_task_training_success(half, 2) == [0.75, 0.25]
    assert per_task_training_success({"episodes": [0, 0], "success_rate": [None, None]}, 2) == [
        None,
        None,
    ]
    from reference_trainer.job_report import report as closing_report

    summary = {
        "run_dir": "runs/x",
        "mode": "finetune",
        "eval_success_rate_initial": 0.2,
        "eval_success_rate_final": 0.5,
        "eval_episodes": 10,
        "eval_success_rate_per_task_initial": [0.0, 0.4],
        "eval_success_rate_per_task_final": [0.0, 1.0],
        "train_success_rate_per_task_first_half": [0.75, None],
        "train_success_rate_per_task_second_half": [1.0, 0.25],
        "tasks": [0, 1],
        "language_instructions": ["open the drawer", "close it"],
        "budget_minutes": 15.0,
        "total_wall_s": 850.0,
        "loadavg_end": [1.0, 1.0, 1.0],
    }
    report = closing_report(summary)
    assert "task 0: 0.00 -> 0.00 (training 0.75 -> 1.00)  open the drawer" in report
    assert "task 1: 0.40 -> 1.00 (training n/a -> 0.25)  close it" in report
    assert "per task, held-out before -> after (training episodes: first -> second half)" in report
    # a run with no training episodes (the BC control): the same header, no training part
    control = {**summary, "mode": "bc_control"}
    for half in ("first_half", "second_half"):
        control[f"train_success_rate_per_task_{half}"] = None
    lines = closing_report(control).splitlines()
    header = lines.index("  per task, held-out before -> after")
    assert lines[header + 1] == "  task 0: 0.00 -> 0.00  open the drawer"
    assert "after longer BC" in lines[2]


def test_the_final_evaluation_records_its_video_and_a_passed_deadline_skips_it(tmp_path, caplog):
    """With --eval-video the final evaluation (and no other) writes videos/after.mp4; the
    rule that plans it under a deadline records nothing once the deadline has passed."""
    from reference_trainer.budget import record_video_by_deadline

    summary = train(_config(tmp_path, eval_video=True, total_timesteps=32), _FastVideoFactory())
    *earlier, final = summary["evaluations"]
    assert final["video"] == str(Path(summary["run_dir"]) / "videos" / "after.mp4")
    assert Path(final["video"]).stat().st_size > 0 and final["video_s"] > 0
    assert earlier and all(e["video"] is None for e in earlier)
    env = ReachEnv()
    agent = ActorCritic(env.observation_space, env.action_space, ())
    late = dataclasses.replace(_config(tmp_path), deadline=time.time())
    path = tmp_path / "late.mp4"
    with caplog.at_level("WARNING", logger="reference_trainer.budget"):
        written = record_video_by_deadline(
            agent, _FastVideoFactory(), torch.device("cpu"), path, late
        )
    assert written == (None, 0.0) and not path.exists()
    assert "deadline has passed" in caplog.text
