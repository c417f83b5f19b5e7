"""CleanRL's own ``ppo_continuous_action.py``: SPS with ``SyncVectorEnv`` and with ``PipelinedVectorEnv``.

The script is CleanRL's (MIT license, Copyright (c) 2019 CleanRL developers), read at run
time from a CleanRL checkout or clone and written, patched, into a temporary folder; no
copy of it lives in this repository. Two variants are run:

- **sync**: the script as published, with the gymnasium 1.x fixes below;
- **pipelined**: the same, with its vector env line changed from
  ``gym.vector.SyncVectorEnv(`` to ``PipelinedVectorEnv(`` (no layout argument: the layout
  `default_envs_per_worker` picks for the machine) and the import that name needs.

The gymnasium 1.x fixes, applied to both: ``TransformObservation`` takes the observation
space as its third argument, and the episode statistics are read from
``infos["episode"]`` / ``infos["_episode"]`` (gymnasium 1.x vector envs have no
``final_info`` list). Every patch is an exact text replacement; one that does not match
the fetched script stops the benchmark with the text it looked for.

Each run trains ``--total-timesteps`` env steps (``--num-envs`` envs, ``--num-steps`` per
rollout) and prints CleanRL's ``SPS:`` line after every iteration; the last one (env steps
over wall time since the first reset, training included) is the run's figure. Runs are
interleaved in rounds (sync, pipelined, sync, pipelined, ...) so drift on a shared
machine spreads over both; the table shows medians and the median of per-round ratios.

Run::

    # from a CleanRL clone (or a bare mirror: --git-dir PATH/.git or the mirror itself)
    python benchmarks/cleanrl_sps.py --git-dir ~/src/cleanrl/.git    # < 5 minutes on 2 cores
    python benchmarks/cleanrl_sps.py --script ~/src/cleanrl/cleanrl/ppo_continuous_action.py
    python benchmarks/cleanrl_sps.py --rounds 3 --total-timesteps 10240 --git-dir ...
    # less training per env step (the vector env's share of the time grows)
    python benchmarks/cleanrl_sps.py --git-dir ... --cleanrl-args="--update-epochs 1 --num-minibatches 4"
    python benchmarks/cleanrl_sps.py --help

Without ``--script`` or ``--git-dir`` it clones https://github.com/vwxyzjn/cleanrl (needs
the network and ``git``). Results go to ``benchmarks/results/cleanrl_sps.json`` and
``.md``, with the CleanRL commit and the machine's description.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _machine.py, also when loaded by path
from _machine import cpu_model, machine_identity, package_versions, write_results  # noqa: E402

__all__ = ["Args", "Patch", "VARIANTS", "main", "patched", "sps_of"]

RESULTS = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT_PATH = "cleanrl/ppo_continuous_action.py"
CLONE_URL = "https://github.com/vwxyzjn/cleanrl"


@dataclass
class Args:
    """CleanRL PPO SPS options (the defaults run in under five minutes on 2 cores)."""

    script: Path | None = None
    """CleanRL's ppo_continuous_action.py (else read from ``git_dir``, else cloned)."""
    git_dir: Path | None = None
    """A CleanRL git directory (a clone's ``.git`` or a bare mirror); its ``HEAD`` is read."""
    env_id: str = "HalfCheetah-v5"
    """gymnasium id of the task."""
    num_envs: int = 4
    """Envs of the vector env."""
    total_timesteps: int = 10_240
    """Env steps per run."""
    num_steps: int = 512
    """Rollout length per env (CleanRL's ``--num-steps``); an iteration is
    ``num_envs * num_steps`` env steps."""
    cleanrl_args: str = ""
    """More arguments for CleanRL's script in one string, the same for both variants (e.g.
    ``--cleanrl-args="--update-epochs 1 --num-minibatches 4"``: less training per env
    step, so the vector env's share of the wall time grows)."""
    rounds: int = 2
    """Runs per variant, interleaved; the table shows medians."""
    seed: int = 1
    """CleanRL's ``--seed`` (the same for both variants)."""
    torch_threads: int = 1
    """``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` of each run (0: leave them as they are);
    the script sets none, and torch's default of one thread per core competes with the
    env workers for the same cores."""
    timeout: float = 600.0
    """Seconds one run may take before it is killed (the benchmark then fails)."""
    output: Path = RESULTS / "cleanrl_sps.json"
    """The JSON results; the markdown table goes next to it (.md)."""


