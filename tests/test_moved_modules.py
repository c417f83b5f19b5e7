"""The module paths from before the layer folders still import, as the same modules, and
objects pickled under them load."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys

import pytest

import pipelined_vec_env
from pipelined_vec_env.moved_modules import MOVED


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_path_imports_the_moved_module(old, new):
    moved = importlib.import_module(f"pipelined_vec_env.{new}")
    assert importlib.import_module(f"pipelined_vec_env.{old}") is moved


def test_from_imports_of_documented_paths():
    from pipelined_vec_env.channel import InferenceChannel
    from pipelined_vec_env.tune import TuneResult, measure_layout

    from pipelined_vec_env.profiling import Profiler
    from pipelined_vec_env.stepping.channel import InferenceChannel as moved_channel
    from pipelined_vec_env.tuning.tuner import TuneResult as moved_result

    assert InferenceChannel is moved_channel
    assert TuneResult is moved_result
    assert callable(measure_layout) and callable(pipelined_vec_env.tune)
    assert Profiler.__module__ == "pipelined_vec_env.profiling.profiler"


def test_a_pickle_naming_an_old_path_loads_in_a_fresh_process():
    # protocol 0 names the class by module and qualname: the old path, as a pickle written
    # before the move would
    from pipelined_vec_env.workers.protocol import Command

    data = pickle.dumps(Command.STEP, protocol=0).replace(
        b"pipelined_vec_env.workers.protocol", b"pipelined_vec_env.protocol"
    )
    assert b"pipelined_vec_env.protocol\n" in data
    code = (
        "import pickle, sys\n"
        "obj = pickle.loads(sys.stdin.buffer.read())\n"
        "print(type(obj).__module__, obj.name)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=data, capture_output=True, check=True, timeout=60
    ).stdout.decode()
    assert out.split() == ["pipelined_vec_env.workers.protocol", "STEP"]
