"""End-to-end runs of the reference trainer: tiny runs, resume, the example scripts,
and (slow) the InvertedPendulum learning check."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from reference_trainer.checkpoint import find_checkpoint
from reference_trainer.config import TrainConfig
from reference_trainer.progress_bar import TrainingBar
from reference_trainer.run_log import RunLog
from reference_trainer.train import run_directory, train

from .conftest import load_script, needs_libero, tiny_libero_args, tiny_train_config

REPO = Path(__file__).resolve().parents[1]


def _tiny(tmp_path: Path, **overrides) -> TrainConfig:
    config = tiny_train_config(
        tmp_path,
        update_epochs=2,
        checkpoint_every=1,
        tensorboard=True,
    )
    return dataclasses.replace(config, **overrides)


def test_tiny_run_writes_summary_checkpoint_and_tensorboard(tmp_path):
    summary = train(_tiny(tmp_path))
    run_dir = Path(summary["run_dir"])
    assert run_dir == tmp_path / "run"
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk["global_step"] == summary["global_step"] == 64
    assert on_disk["iterations"] == 2
    assert on_disk["final_eval"]["episodes"] == 1
    throughput = on_disk["throughput"]
    assert throughput["env_steps_per_s_rollout"] > 0
    assert 0.0 <= throughput["bubble_fraction"] <= 1.0
    assert list(run_dir.glob("events.out.tfevents.*"))
    assert find_checkpoint(run_dir).is_file()
    assert json.loads((run_dir / "config.json").read_text())["num_stages"] == 2


@pytest.mark.parametrize("decoupled", [False, True])
def test_fault_tolerance_flags_reach_the_env_workers(tmp_path, monkeypatch, decoupled):
    from reference_trainer import training_run as train_module

    built = []
    make = train_module.make_vector_env

    def spy(*args, **kwargs):
        built.append(make(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(train_module, "make_vector_env", spy)
    summary = train(
        _tiny(tmp_path, max_restarts=2, step_deadline=30.0, decoupled=decoupled, total_timesteps=32)
    )
    assert summary["global_step"] == 32
    assert built[0].max_restarts == 2 and built[0].step_deadline == 30.0


def test_time_budget_stops_training_and_still_evaluates(tmp_path, capsys):
    summary = train(_tiny(tmp_path, max_minutes=1e-6, total_timesteps=640, progress=True))
    assert summary["stopped_early"] and summary["iterations"] == 1
    assert summary["global_step"] == 32 and summary["final_eval"]["episodes"] == 1
    err = capsys.readouterr().err
    assert "final evaluation (time budget of 1e-06 min reached)" in err  # the bar says why
    # a run that ends on the clock counts seconds of its budget, with the env steps beside
    assert " s, steps=32" in err and "step/s" not in err
    # the final evaluation still shows on the bar (episodes beside the seconds, not in the
    # label), which then closes labelled, full as the run passed its budget
    assert "1/1 evaluation episodes" in err
    assert "episodes)" not in err
    assert "done: final evaluation: 100%" in err


def test_a_run_without_a_time_budget_counts_env_steps(tmp_path, capsys):
    train(_tiny(tmp_path, total_timesteps=64, progress=True, eval_at_start=True))
    err = capsys.readouterr().err
    assert "64/64" in err and "steps=" not in err
    assert "eval before any update" in err and "1/1 evaluation episodes" in err


@pytest.mark.parametrize("budget", [[], ["--max-minutes", "60"]], ids=["step_bar", "time_bar"])
def test_a_bar_written_to_a_file_ends_with_its_last_line_once(tmp_path, budget):
    """Redirected to a file every draw of the bar stays (a terminal overwrites them at the
    carriage return): the closing line, labelled, is written once."""
    err_path = tmp_path / "stderr.txt"
    with err_path.open("w") as err:
        result = subprocess.run(
            [sys.executable, "-m", "reference_trainer.train"]
            + ["--env-id", "InvertedPendulum-v5", "--num-envs", "2", "--num-steps", "16"]
            + ["--total-timesteps", "64", "--num-minibatches", "4", "--update-epochs", "1"]
            + ["--eval-episodes", "1", "--no-eval-video", "--no-tensorboard"]
            + ["--checkpoint-every", "0", "--torch-threads", "1", "--progress", *budget]
            + ["--run-dir", str(tmp_path), "--run-name", "run"],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=err,
            timeout=240,
        )
    text = err_path.read_text(encoding="utf-8")  # each carriage return reads as a new line
    assert result.returncode == 0, text[-3000:]
    draws = [part for part in re.split(r"[\r\n]", text) if part.strip()]
    closing = [part for part in draws if part.startswith("done: final evaluation")]
    assert len(closing) == 1, closing
    assert draws[-1] == closing[0]


def test_log_lines_print_on_their_own_line_while_the_bar_is_open(capsys):
    root = logging.getLogger()
    console = logging.StreamHandler(sys.stderr)  # the console handler basicConfig makes
    console.setFormatter(logging.Formatter("%(message)s"))
    root.addHandler(console)
    log = logging.getLogger("test_progress_bar")
    log.setLevel(logging.INFO)
    try:
        bar = TrainingBar(100, 0, 60.0, "train", enabled=True)
        bar.advance(32, {"ret": 1.0})
        log.info("a log line")
        bar.close("done")
    finally:
        root.removeHandler(console)
    err = capsys.readouterr().err
    lines = re.split(r"[\r\n]", err)
    assert "a log line" in lines  # alone, not run on from the bar's text
    assert any("train" in line and "steps=32" in line for line in lines)
    assert root.handlers.count(console) == 0 and console not in root.handlers
    # the closing line: the run is done, the bar full at the seconds it took (1 at least),
    # not left at 0 of the 60 the run had
    closing = [line for line in lines if line.startswith("done")]
    assert closing and "100%" in closing[-1] and "| 1/1 s" in closing[-1], lines[-3:]


def test_a_time_bar_moves_on_its_own_and_its_thread_ends_at_close(capsys):
    """While a step reports nothing (demos, BC), the bar's own thread moves a time bar to
    the seconds elapsed; closing the bar stops and joins that thread."""
    before = set(threading.enumerate())
    bar = TrainingBar(None, 0, 60.0, "demos and BC", enabled=True, tick_s=0.05)
    try:
        ticker = [t for t in set(threading.enumerate()) - before if t.name == "progress-bar"]
        assert len(ticker) == 1 and ticker[0].daemon
        time.sleep(1.3)  # no call on the bar
        err = capsys.readouterr().err
        assert re.search(r"demos and BC: .*\| [1-9]\d*/60 s", err), err[-500:]
    finally:
        bar.close("done")
    assert not ticker[0].is_alive()
    quiet = TrainingBar(None, 0, 60.0, "quiet", enabled=False)  # --no-progress: no thread
    assert not [t for t in set(threading.enumerate()) - before if t.name == "progress-bar"]
    quiet.close()


def test_the_run_directory_keeps_the_log(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    summary = train(_tiny(tmp_path, total_timesteps=32))
    text = (Path(summary["run_dir"]) / "train.log").read_text()
    assert "run directory" in text and "reference_trainer.training_run:" in text
    assert not any(
        isinstance(h, logging.FileHandler) and h.baseFilename.endswith("train.log")
        for h in logging.getLogger().handlers
    )  # closed with the run


def test_a_log_the_caller_opened_for_the_run_takes_the_trainers_lines_once(tmp_path, caplog):
    """A script that logs before `train` (the LIBERO main job) opens the run's log for its
    whole job; `train` writes into it, adds no second copy, and leaves it open."""
    caplog.set_level(logging.INFO)
    config = _tiny(tmp_path, total_timesteps=32)
    run_dir = run_directory(config)
    caller = logging.getLogger("test_caller")
    job_log = RunLog(run_dir / "train.log")
    try:
        caller.info("before the trainer")
        summary = train(config)
        caller.info("after the trainer")
    finally:
        job_log.close()
    assert Path(summary["run_dir"]) == run_dir
    lines = (run_dir / "train.log").read_text().splitlines()
    assert [line.split(": ", 1)[1] for line in lines if "test_caller:" in line] == [
        "before the trainer",
        "after the trainer",
    ]
    assert sum("reference_trainer.training_run: run directory" in line for line in lines) == 1
    assert len(lines) == len(set(lines))  # no line twice
    assert not any(
        isinstance(h, logging.FileHandler) and h.baseFilename.endswith("train.log")
        for h in logging.getLogger().handlers
    )


def test_serial_flag_runs_the_serial_loop(tmp_path):
    summary = train(_tiny(tmp_path, pipelined=False, total_timesteps=32))
    assert summary["pipelined"] is False
    assert summary["global_step"] == 32


def test_resume_restores_weights_and_continues_counting(tmp_path):
    first = train(_tiny(tmp_path))
    saved = torch.load(find_checkpoint(first["run_dir"]), weights_only=False)

    # resuming a finished run trains no further iteration: the weights must be the saved ones
    again = train(_tiny(tmp_path, resume=first["run_dir"]))
    assert again["iterations"] == 2 and again["global_step"] == 64
    reloaded = torch.load(find_checkpoint(first["run_dir"]), weights_only=False)
    for key, value in saved["agent"].items():
        torch.testing.assert_close(reloaded["agent"][key], value, rtol=0, atol=0, msg=key)
    torch.testing.assert_close(reloaded["noise_generator"], saved["noise_generator"])

    more = train(_tiny(tmp_path, resume=first["run_dir"], total_timesteps=128))
    assert more["run_dir"] == first["run_dir"]
    assert more["iterations"] == 4 and more["global_step"] == 128
    final = torch.load(find_checkpoint(first["run_dir"]), weights_only=False)
    assert [h["iteration"] for h in final["history"]] == [1, 2, 3, 4]
    changed = any(
        not torch.equal(final["agent"][key], value)
        for key, value in saved["agent"].items()
        if value.is_floating_point()
    )
    assert changed, "two more iterations should have changed the weights"


def test_resume_from_a_missing_checkpoint_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train(_tiny(tmp_path, resume=str(tmp_path / "nowhere")))


def _run_script(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def test_train_mujoco_example_tiny(tmp_path):
    result = _run_script(
        [
            "examples/train_mujoco.py",
            "--total-timesteps",
            "64",
            "--num-envs",
            "2",
            "--num-steps",
            "16",
            "--num-minibatches",
            "4",
            "--update-epochs",
            "1",
            "--eval-episodes",
            "0",
            "--no-eval-video",
            "--no-progress",
            "--run-dir",
            str(tmp_path),
            "--run-name",
            "hc",
        ],
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "hc" / "summary.json").read_text())
    assert summary["env_id"] == "HalfCheetah-v5"
    assert summary["global_step"] == 64


def _help_entries(text: str) -> tuple[list[str], dict[str, str]]:
    """Box titles in order, and each flag's help (its lines joined, box borders off)."""
    titles = re.findall(r"╭─ (\S+) options", text)
    entries: dict[str, str] = {}
    flag = None
    for line in text.splitlines():
        body = line.strip("│╭╰─ ")
        start = re.match(r"│ (--[a-z0-9-]+)", line)
        if start:
            flag = start.group(1)
            entries[flag] = body
        elif flag and line.startswith("│ ") and not line.startswith("│ ─"):
            entries[flag] += " " + body.strip()
        elif not line.startswith("│"):
            flag = None
    return titles, {k: " ".join(v.split()) for k, v in entries.items()}


