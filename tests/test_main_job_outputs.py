"""The main job's outputs as a user meets them: a budget too short for training says so,
the progress bar covers the job and ends full, each message is printed once, no "after
RL" for a run whose policy no update changed, the video's size."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from reference_trainer.job_report import report

from .conftest import load_script, needs_libero, tiny_libero_args

REPO = Path(__file__).resolve().parents[1]


def _run_job(args: list[str], stderr_path: Path, timeout: float) -> subprocess.CompletedProcess:
    """The real script, its stderr (log lines and the bar's every draw) into a file."""
    with stderr_path.open("w") as err:
        return subprocess.run(
            [sys.executable, *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            timeout=timeout,
        )


@needs_libero
@pytest.mark.timeout(300)
def test_a_budget_too_short_for_training_says_so_and_reports_no_rl(tmp_path):
    """--budget-minutes 0.01 (0.6 s, gone before the first iteration): the log says what one
    iteration and the final evaluation needed and what was left, once; the report says no
    RL ran and never "after RL"; the bar, open from the start, ends full and labelled once."""
    args = tiny_libero_args(tmp_path, "--from-scratch", "--run-name", "short")
    args += ["--budget-minutes", "0.01", "--progress"]
    err_path = tmp_path / "stderr.txt"
    result = _run_job(args, err_path, timeout=280)
    err = err_path.read_text(encoding="utf-8")
    assert result.returncode == 0, err[-3000:]
    summary = json.loads((tmp_path / "short" / "summary.json").read_text())
    assert summary["iterations"] == 0 and summary["global_step"] == 0
    too_short = summary["too_short_for_training"]
    assert too_short["needed_s"] > too_short["had_s"]
    out = result.stdout
    assert "after RL" not in out and "after no RL" not in out
    assert "no RL:         the budget was too short for training" in out
    assert f"needed about {too_short['needed_s']:.0f} s" in out
    assert f"{too_short['had_s']:.0f} s were left" in out
    # the warning, once; every log line once
    draws = [part for part in re.split(r"[\r\n]", err) if part.strip()]
    logged = [d for d in draws if re.match(r"\d{4}-\d\d-\d\d ", d)]
    assert sum("no training: the budget is too short" in d for d in logged) == 1, logged
    assert len(logged) == len(set(logged))
    # the bar: open before the evaluation, its last draw the closing one, full, once
    bars = [d for d in draws if d not in logged]
    assert any(d.startswith("eval before any update") for d in bars), bars[:5]
    closing = [d for d in bars if d.startswith("done")]
    assert len(closing) == 1 and bars[-1] == closing[0], bars[-3:]
    assert "100%" in closing[0]


@needs_libero
@pytest.mark.timeout(300)
def test_the_job_bar_covers_the_whole_job_and_ends_full(tmp_path):
    """A tiny job that trains to --total-timesteps under a budget: one bar from the start
    (its clock counts from the script's start, so its first draw already shows the
    imports' seconds), the training on it, the final evaluation labelled as such, the
    last draw full; the report says "after RL"."""
    args = tiny_libero_args(tmp_path, "--from-scratch", "--run-name", "bar", total_timesteps=16)
    args += ["--budget-minutes", "10", "--progress"]
    err_path = tmp_path / "stderr.txt"
    result = _run_job(args, err_path, timeout=280)
    err = err_path.read_text(encoding="utf-8")
    assert result.returncode == 0, err[-3000:]
    draws = [part for part in re.split(r"[\r\n]", err) if part.strip()]
    logged = [d for d in draws if re.match(r"\d{4}-\d\d-\d\d ", d)]
    assert len(logged) == len(set(logged))
    bars = [d for d in draws if d not in logged]
    labels = [d.split(":")[0] for d in bars]
    order = ["setting up", "eval before any update", "final evaluation", "done"]
    firsts = [labels.index(label) for label in order]
    assert firsts == sorted(firsts), labels
    assert "train" in labels[firsts[1] : firsts[2]], labels  # training between the two
    assert "/600 s" in bars[0]  # the budget's seconds from the script's start
    closing = [d for d in bars if d.startswith("done")]
    assert len(closing) == 1 and bars[-1] == closing[0] and "100%" in closing[0]
    assert "steps=16" in closing[0]
    assert "after RL" in result.stdout


def test_the_report_says_no_rl_when_the_value_warm_up_took_every_iteration():
    """Iterations that all trained the critic alone (the value warm-up) changed no policy:
    the report says so and reports "after no RL", not "after RL"."""
    summary = {
        "run_dir": "runs/x",
        "mode": "finetune",
        "eval_success_rate_initial": 0.5,
        "eval_success_rate_final": 0.5,
        "eval_episodes": 50,
        "tasks": [0],
        "language_instructions": ["open the drawer"],
        "budget_minutes": 4.0,
        "total_wall_s": 230.0,
        "loadavg_end": [1.0, 1.0, 1.0],
        "iterations": 6,
        "actor_update_iterations": 0,
    }
    text = report(summary)
    assert "0.50 before -> 0.50 after no RL" in text and "after RL" not in text
    assert "no RL:         6 iterations, all of the value warm-up" in text
    trained = report({**summary, "actor_update_iterations": 2, "iterations": 12})
    assert "after RL" in trained and "no RL:" not in trained


def test_the_report_writes_counts_with_separators_and_one_file_in_the_singular():
    summary = {
        "run_dir": "runs/x",
        "mode": "finetune",
        "eval_success_rate_initial": 0.5,
        "eval_success_rate_final": 0.75,
        "eval_episodes": 50,
        "tasks": [0],
        "language_instructions": ["open the drawer"],
        "budget_minutes": 15.0,
        "total_wall_s": 818.0,
        "loadavg_end": [1.0, 1.0, 1.0],
        "iterations": 227,
        "actor_update_iterations": 217,
        "global_step": 145280,
        "throughput": {"env_steps_per_s_rollout": 276.0},
        "evaluations": [{"video": None}, {"video": "runs/x/videos/after.mp4"}],
        "learning_curve": "runs/x/learning_curve.png",
        "per_task_plot": "runs/x/per_task.png",
    }
    lines = report(summary).splitlines()
    assert "training:      145,280 env steps, 276 env steps/s in rollouts" in "\n".join(lines)
    assert "video:         runs/x/videos/after.mp4" in lines
    assert "pictures:      runs/x/learning_curve.png, runs/x/per_task.png" in lines
    two = {**summary, "evaluations": [{"video": "a.mp4"}, {"video": "b.mp4"}]}
    assert "videos:        a.mp4, b.mp4" in report(two).splitlines()


def test_a_budget_for_few_iterations_shortens_the_value_warm_up():
    """After the first iteration, a budget that holds fewer than four times the warm-up's
    iterations gives it a quarter of them (at least one); a longer budget, none, or a
    run past its warm-up keeps it."""
    from reference_trainer.train import _fit_value_warmup

    @dataclasses.dataclass
    class Config:
        value_warmup_iterations: int

    def fit(left: int | None, warmup: int = 10, iteration: int = 1) -> int:
        run = SimpleNamespace(config=Config(warmup), iteration=iteration)
        _fit_value_warmup(run, SimpleNamespace(iterations_left=lambda: left))
        return run.config.value_warmup_iterations

    assert fit(left=15) == 4  # 16 iterations in all: a quarter
    assert fit(left=2) == 1  # at least one
    assert fit(left=39) == 10 and fit(left=100) == 10  # 40 or more: unchanged
    assert fit(left=None) == 10  # no deadline
    assert fit(left=5, warmup=0) == 0  # no warm-up to shorten
    assert fit(left=5, warmup=2, iteration=3) == 2  # past its warm-up already


@needs_libero
@pytest.mark.timeout(120)
def test_the_video_renders_at_video_size_and_the_policy_keeps_its_image_size():
    module = load_script("examples/train_libero.py", "train_libero")
    config = module.parse_args(["--task-id", "0"])
    assert config.video_size == 256
    factory = module.LiberoEnvFactory(config, (0,))
    env = factory.env_fn(0, render=True)()
    try:
        env.reset(seed=0)
        assert env.render().shape == (256, 256, 3)
    finally:
        env.close()
    cameras = module.parse_args(["--task-id", "0", "--cameras", "agentview", "--image-size", "64"])
    env = module.LiberoEnvFactory(cameras, (0,)).env_fn(0, render=True)()
    try:
        obs, _ = env.reset(seed=0)
        assert obs["agentview_image"].shape[:2] == (64, 64)  # what the policy was trained on
        assert env.render().shape == (64, 64, 3)
    finally:
        env.close()
