"""Old module paths of the package, kept importable after its modules moved into layer
folders (``pipelined_vec_env.pool`` is now ``pipelined_vec_env.workers.pool``).

An import of an old path, including the one pickle makes to load an object pickled before
the move, gets the module at its new path: the same module object, not a copy.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

#: old path -> new path, both relative to the package
MOVED: dict[str, str] = {
    "pool": "workers.pool",
    "worker": "workers.worker",
    "worker_handle": "workers.worker_handle",
    "ray_backend": "workers.ray_backend",
    "slots": "workers.slots",
    "transport": "workers.transport",
    "protocol": "workers.protocol",
    "spinning": "workers.spinning",
    "waiting": "workers.waiting",
    "failures": "workers.failures",
    "main_module": "workers.main_module",
    "stages": "stepping.stages",
    "stage_stepping": "stepping.stage_stepping",
    "decoupled": "stepping.decoupled",
    "decoupled_methods": "stepping.decoupled_methods",
    "channel": "stepping.channel",
    "actors": "stepping.actors",
    "profile_records": "profiling.records",
    "profile_summary": "profiling.summary",
    "chrome_trace": "profiling.chrome_trace",
    "_timeline": "profiling.timeline",
    "tune": "tuning.tuner",
    "layout_model": "tuning.layout_model",
    "tune_selection": "tuning.selection",
}


class _AliasLoader(importlib.abc.Loader):
    """Loads an old path by importing the new one and returning that module."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was executed under its new name."""


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` finder for the old paths in ``MOVED``."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.targets = {f"{package}.{old}": f"{package}.{new}" for old, new in MOVED.items()}

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001, ANN201
        new = self.targets.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install(package: str) -> None:
    """Alias the old paths of the modules loaded so far and put the finder first on ``sys.meta_path``, once, for ``package`` (the package's name).

    First, so that no other finder (an editable install's, say) answers an old path with
    a file of another checkout.
    """
    finder = MovedModuleFinder(package)
    # an old path whose module is loaded already goes into sys.modules now: an import of it
    # then never sets the package's attribute of that name (``pipelined_vec_env.tune``
    # stays the function, not the module)
    for old, new in finder.targets.items():
        if new in sys.modules:
            sys.modules.setdefault(old, sys.modules[new])
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, finder)
