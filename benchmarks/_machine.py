"""What every benchmark records about the machine it ran on (imported by the scripts
beside it, also when a test loads a script by its path)."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path

__all__ = [
    "REPO",
    "cpu_model",
    "cpu_seconds",
    "git_commit",
    "machine_identity",
    "package_versions",
    "python_in_tree",
    "relative_paths",
    "run_record",
    "run_script",
    "tree_environ",
    "write_results",
    "workers_cpu_seconds",
]


#: The repository these scripts live in.
REPO = Path(__file__).resolve().parents[1]

#: An absolute path in a string: under the user's folders, a scratch folder or a checkout.
_ABSOLUTE = re.compile(
    r"(?<![\w.~<>-])/(?:tmp|work|root|home|Users|private|var|mnt)(?:/[\w.+=@-]+)+"
)


def relative_paths(value: object, repo: Path = REPO) -> object:
    """``value`` (a result to be written: dicts, lists, strings, `Path`; dict keys too) with
    every absolute path made relative to ``repo`` (``repo`` itself is ``"."``); a path outside ``repo``
    keeps its last two parts after ``<outside>/`` (``/tmp/base/pipelined_vec_env`` is
    ``<outside>/base/pipelined_vec_env``), so a result file names no more of the machine's
    folders than the last two parts of a path (all of a short one: ``/tmp/base`` is
    ``<outside>/tmp/base``)."""
    if isinstance(value, dict):
        return {relative_paths(k, repo): relative_paths(v, repo) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [relative_paths(v, repo) for v in value]
    if isinstance(value, Path):
        value = str(value)
    if not isinstance(value, str):
        return value
    root = str(repo.resolve())
    # the repository's own paths first, wherever it is checked out (``/check/...`` too)
    inside = re.compile(rf"(?<![\w.~<>/-]){re.escape(root)}(?![\w.+=@-])(?:/[\w.+=@-]+)*")

    def within(match: re.Match[str]) -> str:
        return match[0][len(root) + 1 :] or "."

    def outside(match: re.Match[str]) -> str:
        return "<outside>/" + "/".join(match[0].rstrip("/").split("/")[-2:])

    return _ABSOLUTE.sub(outside, inside.sub(within, value))


def machine_identity() -> dict:
    """Which machine this is: CPU model, CPU count and the cores this process may use,
    kernel (``platform.release()``), platform string, Python version, and the 1-, 5- and
    15-minute load averages now."""
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        # the cores this process may run on (a `taskset` pin shows here)
        "usable_cpus": sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (Linux), else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def cpu_seconds(pids: Iterable[int]) -> float | None:
    """CPU time used so far by the processes ``pids`` (Linux ``/proc/<pid>/schedstat``, ns
    resolution); None where it cannot be read."""
    total = 0
    try:
        for pid in pids:
            with open(f"/proc/{pid}/schedstat") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total / 1e9


def workers_cpu_seconds(pids: Iterable[int]) -> float:
    """`cpu_seconds` of ``pids``, for benchmarks that need it.

    Raises:
        RuntimeError: where ``/proc/<pid>/schedstat`` cannot be read (not Linux, or a
            process gone).
    """
    seconds = cpu_seconds(pids)
    if seconds is None:
        raise RuntimeError("the workers' CPU time needs Linux's /proc/<pid>/schedstat")
    return seconds


def tree_environ(tree: Path) -> dict[str, str]:
    """This process's environment with ``tree`` (a directory holding a ``pipelined_vec_env``
    package, e.g. a ``git archive`` of another commit) first on ``PYTHONPATH``, so that a
    child process and its workers import that tree's package."""
    rest = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": f"{tree.resolve()}{os.pathsep}{rest}"}


def python_in_tree(tree: Path, code: str, check: bool = False) -> subprocess.CompletedProcess:
    """``python -c code`` with `tree_environ`, run from ``tree`` itself: ``-c`` puts the
    working directory first on the path, ahead of ``PYTHONPATH``, so a package in the
    caller's directory would shadow the tree's. Its output is captured as text.

    Raises:
        subprocess.CalledProcessError: with ``check``, the code failed.
    """
    return subprocess.run(
        [sys.executable, "-c", code],
        env=tree_environ(tree),
        capture_output=True,
        text=True,
        check=check,
        cwd=tree.resolve(),
    )


def run_script(
    script: Path, arguments: Sequence[str], output: Path, env: dict[str, str] | None = None
) -> dict:
    """Run the benchmark ``script`` with ``arguments`` and ``--output output`` in a new
    Python process (environment ``env``, by default this one's); its JSON result.

    Raises:
        RuntimeError: the run failed (the end of its stderr is in the message).
    """
    command = [sys.executable, str(script), *arguments, "--output", str(output)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return json.loads(output.read_text())


def git_commit(repo: Path) -> str:
    """The ``GIT_COMMIT`` environment variable where set (a copy of the tree on another
    machine, whose own git state may be older), else the short hash of ``repo``'s HEAD
    with ``+uncommitted`` where the package or the benchmarks' code differ from it, else
    ``"unknown"``."""
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        changed = subprocess.run(
            ["git", "-C", str(repo), "diff", "--quiet", "HEAD", "--"]
            + ["pipelined_vec_env", "benchmarks", ":!benchmarks/results"],
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip() + ("+uncommitted" if changed.returncode == 1 else "")


def package_versions(names: Iterable[str]) -> dict[str, str | None]:
    """Installed version of each distribution in ``names`` (None where not installed)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def run_record(repo: Path, started: float, load_start: float, packages: Iterable[str]) -> dict:
    """Where and how a run was made: wall time since ``started`` (``time.time()``), the
    command line (paths relative to ``repo``), ``repo``'s commit, the start date (UTC), and
    the machine (`machine_identity`: CPU model, cores, kernel, load averages at the end;
    the 1-minute load at the start, ``load_start``; versions of ``packages``)."""
    return {
        "wall_s": time.time() - started,
        "command": relative_paths("python " + " ".join(sys.argv), repo),
        "commit": git_commit(repo),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "machine": {
            **machine_identity(),
            "load_average_1m_start": load_start,
            "load_average_1m_end": os.getloadavg()[0],
            "versions": package_versions(packages),
        },
    }


def write_results(output: Path, report: dict, text: str) -> None:
    """Print ``text`` (the markdown table) and write ``report`` to ``output`` (JSON, its
    paths made relative by `relative_paths`) and the table beside it (``output`` with the
    suffix ``.md``), making the folder if needed; print where they went."""
    print(text)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(relative_paths(report), indent=2))
    output.with_suffix(".md").write_text(text + "\n")
    print(
        f"wrote {relative_paths(str(output))} and {relative_paths(str(output.with_suffix('.md')))}"
    )
