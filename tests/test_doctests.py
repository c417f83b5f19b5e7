"""Every docstring example in the packages runs as a doctest.

The examples are the ones the API reference renders (their `Examples:` sections), so a
change that breaks one breaks what users copy. Modules are found by looking for `>>>` in
their source; a module whose optional extra is missing is skipped, not passed; any other
ImportError (the package's own modules, a required dependency) fails.
"""

from __future__ import annotations

import doctest
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("pipelined_vec_env", "reference_trainer")
#: Top-level modules of the optional extras in pyproject.toml (mujoco, train, sb3, libero,
#: ray, profile): a module needing one of these is skipped where it is not installed.
OPTIONAL_EXTRAS = frozenset(
    {
        "mujoco",
        "torch",
        "tyro",
        "tqdm",
        "tensorboard",
        "imageio",
        "imageio_ffmpeg",
        "psutil",
        "h5py",
        "matplotlib",
        "stable_baselines3",
        "libero",
        "robosuite",
        "ray",
    }
)


def modules_with_examples() -> list[str]:
    """Dotted names of the package modules whose source holds a `>>>` example."""
    names = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if ">>>" not in path.read_text(encoding="utf-8"):
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join(parts))
    return names


def test_examples_are_found():
    names = modules_with_examples()
    assert "pipelined_vec_env.vector_env" in names and "pipelined_vec_env.stepping.channel" in names


@pytest.mark.parametrize("name", modules_with_examples())
def test_docstring_examples_run(name):
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] not in OPTIONAL_EXTRAS:
            raise  # the package's own module, or a required dependency: a failure
        pytest.skip(f"{name}: the optional extra providing {error.name!r} is not installed")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, report=True)
    if result.attempted == 0:  # LIBERO's examples need the simulator: all `+SKIP`
        pytest.skip(f"{name}: every example is marked +SKIP")
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
