"""Run gymnasium's and Stable-Baselines3's own vector-env tests against this package.

Nothing of theirs is copied into this repository: point the script at checkouts (or
extracted source trees) of the two projects, at the versions that match the installed
packages, and it runs their tests with our classes swapped in at run time:

- gymnasium ``tests/vector``: ``gymnasium.vector.AsyncVectorEnv`` (and so
  ``gymnasium.make_vec(..., vectorization_mode="async")``) is replaced by a
  `PipelinedVectorEnv` subclass that takes ``AsyncVectorEnv``'s arguments. Its tests
  import the name at collection time, so this script loads itself into pytest as a
  plugin (``-p run_upstream_suites``) and patches before collection.
- SB3 ``tests/test_vec_envs.py``: `SB3VecEnv` is added to ``VEC_ENV_CLASSES``. That list
  is consumed by ``itertools.product`` while the module is imported, so the test module
  is copied into a temporary directory with the one line extended (the run fails loudly
  if the line is not there); the checkout itself is never modified.

gymnasium's suite needs ``pygame`` (``pip install pygame``) and, for one test that also
fails with the unmodified ``AsyncVectorEnv``, ``box2d``.

Usage:

    python scripts/run_upstream_suites.py --gymnasium ~/src/Gymnasium --sb3 ~/src/stable-baselines3
    python scripts/run_upstream_suites.py --gymnasium ~/src/Gymnasium --baseline   # unmodified

With ``git``: ``git clone https://github.com/Farama-Foundation/Gymnasium`` and check out
the commit or tag of the installed version (``python -c "import gymnasium;
print(gymnasium.__version__)"``); the same for DLR-RM/stable-baselines3. The script prints
passed/failed/skipped counts per suite and every failing test id with the first line of
its error; ``--json PATH`` writes them too. See docs/conformance.md for the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

_SUITE_ENV = "PVE_UPSTREAM_SUITE"
_STAGES_ENV = "PVE_UPSTREAM_NUM_STAGES"
_PER_WORKER_ENV = "PVE_UPSTREAM_ENVS_PER_WORKER"
_SB3_LINE = "VEC_ENV_CLASSES = [DummyVecEnv, SubprocVecEnv]"
_SB3_PATCHED = (
    "from pipelined_vec_env.sb3 import SB3VecEnv\n"
    "VEC_ENV_CLASSES = [DummyVecEnv, SubprocVecEnv, SB3VecEnv]"
)


# ---------------------------------------------------------------- pytest plugin side


def _async_compatible_class() -> type:
    """A `PipelinedVectorEnv` subclass whose constructor takes ``AsyncVectorEnv``'s."""
    from gymnasium.vector import AutoresetMode

    from pipelined_vec_env import PipelinedVectorEnv

    num_stages = int(os.environ.get(_STAGES_ENV, "1"))
    envs_per_worker = int(os.environ.get(_PER_WORKER_ENV, "1"))

    class AsyncCompatiblePipelinedVectorEnv(PipelinedVectorEnv):
        def __init__(
            self,
            env_fns,
            shared_memory=True,
            copy=True,
            context=None,
            daemon=True,
            worker=None,
            observation_mode="same",
            autoreset_mode=AutoresetMode.NEXT_STEP,
        ):
            if worker is not None:
                raise NotImplementedError("worker=: a custom AsyncVectorEnv worker function")
            env_fns = list(env_fns)
            super().__init__(
                env_fns,
                num_stages=max(1, min(num_stages, len(env_fns))),
                envs_per_worker=envs_per_worker,
                shared_memory=shared_memory,
                copy=copy,
                context=context,
                daemon=daemon,
                observation_mode=observation_mode,
                autoreset_mode=autoreset_mode,
            )

    return AsyncCompatiblePipelinedVectorEnv


def pytest_configure(config) -> None:  # noqa: ANN001 - pytest hook
    """Swap our class in before the upstream test modules are imported."""
    if os.environ.get(_SUITE_ENV) != "gymnasium":
        return
    import gymnasium.vector
    import gymnasium.vector.async_vector_env

    cls = _async_compatible_class()
    gymnasium.vector.AsyncVectorEnv = cls
    gymnasium.vector.async_vector_env.AsyncVectorEnv = cls


# ---------------------------------------------------------------- runner side