@dataclass(frozen=True)
class Patch:
    """One exact text replacement in CleanRL's script.

    Attributes:
        why: What it fixes or changes (shown if it does not match).
        old: The text replaced (must occur exactly once).
        new: Its replacement.
    """

    why: str
    old: str
    new: str


#: gymnasium 1.x fixes, applied to both variants.
GYMNASIUM_1X = (
    Patch(
        "gymnasium 1.x: TransformObservation takes the observation space",
        "gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10))",
        "gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), "
        "env.observation_space)",
    ),
    Patch(
        "gymnasium 1.x: episode statistics in infos['episode'] masked by infos['_episode']",
        'if "final_info" in infos:\n                for info in infos["final_info"]:',
        'if "episode" in infos:\n                for info in [{"episode": {k: v[i] for k, v in '
        'infos["episode"].items()}} for i in np.flatnonzero(infos["_episode"])]:',
    ),
)

#: The vector env line and the import it needs.
PIPELINED = (
    Patch(
        "the vector env line",
        "envs = gym.vector.SyncVectorEnv(",
        "envs = PipelinedVectorEnv(",
    ),
    Patch(
        "the import of PipelinedVectorEnv",
        "import gymnasium as gym\n",
        "import gymnasium as gym\nfrom pipelined_vec_env import PipelinedVectorEnv\n",
    ),
)

#: Variant name -> its patches, in the order the rounds run them.
VARIANTS: dict[str, tuple[Patch, ...]] = {
    "SyncVectorEnv": GYMNASIUM_1X,
    "PipelinedVectorEnv(env_fns)": GYMNASIUM_1X + PIPELINED,
}


def patched(source: str, patches: tuple[Patch, ...]) -> str:
    """``source`` with every patch applied.

    Raises:
        ValueError: A patch's text does not occur exactly once in ``source`` (the script
            changed upstream); the message names the patch and the text.
    """
    for p in patches:
        count = source.count(p.old)
        if count != 1:
            raise ValueError(
                f"CleanRL script: patch '{p.why}' expected its text exactly once, found it "
                f"{count} times: {p.old!r}"
            )
        source = source.replace(p.old, p.new)
    return source


def sps_of(output: str) -> int:
    """The last ``SPS: N`` CleanRL printed in ``output``.

    Raises:
        ValueError: No ``SPS:`` line (the run trained no whole iteration).
    """
    found = re.findall(r"^SPS: (\d+)\s*$", output, flags=re.MULTILINE)
    if not found:
        raise ValueError("no 'SPS: N' line in CleanRL's output (no iteration finished)")
    return int(found[-1])


def read_script(args: Args, workdir: Path) -> tuple[str, str | None]:
    """CleanRL's script and the commit it came from (None where unknown)."""
    if args.script is not None:
        return args.script.read_text(), None
    git_dir = args.git_dir
    if git_dir is None:
        git_dir = workdir / "cleanrl.git"
        subprocess.run(
            ["git", "clone", "--bare", "--depth", "1", CLONE_URL, str(git_dir)],
            check=True,
        )

    def git(*argv: str) -> str:
        command = ["git", f"--git-dir={git_dir}", *argv]
        return subprocess.run(command, check=True, capture_output=True, text=True).stdout

    return git("show", f"HEAD:{SCRIPT_PATH}"), git("rev-parse", "HEAD").strip()