def test_train_libero_help_leads_with_the_jobs_flags_and_states_true_defaults():
    """--help: the job's own flags first, then one box per group; every default shown is
    what this script does; no reStructuredText markup; no flag the script overrides."""
    result = _run_script(["examples/train_libero.py", "--help"], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout
    assert "demos -> BC -> evaluate -> PPO fine-tuning -> evaluate" in " ".join(text.split())
    titles, entries = _help_entries(text)
    assert titles == [
        "init-states",
        "demos-and-bc",
        "fine-tuning",
        "evaluation",
        "libero-env",
        "ppo",
        "pipeline",
        "run",
    ]
    flags = list(entries)
    job = ["--suite", "--task-id", "--budget-minutes", "--from-scratch", "--bc-control", "--seed"]
    assert [f for f in flags if f in job] == job
    assert flags.index("--seed") < flags.index("--demo-init-states") < flags.index("--kl-coef")
    assert text.index("--seed INT") < text.index("╭─ init-states options")
    for flag in ("--eval-episodes", "--deadline", "--init-checkpoint"):
        assert flag not in entries, flag  # the script sets them itself
    assert "``" not in text
    for flag, help_text in entries.items():
        assert help_text.count("(default:") == 1, (flag, help_text)
        assert "(default: )" not in help_text, flag
    assert "(default: 45:50 with several tasks" in entries["--eval-init-states"]
    assert "--budget-minutes" in entries["--total-timesteps"]
    assert "process id" in entries["--run-name"] and "timestamp" not in entries["--run-name"]
    assert "(default: no camera)" in entries["--cameras"]
    assert "--num-stages INT|auto" in text


def test_train_libero_flags_parse_to_the_flat_config_with_unchanged_defaults():
    module = load_script("examples/train_libero.py", "train_libero")
    assert module.parse_args([]) == module.LiberoTrainConfig()
    config = module.parse_args(["--seed", "3", "--kl-coef", "0.5", "--num-envs", "4"])
    assert (config.seed, config.kl_coef, config.num_envs) == (3, 0.5, 4)
    with pytest.raises(SystemExit):
        module.parse_args(["--eval-episodes", "7"])  # set from --eval-init-states


def test_grouped_cli_refuses_a_field_in_no_group():
    from reference_trainer.cli import Group, grouped_class

    @dataclasses.dataclass
    class Flat:
        a: int = 1
        """A."""
        b: int = 2

    with pytest.raises(ValueError, match=r"fields in no group \['b'\]"):
        grouped_class(Flat, ("a",), ())
    cli = grouped_class(Flat, ("a",), (Group("more", "More.", ("b",)),))
    from reference_trainer.cli import parse_grouped

    assert parse_grouped(cli, ["--b", "5"]) == Flat(a=1, b=5)


def test_train_libero_takes_num_stages_auto():
    """The main job's --num-stages takes "auto" (tune picks the training layout); the
    demos and a checkpoint's evaluation then use 2 stages."""

    from reference_trainer.layout import fixed_num_stages

    module = load_script("examples/train_libero.py", "train_libero")
    config = module.parse_args(["--num-stages", "auto"])
    assert config.num_stages == "auto" and fixed_num_stages(config) == 2
    assert fixed_num_stages(module.parse_args(["--num-stages", "3"])) == 3


# demos from init states 0-1, training on them, BC of 3 epochs: the tiny jobs' warm start
_TINY_WARM_START = (
    "--demo-init-states",
    "0:2",
    "--train-init-states",
    "0:2",
    "--bc-max-epochs",
    "3",
)


@needs_libero
@pytest.mark.timeout(600)
def test_train_libero_main_job_tiny(tmp_path):
    """The default recipe, shrunk: demos -> BC -> evaluate -> PPO -> evaluate, summary keys."""
    result = _run_script(
        tiny_libero_args(
            tmp_path,
            "--value-warmup-iterations",
            "1",
            *_TINY_WARM_START,
            "--run-name",
            "job",
            total_timesteps=16,
            eval_init_states="30:32",
        ),
        timeout=580,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "job"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert list(summary)[:3] == [
        "eval_success_rate_initial",
        "eval_success_rate_final",
        "eval_episodes",
    ]
    assert summary["mode"] == "finetune" and summary["eval_episodes"] == 2
    assert summary["tasks"] == [0] and len(summary["eval_success_rate_per_task_final"]) == 1
    for key in ("eval_success_rate_initial", "eval_success_rate_final"):
        assert 0.0 <= summary[key] <= 1.0
    assert [e["iteration"] for e in summary["evaluations"]] == [0, summary["iterations"]]
    assert summary["global_step"] == 16 and summary["demos"]["kept"] == 2
    assert (run_dir / "learning_curve.png").stat().st_size > 0
    assert (run_dir / "bc.pt").is_file() and (run_dir / "demos.hdf5").is_file()
    assert "before ->" in result.stdout and str(run_dir) in result.stdout
    # train.log holds the whole job, each line once: the main job's steps before train()
    # (demos, BC), then the trainer's
    log = (run_dir / "train.log").read_text().splitlines()
    assert len(log) == len(set(log))
    assert "train_libero: demos -> BC -> evaluate -> PPO fine-tuning" in log[0]
    assert "success rate:" in "\n".join(log)  # the closing report, as printed
    steps = (
        "reference_trainer.warm_start: collecting",
        "reference_trainer.bc:",
        "reference_trainer.training_run: run directory",
    )
    first = [next(i for i, line in enumerate(log) if step in line) for step in steps]
    assert first == sorted(first), log
    assert any("reference_trainer.train: evaluation at iteration" in line for line in log)


@needs_libero
@pytest.mark.timeout(600)
def test_train_libero_bc_control_tiny_keeps_its_budget(tmp_path):
    """--bc-control, shrunk: demos -> BC -> evaluate -> longer BC for what the budget leaves
    after an evaluation planned as the trainer plans its final one -> evaluate, the whole
    command within its 1.5 minutes (the imports included)."""
    launched = time.time()
    budget_minutes = 1.5
    result = _run_script(
        tiny_libero_args(
            tmp_path,
            "--bc-control",
            "--budget-minutes",
            str(budget_minutes),
            *_TINY_WARM_START,
            "--run-name",
            "control",
            eval_init_states="30:32",
        ),
        timeout=580,
    )
    ended = time.time()
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "control" / "summary.json").read_text())
    assert summary["mode"] == "bc_control" and summary["eval_episodes"] == 2
    before, after = summary["evaluations"]
    assert after["label"] == "after longer BC" and before["episodes"] == after["episodes"] == 2
    assert summary["bc_long"]["minutes"] > 0 and summary["global_step"] == 0
    assert [before["bc_minutes"], after["bc_minutes"]] == [0.0, summary["bc_long"]["minutes"]]
    curves = json.loads((tmp_path / "control" / "curves.json").read_text())
    assert len(curves["bc_curve"]) == summary["bc"]["epochs"]  # the warm start's BC
    assert len(curves["bc_long_curve"]) == summary["bc_long"]["epochs"] >= 1
    assert "curve" not in summary["bc"] and "bc_long_curve" not in summary
    assert ended - launched <= 60 * budget_minutes + 5  # the interpreter's exit after it


