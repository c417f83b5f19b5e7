"""The `seed` and `options` of a vector env reset, spread over the envs of the call.

`reset_arguments` turns gymnasium's `seed` (None, an int, or one per env) and `options`
(one dict for all, with an optional `"reset_mask"`, or one per env) into one seed and one
options dict per env and a bool mask of the envs to reset.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["reset_arguments"]


def reset_arguments(
    seed: Any, options: Any, envs: slice
) -> tuple[list[Any], list[dict[str, Any] | None], np.ndarray]:
    """Per-env seeds, per-env options and the reset mask for a reset of `envs`.

    Args:
        seed: None; an int (env `i` gets `seed + i`, `i` its global index); or a sequence
            with one seed per env of the call.
        options: None; a dict for every env, whose optional `"reset_mask"` (a bool numpy
            array of shape `(n,)`, at least one True) selects the envs to reset and is
            taken out; or a sequence with one dict (or None) per env of the call.
        envs: The global env indices of the call (`n = envs.stop - envs.start`).

    Returns:
        `(seeds, options, mask)`: `n` seeds, `n` options dicts (or None), and the mask,
        bool of shape `(n,)` (all True without a `"reset_mask"`).

    Raises:
        ValueError: A seed or options sequence of the wrong length (or options that are not
            dicts), a mask of the wrong shape or without a True entry.
        TypeError: A mask that is not a bool numpy array.
    """
    n = envs.stop - envs.start
    if seed is None:
        seeds: list[Any] = [None] * n
    elif isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        seeds = [int(seed) + i for i in range(envs.start, envs.stop)]
    else:
        seeds = list(seed)
        if len(seeds) != n:
            raise ValueError(
                f"seed: a list of seeds must have one entry per env of the call ({n}), "
                f"got {len(seeds)}"
            )
    mask = np.ones(n, dtype=np.bool_)
    if options is None or isinstance(options, dict):
        env_options = dict(options) if options is not None else None
        if env_options is not None and "reset_mask" in env_options:
            mask = _check_mask(env_options.pop("reset_mask"), n)
        per_env = [env_options] * n
    else:
        per_env = list(options)
        if len(per_env) != n or not all(o is None or isinstance(o, dict) for o in per_env):
            raise ValueError(
                f"options: a list of options must hold one dict (or None) per env of the "
                f"call ({n}), got {options!r}"
            )
    return seeds, per_env, mask


def _check_mask(mask: Any, n: int) -> np.ndarray:
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"options['reset_mask']: expected a numpy array, got {type(mask)}")
    if mask.shape != (n,):
        raise ValueError(
            f"options['reset_mask']: expected shape ({n},) (one per env of the "
            f"call), got {mask.shape}"
        )
    if mask.dtype != np.bool_:
        raise TypeError(f"options['reset_mask']: expected dtype bool, got {mask.dtype}")
    if not mask.any():
        raise ValueError("options['reset_mask']: expected at least one True entry")
    return mask
