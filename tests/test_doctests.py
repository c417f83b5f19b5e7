"""Every docstring example in the packages runs as a doctest.

The examples are the ones the API reference renders (their `Examples:` sections), so a
change that breaks one breaks what users copy. Modules are found by looking for `>>>` in
their source; a module whose optional dependency is missing is skipped, not passed.
"""

from __future__ import annotations

import doctest
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("pipelined_vec_env", "reference_trainer")


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
    except ImportError as error:  # an optional extra (torch, stable-baselines3, libero)
        pytest.skip(f"{name}: {error}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, report=True)
    if result.attempted == 0:  # LIBERO's examples need the simulator: all `+SKIP`
        pytest.skip(f"{name}: every example is marked +SKIP")
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