def _test_id(cwd: Path, classname: str, name: str) -> str:
    """pytest's node id from a junit ``classname`` (``pkg.module.Class``) and test name."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = Path(*parts[:cut]).with_suffix(".py")
        if (cwd / path).is_file():
            return "::".join([path.as_posix(), *parts[cut:], name])
    return f"{classname}::{name}"


def _summarise(junit: Path, cwd: Path) -> dict:
    root = ET.parse(junit).getroot()
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    failing = []
    for case in root.iter("testcase"):
        name = _test_id(cwd, case.get("classname", ""), case.get("name", ""))
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                if child.tag != "skipped":
                    message = (child.get("message") or child.text or "").strip().splitlines()
                    failing.append((name, outcome, message[0][:200] if message else ""))
                break
        counts[outcome] += 1
    return {"counts": counts, "failing": failing}


def _run_pytest(cwd: Path, args: list[str], env: dict[str, str], timeout: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            *args,
            "-q",
            "-p",
            "no:cacheprovider",
            "--tb=native",  # pytest 9 on CPython 3.11 can crash rendering deep tracebacks
            f"--timeout={timeout}",
            f"--junitxml={junit}",
        ]
        print("$", " ".join(cmd), f"(in {cwd})", flush=True)
        subprocess.run(cmd, cwd=cwd, env=env, check=False)
        if not junit.exists():
            raise SystemExit("pytest wrote no report (did it start?)")
        return _summarise(junit, cwd)


def _plugin_env(suite: str | None, baseline: bool) -> dict[str, str]:
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parent)
    project = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, project, env.get("PYTHONPATH")) if p)
    env.pop(_SUITE_ENV, None)
    if suite is not None and not baseline:
        env[_SUITE_ENV] = suite
    return env


def run_gymnasium(checkout: Path, baseline: bool, timeout: int, extra: list[str]) -> dict:
    """Run ``tests/vector`` of a gymnasium checkout (ours swapped in unless ``baseline``)."""
    if not (checkout / "tests" / "vector").is_dir():
        raise SystemExit(f"--gymnasium: no tests/vector under {checkout}")
    args = ["tests/vector", "-p", "run_upstream_suites", *extra]
    return _run_pytest(checkout, args, _plugin_env("gymnasium", baseline), timeout)


def run_sb3(checkout: Path, baseline: bool, timeout: int, extra: list[str]) -> dict:
    """Run ``tests/test_vec_envs.py`` of an SB3 checkout with `SB3VecEnv` added."""
    source = checkout / "tests" / "test_vec_envs.py"
    if not source.is_file():
        raise SystemExit(f"--sb3: no tests/test_vec_envs.py under {checkout}")
    text = source.read_text()
    if _SB3_LINE not in text:
        raise SystemExit(f"--sb3: {source} has no line {_SB3_LINE!r}; update this script")
    with tempfile.TemporaryDirectory() as tmp:
        tests = Path(tmp) / "tests"
        shutil.copytree(checkout / "tests", tests)
        if not baseline:
            (tests / "test_vec_envs.py").write_text(text.replace(_SB3_LINE, _SB3_PATCHED, 1))
        args = ["tests/test_vec_envs.py", *extra]
        return _run_pytest(Path(tmp), args, _plugin_env(None, baseline), timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gymnasium", type=Path, help="path of a gymnasium checkout")
    parser.add_argument("--sb3", type=Path, help="path of a stable-baselines3 checkout")
    parser.add_argument("--baseline", action="store_true", help="run without our classes")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per test")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--num-stages", type=int, default=1, help="stages of the swapped-in env (gymnasium)"
    )
    parser.add_argument(
        "--envs-per-worker", type=int, default=1, help="envs per worker (gymnasium)"
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    if args.gymnasium is None and args.sb3 is None:
        parser.error("give --gymnasium and/or --sb3")
    os.environ[_STAGES_ENV] = str(args.num_stages)
    os.environ[_PER_WORKER_ENV] = str(args.envs_per_worker)
    results = {}
    if args.gymnasium is not None:
        results["gymnasium tests/vector"] = run_gymnasium(
            args.gymnasium.resolve(), args.baseline, args.timeout, args.pytest_args
        )
    if args.sb3 is not None:
        results["sb3 tests/test_vec_envs.py"] = run_sb3(
            args.sb3.resolve(), args.baseline, args.timeout, args.pytest_args
        )
    for suite, result in results.items():
        c = result["counts"]
        print(
            f"\n{suite}: {c['passed']} passed, {c['failed']} failed, {c['error']} errors, "
            f"{c['skipped']} skipped"
        )
        for name, outcome, message in result["failing"]:
            print(f"  {outcome.upper()} {name}: {message}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return int(any(r["counts"]["failed"] or r["counts"]["error"] for r in results.values()))


if __name__ == "__main__":
    sys.exit(main())
