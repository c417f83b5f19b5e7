"""Run one variant of a benchmark in a child process, with a given checkout's package
first on the path (imported by the scripts beside it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence

__all__ = ["run_child_json"]


def run_child_json(script: str, argv: Sequence[str], package_dir: str) -> dict:
    """Run ``python script *argv`` with ``package_dir`` (a directory holding a
    ``pipelined_vec_env``) first on ``PYTHONPATH``, and return the JSON object its last
    line of output prints.

    Raises:
        subprocess.CalledProcessError: The child failed (its stderr is on the error).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([package_dir, env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, script, *argv], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])
