"""Demonstrations as hdf5 files in robomimic's / LIBERO's layout (needs ``h5py``).

The layout is the one robomimic defines and LIBERO's released datasets use
(robomimic.github.io/docs/datasets/overview.html; LIBERO's ``scripts/create_dataset.py``)::

    data/                        attrs: env_name, env_args (JSON), problem_info (JSON),
                                        bddl_file_name, num_demos, total, ...
    data/demo_0/                 attrs: num_samples, ...
    data/demo_0/obs/<key>        (T, ...) one dataset per observation key
    data/demo_0/actions          (T, A) float
    data/demo_0/rewards          (T,)
    data/demo_0/dones            (T,)
    data/demo_0/<other>          (T, ...) optional (LIBERO: states, robot_states)
    mask/<filter_key>            optional: names of demos in a split (robomimic)

Step ``t`` pairs ``obs[t]`` with ``actions[t]``, and ``rewards[t]``/``dones[t]`` are what
that action led to. `load_demos` reads any file in this layout, so a user's own LIBERO
demonstration file (e.g. ``libero_object/..._demo.hdf5``, with ``agentview_rgb``,
``ee_pos``, ``joint_states``, ... as observation keys) loads as well as ours.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Demo", "DemoSet", "load_demos", "write_demos"]

_JSON_ATTRS = ("env_args", "problem_info", "collection")


@dataclass
class Demo:
    """One demonstration episode.

    Attributes:
        obs: Observation key -> array ``(T, ...)``.
        actions: ``(T, A)`` float32, the action labelled for each observation (for our
            expert demos collected with noise: the expert's clean action; the executed,
            noisy one is in ``extras["executed_actions"]``).
        rewards: ``(T,)`` float32.
        dones: ``(T,)`` uint8, 1 on the step that ended the episode by success.
        extras: Other per-step datasets of the demo group (name -> ``(T, ...)``).
        attrs: The demo group's attributes (``num_samples``, ``init_state_id``, ...).
    """

    obs: dict[str, np.ndarray]
    actions: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(len(self.actions))


@dataclass
class DemoSet:
    """A demonstration file's contents.

    Attributes:
        demos: The episodes, in the file's ``demo_<k>`` order (by ``k``).
        attrs: The ``data`` group's attributes; ``env_args``, ``problem_info`` and
            ``collection`` are decoded from JSON into dicts.
        names: The group name of each demo (``"demo_0"``, ...).
    """

    demos: list[Demo]
    attrs: dict[str, Any] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.demos)

    @property
    def num_samples(self) -> int:
        """Total steps over all demos."""
        return sum(len(d) for d in self.demos)

    @property
    def obs_keys(self) -> list[str]:
        """Observation keys of the first demo (sorted)."""
        return sorted(self.demos[0].obs) if self.demos else []


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "demonstration files need h5py: pip install 'pipelined-vec-env[libero]'"
        ) from err
    return h5py


def _attr_value(value: Any) -> Any:
    """Make an attribute storable: dicts and lists as JSON, None as an empty string."""
    if isinstance(value, dict):
        return json.dumps(value)
    if value is None:
        return ""
    return value


def _read_attrs(attrs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in attrs.items():
        if isinstance(value, bytes):
            value = value.decode()
        if isinstance(value, np.generic):
            value = value.item()
        if key in _JSON_ATTRS and isinstance(value, str) and value:
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                pass
        out[key] = value
    return out


def write_demos(
    path: str | os.PathLike[str], demos: DemoSet, *, compression: str | None = "gzip"
) -> None:
    """Write demonstrations in robomimic's / LIBERO's hdf5 layout.

    Args:
        path: Output file (overwritten).
        demos: The episodes and the ``data`` attributes; ``num_demos`` and ``total`` are
            set from the episodes.
        compression: h5py compression of the per-step datasets (None: none).

    Raises:
        ValueError: If a demo's datasets do not all have its number of steps.
        ImportError: Without ``h5py``.
    """
    h5py = _h5py()
    for name, demo in zip(_names(demos), demos.demos, strict=True):
        _check_lengths(name, demo)
    tmp = f"{os.fspath(path)}.tmp"
    with h5py.File(tmp, "w") as f:
        data = f.create_group("data")
        for key, value in demos.attrs.items():
            data.attrs[key] = _attr_value(value)
        data.attrs["num_demos"] = len(demos)
        data.attrs["total"] = demos.num_samples
        for name, demo in zip(_names(demos), demos.demos, strict=True):
            group = data.create_group(name)
            for key, value in demo.attrs.items():
                group.attrs[key] = _attr_value(value)
            group.attrs["num_samples"] = len(demo)
            for key, value in demo.obs.items():
                group.create_dataset(f"obs/{key}", data=value, compression=compression)
            group.create_dataset("actions", data=demo.actions, compression=compression)
            group.create_dataset("rewards", data=demo.rewards, compression=compression)
            group.create_dataset("dones", data=demo.dones, compression=compression)
            for key, value in demo.extras.items():
                group.create_dataset(key, data=value, compression=compression)
    os.replace(tmp, path)


def _names(demos: DemoSet) -> list[str]:
    if demos.names and len(demos.names) == len(demos.demos):
        return list(demos.names)
    return [f"demo_{k}" for k in range(len(demos.demos))]


def _check_lengths(name: str, demo: Demo) -> None:
    n = len(demo.actions)
    arrays = {"rewards": demo.rewards, "dones": demo.dones}
    arrays.update({f"obs/{k}": v for k, v in demo.obs.items()})
    arrays.update(demo.extras)
    for key, value in arrays.items():
        if len(value) != n:
            raise ValueError(
                f"{name}/{key} has {len(value)} steps but {name}/actions has {n}; every "
                "per-step dataset of a demo needs one entry per step"
            )


def _demo_index(name: str) -> tuple[int, str]:
    match = re.fullmatch(r"demo_(\d+)", name)
    return (int(match.group(1)), name) if match else (1 << 62, name)


def load_demos(
    path: str | os.PathLike[str],
    *,
    obs_keys: Sequence[str] | None = None,
    filter_key: str | None = None,
    max_demos: int | None = None,
) -> DemoSet:
    """Read a demonstration file in robomimic's / LIBERO's layout.

    Args:
        path: The hdf5 file.
        obs_keys: Observation keys to read (None: all; images are large).
        filter_key: Read only the demos listed in ``mask/<filter_key>`` (robomimic's
            train/valid splits).
        max_demos: Read at most this many demos (in ``demo_<k>`` order).

    Returns:
        The episodes, ordered by ``k`` (``demo_10`` after ``demo_9``), with float32
        actions and rewards, uint8 dones, observations in their stored dtypes.

    Raises:
        FileNotFoundError: No file at ``path``.
        ValueError: No ``data`` group, a demo without ``actions`` or ``obs``, a missing
            observation key, an unknown filter key, or datasets of different lengths.
        ImportError: Without ``h5py``.
    """
    h5py = _h5py()
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no demonstration file at {path}")
    with h5py.File(path, "r") as f:
        if "data" not in f:
            raise ValueError(
                f"{path}: no 'data' group; expected robomimic's layout data/demo_<k>/..."
            )
        data = f["data"]
        if filter_key is not None:
            if "mask" not in f or filter_key not in f["mask"]:
                raise ValueError(f"{path}: no mask/{filter_key} filter key")
            names = [
                n.decode() if isinstance(n, bytes) else str(n) for n in f["mask"][filter_key][()]
            ]
        else:
            names = [n for n in data.keys() if isinstance(data[n], h5py.Group)]
        names = sorted(names, key=_demo_index)
        if max_demos is not None:
            names = names[: int(max_demos)]
        demos = []
        for name in names:
            if name not in data:
                raise ValueError(f"{path}: mask lists {name!r}, which data/ does not have")
            group = data[name]
            for required in ("actions", "obs"):
                if required not in group:
                    raise ValueError(f"{path}: data/{name} has no '{required}'")
            keys = list(group["obs"].keys()) if obs_keys is None else list(obs_keys)
            missing = [k for k in keys if k not in group["obs"]]
            if missing:
                raise ValueError(
                    f"{path}: data/{name}/obs has no {missing}; it has {sorted(group['obs'].keys())}"
                )
            actions = np.asarray(group["actions"][()], dtype=np.float32)
            n = len(actions)
            rewards = (
                np.asarray(group["rewards"][()], dtype=np.float32)
                if "rewards" in group
                else np.zeros(n, dtype=np.float32)
            )
            dones = (
                np.asarray(group["dones"][()], dtype=np.uint8)
                if "dones" in group
                else np.zeros(n, dtype=np.uint8)
            )
            extras = {
                k: np.asarray(group[k][()])
                for k in group.keys()
                if k not in ("actions", "obs", "rewards", "dones", "next_obs")
                and isinstance(group[k], h5py.Dataset)
            }
            demo = Demo(
                obs={k: np.asarray(group["obs"][k][()]) for k in keys},
                actions=actions,
                rewards=rewards,
                dones=dones,
                extras=extras,
                attrs=_read_attrs(group.attrs),
            )
            _check_lengths(f"{path}: data/{name}", demo)
            demos.append(demo)
        return DemoSet(demos=demos, attrs=_read_attrs(data.attrs), names=names)