@needs_libero
@pytest.mark.timeout(600)
def test_train_libero_two_tasks_one_policy_tiny(tmp_path):
    """Two tasks under one policy, end to end: per-task rates and instructions in the
    summary (its pinned keys first, the curves in curves.json), per_task.png, an
    evaluation during training on the first held-out init state of each task (the full
    ones before and after), no evaluation init state among the training ones, and the
    budget counted from the process's start (imports included)."""
    launched = time.time()
    result = _run_script(
        tiny_libero_args(
            tmp_path,
            "--task-ids",
            "0",
            "1",
            "--demo-init-states",
            "0:2",
            "--train-init-states",
            "0:3",
            "--bc-max-epochs",
            "3",
            "--value-warmup-iterations",
            "1",
            "--eval-every",
            "2",
            "--run-name",
            "two",
            total_timesteps=32,
            eval_init_states="45:47",
            task_id=None,
        ),
        timeout=580,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "two"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert list(summary)[:10] == [  # the order the README gives
        "eval_success_rate_initial",
        "eval_success_rate_final",
        "eval_episodes",
        "eval_success_rate_per_task_initial",
        "eval_success_rate_per_task_final",
        "train_success_rate_per_task_first_half",
        "train_success_rate_per_task_second_half",
        "suite",
        "tasks",
        "language_instructions",
    ]
    assert summary["tasks"] == [0, 1] and summary["eval_episodes"] == 4
    assert launched - 1.0 <= summary["started_at"] <= launched + 1.0  # not after the imports
    assert [len(summary[f"eval_success_rate_per_task_{w}"]) for w in ("initial", "final")] == [2, 2]
    assert (
        np.mean(summary["eval_success_rate_per_task_final"]) == summary["eval_success_rate_final"]
    )
    assert (
        summary["language_instructions"][1] == "pick up the cream cheese and place it in the basket"
    )
    assert "success_curve" not in summary and "success_curve" in json.loads(
        (run_dir / "curves.json").read_text()
    )
    evaluations = summary["evaluations"]
    assert len(evaluations) >= 3  # before, during, after
    assert [int(e["episodes"]) for e in evaluations] == [4] + [2] * (len(evaluations) - 2) + [4]
    assert [e["init_states"] for e in evaluations[1:-1]] == [[45]] * (len(evaluations) - 2)
    assert evaluations[0]["init_states"] == evaluations[-1]["init_states"] == [45, 46]
    assert all(len(e["success_rate_per_task"]) == 2 for e in evaluations)
    for half in ("first_half", "second_half"):  # None when no training episode ended
        rates = summary[f"train_success_rate_per_task_{half}"]
        assert rates is None or len(rates) == 2
    assert (run_dir / "per_task.png").stat().st_size > 0
    assert (run_dir / "learning_curve.png").stat().st_size > 0
    init = summary["init_states"]
    assert init["eval"] == [45, 46] and not set(init["eval"]) & set(init["train"] + init["demo"])
    assert "task 1: " in result.stdout
    # the run's BC start and final policy again, with the mean and with sampled actions
    bench = load_script("benchmarks/libero_checkpoints.py", "libero_checkpoints")
    args = bench.Args(runs=[str(run_dir)], checkpoints=("final",), policies=("mean", "sampled"))
    first = bench.evaluate_run(bench.load_job(), run_dir, args)
    assert first["tasks"] == [0, 1] and first["init_states"] == [45, 46]
    mean, sampled = first["results"]["final/mean"], first["results"]["final/sampled"]
    assert len(mean["successes"]) == len(sampled["successes"]) == 4
    assert len(sampled["per_task"]) == 2
    assert sampled["return_mean"] != mean["return_mean"]  # the noise reaches the actions
    args.policies = ("sampled",)
    again = bench.evaluate_run(bench.load_job(), run_dir, args)["results"]["final/sampled"]
    assert again["return_mean"] == sampled["return_mean"]  # seeded: the same episodes
    with pytest.raises(FileNotFoundError, match="no checkpoint"):  # before any env is built
        bench.evaluate_run(bench.load_job(), tmp_path, args)
    renamed = shutil.copytree(run_dir, tmp_path / "renamed")  # a field renamed since the run
    saved = json.loads((renamed / "config.json").read_text())
    (renamed / "config.json").write_text(json.dumps({**saved, "old_name": 1}))
    with pytest.raises(ValueError, match=r"fields \['old_name'\] are not in this version"):
        bench.evaluate_run(bench.load_job(), renamed, args)


@needs_libero
def test_train_libero_refuses_more_init_states_during_training_than_held_out(tmp_path):
    module = load_script("examples/train_libero.py", "train_libero")
    config = module.parse_args(
        [
            "--eval-init-states",
            "45:47",
            "--eval-during-init-states",
            "3",
            "--run-dir",
            str(tmp_path),
        ]
    )
    with pytest.raises(ValueError, match="--eval-during-init-states"):
        module.run(config)


@needs_libero
def test_train_libero_refuses_a_suite_without_an_expert_before_any_worker(tmp_path, monkeypatch):
    from pipelined_vec_env import PipelinedVectorEnv
    from reference_trainer.libero_tasks import EXPERT_SUITES, expert_for

    module = load_script("examples/train_libero.py", "train_libero")

    def no_worker(*args, **kwargs):
        raise AssertionError("a vector env was built")

    monkeypatch.setattr(PipelinedVectorEnv, "__init__", no_worker)
    config = module.parse_args(["--suite", "libero_goal", "--run-dir", str(tmp_path)])
    with pytest.raises(
        ValueError,
        match=r"--suite libero_goal: .*libero_goal task 0 .*every task: libero_object, libero_spatial",
    ):
        module.run(config)
    assert not any(tmp_path.iterdir())
    assert {"libero_object", "libero_spatial"} <= set(EXPERT_SUITES)
    assert type(expert_for("libero_object", 3)).__name__ == "PickPlaceExpert"
    assert expert_for("libero_spatial", 0).rim_offset > 0  # a bowl by its rim
    with pytest.raises(ValueError, match="no scripted expert for libero_10 task 0"):
        expert_for("libero_10", 0)


def test_libero_training_resets_never_draw_an_evaluation_init_state():
    """Training resets of a task-pinned env draw only its training init states and go
    back to its task after an evaluation episode on another; evaluation episode j plays
    task j % T from the j // T-th evaluation init state."""

    from reference_trainer.init_states import check_init_states
    from reference_trainer.libero_tasks import TaskInitStates

    class Recorder(gym.Env):
        observation_space = gym.spaces.Box(0, 1, (1,))
        action_space = gym.spaces.Box(0, 1, (1,))

        def __init__(self) -> None:
            self.resets: list[dict] = []

        def reset(self, *, seed=None, options=None):
            self.resets.append(dict(options))
            return np.zeros(1, np.float32), {}

    env = TaskInitStates(Recorder(), 3, range(0, 45))
    env.reset(seed=1)
    env.reset(options={"task_id": 5, "init_state_id": 47})
    for _ in range(200):
        env.reset()
    drawn = env.unwrapped.resets
    assert drawn[1] == {"task_id": 5, "init_state_id": 47}
    training = drawn[:1] + drawn[2:]
    assert {o["task_id"] for o in training} == {3}
    assert {o["init_state_id"] for o in training} <= set(range(45))

    module = load_script("examples/train_libero.py", "train_libero")
    config = module.parse_args(["--task-ids", "0", "1", "2"])
    factory = module.LiberoEnvFactory(config, (0, 1, 2))
    options = [factory.eval_reset_options(j) for j in range(15)]
    assert [o["task_id"] for o in options[:4]] == [0, 1, 2, 0]
    assert [o["init_state_id"] for o in options[::3]] == [45, 46, 47, 48, 49]
    assert not {o["init_state_id"] for o in options} & set(config.init_states("train"))
    with pytest.raises(ValueError, match="--train-init-states and --eval-init-states share"):
        check_init_states(module.parse_args(["--train-init-states", "0:46"]))


def test_libero_train_horizon_cuts_training_episodes_only():
    """With a training horizon, training resets set the env's horizon to it and an
    evaluation reset (explicit init state) puts the env's own horizon back."""

    from reference_trainer.libero_tasks import TaskInitStates

    class Recorder(gym.Env):
        observation_space = gym.spaces.Box(0, 1, (1,))
        action_space = gym.spaces.Box(0, 1, (1,))
        horizon = 280  # as LiberoEnv: read at every step

        def __init__(self) -> None:
            self.horizons: list[int] = []

        def reset(self, *, seed=None, options=None):
            self.horizons.append(self.horizon)
            return np.zeros(1, np.float32), {}

    env = TaskInitStates(Recorder(), 3, range(0, 45), train_horizon=200)
    env.reset(seed=1)
    env.reset(options={"task_id": 5, "init_state_id": 47})
    env.reset()
    assert env.unwrapped.horizons == [200, 280, 200]
    plain = TaskInitStates(Recorder(), 3, range(0, 45))
    plain.reset(seed=1)
    assert plain.unwrapped.horizons == [280]
    with pytest.raises(ValueError, match="train_horizon"):
        TaskInitStates(Recorder(), 3, range(0, 45), train_horizon=0)
    with pytest.raises(ValueError, match="no `horizon`"):  # CartPole has none to set
        TaskInitStates(gym.make("CartPole-v1"), 3, range(0, 45), train_horizon=200)
    short = Recorder()
    short.horizon = 150  # a training horizon never outlasts the env's own
    clamped = TaskInitStates(short, 3, range(0, 45), train_horizon=200)
    clamped.reset(seed=1)
    clamped.reset(options={"init_state_id": 47})
    assert short.horizons == [150, 150]
    module = load_script("examples/train_libero.py", "train_libero")
    assert module.parse_args([]).train_horizon == 200  # the main job's default
    config = module.parse_args(["--train-horizon", "None"])
    assert config.train_horizon is None and config.horizon is None


@needs_libero
def test_train_libero_from_scratch_tiny(tmp_path):
    """A tiny --from-scratch run; then --resume of it (no --run-name) writes into the same
    run directory: summary.json there, train.log appended."""
    args = tiny_libero_args(tmp_path, "--from-scratch", "--chunk-size", "4")
    result = _run_script([*args, "--run-name", "libero"], timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "libero"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["mode"] == "scratch" and "demos" not in summary
    assert summary["num_stages"] == 2
    assert summary["global_step"] == 64
    assert "success_rate" in summary["final_eval"]
    assert str(run_dir) in result.stdout

    result = _run_script([*args, "--resume", str(run_dir)], timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [p.name for p in tmp_path.iterdir()] == ["libero"]  # no second run directory
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["run_dir"] == str(run_dir) and resumed["total_wall_s"] != summary["total_wall_s"]
    log = (run_dir / "train.log").read_text()
    assert log.count("train_libero: PPO from scratch") == 2  # the resumed run appended
    assert log.count("reference_trainer.training_run: run directory") == 2
    assert "reference_trainer.training_run: resumed from" in log


def test_train_libero_resume_needs_from_scratch(tmp_path):
    """--resume of a fine-tuning run would collect demos and clone them into the resumed
    run's directory, then stop (--init-checkpoint and --resume are exclusive): it stops
    before, with a clear error."""

    module = load_script("examples/train_libero.py", "train_libero")
    (tmp_path / "old").mkdir()
    config = module.parse_args(["--resume", str(tmp_path / "old"), "--run-dir", str(tmp_path)])
    with pytest.raises(ValueError, match="--resume continues a --from-scratch run only"):
        module.run(config)
    assert [p.name for p in tmp_path.iterdir()] == ["old"] and not any((tmp_path / "old").iterdir())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_inverted_pendulum_reaches_900(tmp_path):
    """The learning check: the pipelined trainer solves InvertedPendulum-v5 (max return 1000)."""
    config = TrainConfig(
        env_id="InvertedPendulum-v5",
        num_envs=8,
        num_stages=2,
        num_steps=128,
        total_timesteps=150_000,
        stop_return=950.0,
        eval_episodes=5,
        eval_video=False,
        checkpoint_every=0,
        run_dir=str(tmp_path),
        run_name="pendulum",
        progress=False,
        seed=1,
    )
    summary = train(config)
    assert summary["final_eval"]["return_mean"] >= 900, summary["final_eval"]


def test_return_curve_ends_average_a_few_iterations():
    from reference_trainer.run_summary import _curve_ends

    history = [{"r": float(v)} for v in range(1, 11)] + [{"other": 0.0}]
    assert _curve_ends(history, "r") == (1.5, 9.5)
    assert _curve_ends([{"r": 1.0}, {"r": 2.0}, {"r": 3.0}], "r") == (1.0, 3.0)
    assert _curve_ends([{"other": 1.0}], "r") == (None, None)


def test_train_libero_budget_counts_from_the_script_start(monkeypatch):
    """`main` hands `run` the time the script began (before its imports), not the
    process's start: under ``bash -c '... && python ...'`` the process is the shell's,
    and its start would put the install inside the budget."""
    monkeypatch.setenv("MUJOCO_GL", "egl")  # main sets a default; restored after
    module = load_script("examples/train_libero.py", "train_libero")
    seen: dict[str, float] = {}

    def fake_run(config, started=None):
        seen["started"] = started
        return {"report": "ok"}

    monkeypatch.setattr(module, "run", fake_run)
    monkeypatch.setattr(module, "parse_args", lambda: module.LiberoTrainConfig())
    module.main()
    assert seen["started"] == module.STARTED_AT