def run_once(script: Path, args: Args) -> dict[str, Any]:
    """Run one variant's script in its folder; its SPS and wall time."""
    command = [
        sys.executable,
        str(script),
        "--env-id", args.env_id,
        "--num-envs", str(args.num_envs),
        "--total-timesteps", str(args.total_timesteps),
        "--num-steps", str(args.num_steps),
        "--seed", str(args.seed),
        "--no-cuda",
        *shlex.split(args.cleanrl_args),
    ]  # fmt: skip
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    if args.torch_threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.torch_threads)
    started = time.perf_counter()
    done = subprocess.run(
        command,
        cwd=script.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=args.timeout,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(
            f"{script.name} exited with {done.returncode}:\n{done.stdout[-2000:]}\n"
            f"{done.stderr[-4000:]}"
        )
    return {
        "sps": sps_of(done.stdout),
        "wall_s": wall,
        "loadavg_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def machine() -> dict[str, Any]:
    return {
        **machine_identity(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "usable_cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "versions": package_versions(("gymnasium", "mujoco", "numpy", "torch", "tyro")),
    }


def table(rows: list[dict[str, Any]], args: Args, commit: str | None) -> str:
    source = f"CleanRL {commit[:7]}" if commit else "CleanRL"
    lines = [
        f"{source} ppo_continuous_action.py on {args.env_id}, {args.num_envs} envs, "
        f"{args.total_timesteps} steps (num_steps={args.num_steps}"
        + (f" {args.cleanrl_args}" if args.cleanrl_args else "")
        + "), median of "
        f"{args.rounds} interleaved rounds",
        "",
        "| vector env | SPS | vs SyncVectorEnv (paired) | wall (s) |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        ratio = "" if r["vs_sync"] is None else f"{r['vs_sync']:.2f}x"
        lines.append(f"| {r['variant']} | {r['sps']:.0f} | {ratio} | {r['wall_s']:.1f} |")
    return "\n".join(lines)


#: How `runs_table` names each variant.
LABELS = {"SyncVectorEnv": "`gym.vector.SyncVectorEnv`"}


def runs_table(result: dict[str, Any]) -> str:
    """A result file's (the whole JSON's) medians, every round's SPS and the paired ratio
    with the target, as ``docs/benchmarks.md`` shows them."""
    lines = [
        "| vector env | SPS (median) | per round | vs SyncVectorEnv (paired) |",
        "|---|---:|---|---:|",
    ]
    for r in result["rows"]:
        label = LABELS.get(r["variant"], f"`{r['variant']}`")
        rounds = ", ".join(str(x["sps"]) for x in r["runs"])
        ratio = ""
        if r["vs_sync"] is not None:
            met = "met" if r["vs_sync"] >= 1.1 else "not met"
            ratio = f"{r['vs_sync']:.2f}x (target >= 1.1x: {met})"
        lines.append(f"| {label} | {r['sps']:.0f} | {rounds} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = tyro.cli(Args, args=argv)
    with tempfile.TemporaryDirectory(prefix="cleanrl_sps_") as tmp:
        workdir = Path(tmp)
        source, commit = read_script(args, workdir)
        scripts: dict[str, Path] = {}
        for k, (name, patches) in enumerate(VARIANTS.items()):
            folder = workdir / f"variant{k}"
            folder.mkdir()
            scripts[name] = folder / "ppo_continuous_action.py"
            scripts[name].write_text(patched(source, patches))
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
        for r in range(args.rounds):
            for name, script in scripts.items():
                result = run_once(script, args)
                runs[name].append(result)
                print(
                    f"round {r + 1}/{args.rounds}  {name:28s} SPS {result['sps']:6d}  "
                    f"wall {result['wall_s']:6.1f} s  (load {result['loadavg_1min']:.1f})",
                    flush=True,
                )
    sync = runs["SyncVectorEnv"]
    rows = []
    for name, results in runs.items():
        paired = [a["sps"] / b["sps"] for a, b in zip(results, sync, strict=True)]
        rows.append(
            {
                "variant": name,
                "sps": statistics.median(x["sps"] for x in results),
                "wall_s": statistics.median(x["wall_s"] for x in results),
                "vs_sync": None if name == "SyncVectorEnv" else statistics.median(paired),
                "runs": results,
            }
        )
    pipelined = rows[1]["vs_sync"]
    report = {
        "args": {k: str(v) for k, v in asdict(args).items()},
        "cleanrl_commit": commit,
        "machine": machine(),
        "rows": rows,
        "target": {"vs_sync": ">= 1.1", "measured": pipelined, "met": pipelined >= 1.1},
    }
    write_results(args.output, report, table(rows, args, commit))
    return report


if __name__ == "__main__":
    main()
