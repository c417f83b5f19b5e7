"""The envs of one worker: stepping them (serially or on the worker's threads), gymnasium's
autoreset per env, and writing their observations into the shared buffers or the answer.

A [`WorkerEnvs`][pipelined_vec_env.workers.worker_envs.WorkerEnvs] lives inside the worker
process (or Ray actor); `worker.serve_command` calls it for each command. Under
``NEXT_STEP`` autoreset an env that finished resets on its next step; under ``SAME_STEP``
it resets at once and its final observation and info go into ``{"final_obs",
"final_info"}`` (copied first when the env reuses the objects it returned), as
``SyncVectorEnv`` does.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import Env, spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import (
    batch_space,
    iterate,
    read_from_shared_memory,
)

from ..by_value import ByValue
from ..shared_memory import RowWriter
from .observation_check import observation_error, without_envs
from .protocol import StepRequest
from .step_profile import StepProfile

__all__ = ["WorkerEnvs"]

_FLAT_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def _mutable_ids(value: Any) -> frozenset[int]:
    """Ids of the numpy arrays, dicts and lists inside ``value`` (nested dicts, lists and
    tuples): what an env could write into again on its next call."""
    found: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, np.ndarray):
            found.add(id(item))
        elif isinstance(item, dict):
            found.add(id(item))
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            if isinstance(item, list):
                found.add(id(item))
            stack.extend(item)
    return frozenset(found)


def _shares_objects(value: Any, previous: frozenset[int]) -> bool:
    """Whether ``value`` holds an array, dict or list the env also returned last time."""
    return bool(previous) and not previous.isdisjoint(_mutable_ids(value))


class WorkerEnvs:
    """The envs of one worker, their stepping and their autoreset state.

    Args:
        envs: The worker's envs, built inside its process (or Ray actor).
        env_indices: Their global indices in the vector env.
        autoreset_mode: gymnasium's autoreset mode, applied per env.

    Raises:
        ValueError: An env's ``metadata["step_concurrency"]`` is not a known value
            (`StepProfile`).
    """

    def __init__(
        self, envs: list[Env], env_indices: tuple[int, ...], autoreset_mode: AutoresetMode
    ):
        self.envs = envs
        self.env_indices = env_indices
        self.autoreset_mode = autoreset_mode
        self._next_step = autoreset_mode == AutoresetMode.NEXT_STEP
        self._same_step = autoreset_mode == AutoresetMode.SAME_STEP
        self.autoreset = [False] * len(envs)  # per env: its next step resets it (NEXT_STEP)
        # SAME_STEP: ids of the arrays/dicts/lists each env returned last (reuse detection)
        self.returned: list[frozenset[int]] = [frozenset()] * len(envs)
        self.observation_space = envs[0].observation_space
        self.buffers: Any = None
        self.generations: tuple[Any, ...] = ()
        # per generation, ``write(g, obs)`` into its buffers: a row assignment of an array
        # view (Box ...) or a RowWriter's write (Dict/Tuple)
        self.writers: list[Callable[[int, Any], None]] = []
        self.action_space = envs[0].action_space
        self.action_batch_space = batch_space(self.action_space, len(envs))
        # serial or concurrent stepping (ValueError: an unknown metadata value)
        self.profile = StepProfile(envs, env_indices)

    def attach(
        self, space: Any, buffers: Any, num_envs: int, generations: tuple[Any, ...] = ()
    ) -> None:
        """Use ``buffers`` (gymnasium's shared memory layout for ``num_envs`` envs of
        ``space``) for observations; None sends them through the pipe. ``generations``
        are further buffers of the same layout that a step may name (generation ``k``
        is ``generations[k - 1]``; `observation_ring`)."""
        self.observation_space, self.buffers = space, buffers
        self.generations = generations  # held until `detach` drops the views first
        self.writers = []
        for target in (buffers, *generations) if buffers is not None else ():
            if isinstance(space, _FLAT_SPACES):
                # one array view of the whole batch: a row assignment per observation
                view = read_from_shared_memory(space, target, n=num_envs)
                self.writers.append(view.__setitem__)
            else:  # Dict/Tuple: one copy per array (gymnasium's write: two)
                self.writers.append(RowWriter(space, target, num_envs).write)

    def detach(self) -> None:
        """Drop the views of the shared buffers, then the buffers (a segment whose views
        live cannot be unmapped)."""
        self.writers = []
        self.buffers, self.generations = None, ()

    def _emit_all(
        self, done: list[tuple[int, Any]], items: list[Any], results: tuple, gen: int = 0
    ) -> None:
        """Write each ``(local, obs)`` of ``done`` (in answer order) into generation
        ``gen`` of the buffers; where an observation does not fit the buffers, write the
        others, then raise `ObservationError` naming it, with ``results`` (the answer's
        payload) less the failed envs' parts.

        Raises:
            ObservationError: An observation did not fit (`observation_check`).
        """
        failed = []
        write = None if self.buffers is None else self.writers[gen]
        for k, (local, obs) in enumerate(done):
            try:
                if write is None:
                    items.append(obs)
                else:
                    write(self.env_indices[local], obs)
            except Exception as exc:  # the failure path only: a fitting write costs nothing
                failed.append((k, self.env_indices[local], obs, exc))
        if failed:
            error = observation_error(
                self.observation_space,
                [(g, obs, exc) for _, g, obs, exc in failed],
                without_envs(results, [k for k, *_ in failed]),
            )
            raise error from failed[0][3]

    def _actions(self, actions: Any, n: int) -> Any:
        if isinstance(actions, np.ndarray):
            return actions  # rows are the envs' actions
        space = (
            self.action_batch_space if n == len(self.envs) else batch_space(self.action_space, n)
        )
        return iterate(space, actions)

    def reset(
        self, requests: list[tuple[int, Any, Any]]
    ) -> tuple[list[Any] | None, list[list[dict]]]:
        """Reset the envs of ``requests`` (``(local index, seed, options)`` each); return
        ``(obs_items, infos)``: ``obs_items`` None when the observations went into the
        buffers, ``infos[k]`` a one-dict list per env.

        Raises:
            ObservationError: An observation did not fit the buffers.
        """
        items: list[Any] = []
        infos = []
        done = []
        for local, seed, options in requests:
            obs, info = self.envs[local].reset(seed=seed, options=options)
            self.autoreset[local] = False
            if self.autoreset_mode == AutoresetMode.SAME_STEP:
                self.returned[local] = _mutable_ids((obs, info))
            done.append((local, obs))
            infos.append([info])
        # written once every env is done: a failed call leaves the shared rows as they were
        self._emit_all(done, items, (None, infos))
        return (items if self.buffers is None else None), infos

    def step(
        self, payload: StepRequest, direct: bool = False
    ) -> tuple[Any, list[float], list[bool], list[bool], list[list[dict]]]:
        """Step the envs of ``payload`` (which envs, their actions, the generation of the
        buffers to write); return ``(obs_items, rewards, terminations, truncations, infos)`` with lists (they
        pickle several times faster than small numpy arrays). With ``direct``, on the
        calling thread, not measured nor dispatched by the step profile (a
        `Command.STEP_ENV`, already on one of the worker's threads)."""
        items, rewards, terminations, truncations, infos = self.step_arrays(payload, direct)
        return items, rewards.tolist(), terminations.tolist(), truncations.tolist(), infos

    def step_arrays(
        self, payload: StepRequest, direct: bool = False
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, list[list[dict]]]:
        """As `step`, with rewards float64 and terminations/truncations bool arrays (what
        the fast path writes into its slot)."""
        local_indices, actions, generation = payload
        targets = range(len(self.envs)) if local_indices is None else local_indices
        n = len(targets)
        rewards = np.zeros(n, dtype=np.float64)
        terminations = np.zeros(n, dtype=np.bool_)
        truncations = np.zeros(n, dtype=np.bool_)
        observations: list[Any] = [None] * n
        infos: list[Any] = [None] * n
        batch = self._actions(actions, n)
        if not isinstance(batch, np.ndarray):
            batch = list(batch)
        step_one = self._step_one
        how = "plain" if direct else self.profile.route(n)
        if how == "plain":  # here, one after another: no callback per env
            for k in range(n):
                observations[k], rewards[k], terminations[k], truncations[k], infos[k] = step_one(
                    targets[k], batch[k]
                )
        else:  # measured, or on the worker's threads

            def step(k: int) -> None:  # the k-th env of the call: its own slots only
                obs, rewards[k], terminations[k], truncations[k], infos[k] = step_one(
                    targets[k], batch[k]
                )
                observations[k] = obs

            self.profile.run(step, n, how)
        items: list[Any] = []
        done = zip(targets, observations, strict=True)
        # written once every env stepped: a failed step leaves the shared rows as they were
        # (the caller's partial results show the failed envs' last observations)
        results = (None, rewards, terminations, truncations, infos)
        self._emit_all(done, items, results, generation)
        return (items if self.buffers is None else None), rewards, terminations, truncations, infos

    def _step_one(self, local: int, action: Any) -> tuple[Any, float, bool, bool, list[dict]]:
        """Step (or autoreset) env ``local``: ``(obs, reward, terminated, truncated,
        infos)``. Touches only that env's state, so envs may step on threads at once."""
        env = self.envs[local]
        if self._next_step and self.autoreset[local]:
            obs, info = env.reset()
            self.autoreset[local] = False
            return obs, 0.0, False, False, [info]
        obs, reward, terminated, truncated, info = env.step(action)
        env_infos = [info]
        self.autoreset[local] = bool(terminated) or bool(truncated)
        same_step = self._same_step
        if same_step and (terminated or truncated):
            if _shares_objects((obs, info), self.returned[local]):
                # the env reuses what it returns: its reset could overwrite the final
                # values before they are sent (Gymnasium #1132)
                obs, info = copy.deepcopy((obs, info))
            env_infos = [{"final_obs": obs, "final_info": info}]
            obs, info = env.reset()
            env_infos.append(info)
        if same_step:
            self.returned[local] = _mutable_ids((obs, info))
        return obs, reward, terminated, truncated, env_infos

    def call(self, name: str, args: tuple, kwargs: dict, local_indices: list[int] | None) -> tuple:
        """``name(*args, **kwargs)`` on each env of ``local_indices`` (None: all), through
        ``get_wrapper_attr``, or the attribute itself if not callable; a callable ``name``
        is called as ``name(env, *args, **kwargs)``. One result per env, in order."""
        results = []
        for local in range(len(self.envs)) if local_indices is None else local_indices:
            if callable(name):  # call_at(indices, fn): fn(env, *args, **kwargs)
                results.append(name(self.envs[local], *args, **kwargs))
                continue
            attr = self.envs[local].get_wrapper_attr(name)
            results.append(attr(*args, **kwargs) if callable(attr) else attr)
        return tuple(results)

    def set_attr(self, name: str, values: list[Any], local_indices: list[int] | None) -> None:
        """Set ``name`` to ``values[k]`` on the k-th env of ``local_indices`` (None: all),
        through ``set_wrapper_attr``."""
        targets = range(len(self.envs)) if local_indices is None else local_indices
        for local, value in zip(targets, values, strict=True):
            self.envs[local].set_wrapper_attr(name, value)

    def describe(self) -> dict[str, Any]:
        """What `Ready` tells the caller of these envs: each env's observation and action
        space, and the first env's metadata, render mode and spec (cloudpickled: a spec
        may hold lambdas)."""
        envs, first = self.envs, self.envs[0]
        return {
            "observation_spaces": [env.observation_space for env in envs],
            "action_spaces": [env.action_space for env in envs],
            "metadata": dict(first.metadata),
            "render_mode": first.render_mode,
            "spec": ByValue(first.spec),  # its wrappers' kwargs may be lambdas
        }

    def close(self) -> None:
        """Close every env, even after one raised; then drop them.

        Raises:
            RuntimeError: An env's ``close()`` raised (the first such env is named; its
                exception is the ``__cause__``).
        """
        failed: tuple[int, BaseException] | None = None
        self.profile.close()
        envs, self.envs = self.envs, []
        for local, env in enumerate(envs):
            try:
                env.close()
            except Exception as exc:
                if failed is None:
                    failed = (self.env_indices[local], exc)
        if failed is not None:
            index, exc = failed
            raise RuntimeError(f"env {index}: close() raised {type(exc).__name__}: {exc}") from exc
