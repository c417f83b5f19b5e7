"""``PipelinedVectorEnv``: a gymnasium VectorEnv over staged subprocess workers."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium import Env, Space
from gymnasium.error import ClosedEnvironmentError, NoAsyncCallError
from gymnasium.spaces.utils import is_space_dtype_shape_equiv
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import (
    batch_differing_spaces,
    batch_space,
)

from .batching import check_actions, to_numpy
from .decoupled import DecoupledState
from .errors import WaitTimeoutError
from .observations import ObservationStore
from .pool import WorkerPool
from .profiling import Profiler
from .stage_stepping import CallInFlight, StageStepping
from .stages import Stage, check_startable, split_range, wait_any_stage
from .transport import WorkerTransport

__all__ = ["PipelinedVectorEnv"]

logger = logging.getLogger(__name__)


class PipelinedVectorEnv(VectorEnv):
    """A gymnasium ``VectorEnv`` whose envs live in subprocess workers grouped into stages.

    Each stage has its own ``step_async(actions, stage)`` / ``step_wait(stage)``, so a
    policy can infer on one stage while the simulators of the others step. With
    ``stage=None`` (the default) every method behaves like gymnasium's vector envs, so code
    that knows nothing of stages works unchanged and gets results identical to
    `gymnasium.vector.SyncVectorEnv`.

    Envs split into stages like ``np.array_split`` (contiguous, sizes differ by at most
    one); each stage's envs split the same way over ``ceil(stage_size / envs_per_worker)``
    worker processes. Observations go through shared memory where the space allows
    (gymnasium's layout), through the pipe otherwise; infos travel through the pipe.

    Examples:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> from pipelined_vec_env import PipelinedVectorEnv
        >>> envs = PipelinedVectorEnv(
        ...     [lambda: gym.make("CartPole-v1") for _ in range(4)], num_stages=2
        ... )
        >>> obs, info = envs.reset(seed=0)
        >>> obs.shape, envs.stage_slices
        ((4, 4), (slice(0, 2, None), slice(2, 4, None)))
        >>> envs.step_async(np.zeros(2, dtype=np.int64), stage=0)
        >>> obs0, rew0, term0, trunc0, info0 = envs.step_wait(stage=0)
        >>> obs0.shape
        (2, 4)
        >>> envs.close()

    Args:
        env_fns: One constructor per env; each is cloudpickled and called inside its worker
            (lambdas and closures work).
        num_stages: Number of pipeline stages, in ``[1, num_envs]``.
        envs_per_worker: Envs per worker process (amortises one message over several env
            steps). Workers per stage: ``ceil(stage_size / envs_per_worker)``.
        context: ``multiprocessing`` start method name or context. Default ``"forkserver"``
            on Linux, else ``"spawn"``. ``"fork"`` works when chosen (restarts included,
            no shared memory leaked), but many simulators and CUDA do not survive a fork
            of a process that already uses them.
        shared_memory: Put observations in shared memory when the space allows it.
        copy: Return copies of the observations (else views into buffers that the next
            call overwrites).
        autoreset_mode: gymnasium's `gymnasium.vector.AutoresetMode` (or its
            string value), applied inside the workers.
        observation_mode: ``"same"``, ``"different"`` (envs whose observation spaces
            differ in bounds but share shape and dtype) or a tuple ``(batched_space,
            single_space)``, as for ``SyncVectorEnv``.
        cpu_affinity: None; ``"auto"`` (worker k pinned to the k-th allowed core, round
            robin); or one core set per worker. Applied from inside each worker with
            ``os.sched_setaffinity`` (Linux; elsewhere a warning).
        worker_threads: Cap on OpenMP/BLAS/torch threads inside each worker (default 1,
            so simulators do not oversubscribe cores); None leaves them alone.
        worker_nice: Nice value of every worker process (absolute, in ``[-20, 19]``; POSIX
            ``setpriority``), or ``"idle"`` (Linux ``SCHED_IDLE``: a worker runs only when
            no normal task wants its core, and a waking caller preempts it at once); set
            inside the worker before its envs are built, at start-up and at every
            restart; None (the default) inherits the caller's. Measured on issue 14's
            overlap workload (4 ms CPU-bound steps, a policy sleeping 2 ms per
            observation, 4 envs, 4 stages, 2 cores, Linux 6.18 EEVDF, idle machine),
            workers at nice 10 or 19 reached 0.70-0.71 of the ideal rate, like None
            (0.71), while ``"idle"`` reached 0.85: a nice value changes CPU shares, not
            how fast a waking caller gets a busy core. On a machine shared with other
            work, ``"idle"`` workers get only the CPU nothing else wants (0.34 there
            against 0.47 for None), hence the default None
            (``docs/benchmarks_rollout.md``). A value below the caller's needs the
            privilege to raise priority (else the constructor raises `PermissionError`).
        daemon: Start workers as daemon processes (they cannot start processes of their
            own). Set False for envs that spawn subprocesses.
        max_restarts: Restarts allowed per worker (0: a failed worker raises). A worker
            that dies, overruns ``step_deadline`` or raises during ``step``/``reset`` is
            rebuilt from its env fns and its envs reset; their episodes end with
            ``truncated=True`` and ``info["worker_restarted"]=True``; past the bound the
            failure is raised ([`WorkerCrashedError`][pipelined_vec_env.errors.WorkerCrashedError] for a dead worker).
        step_deadline: Seconds a worker may take to answer a ``step``/``reset`` (counted
            from the send; in decoupled stepping from when the worker could start the
            command); a worker past it is killed and handled as a crash (restart or
            error). Unlike ``timeout=``, which only stops waiting.
        backend: ``"multiprocessing"`` (workers are subprocesses of this process) or
            ``"ray"`` (workers are Ray actors, on any node of a Ray cluster; needs the
            ``ray`` extra). With Ray, observations go through Ray's object store
            (``shared_memory`` is ignored) and ``context``, ``cpu_affinity`` and
            ``daemon`` do not apply. See ``docs/ray.md``.
        start_timeout: Seconds each worker may take to start and build its envs (Ray:
            actor creation and placement included), at construction and at every rebuild
            (restart, or a reset of a dead worker's envs). Workers start in parallel. A
            worker past it is killed: the constructor then stops every worker and raises
            `WaitTimeoutError` (a `TimeoutError`); a rebuild past it counts as a failed
            restart.
        ray_options: With ``backend="ray"``: a dict or
            `RayOptions` (per-worker ``num_cpus``,
            ``num_gpus``, ``resources``, ``placement_group``/``bundle_indices`` or
            ``node_ids``, ``address`` ...). Must be None otherwise.
        profile: Record every worker command (sent, started and finished in the worker,
            received), each stage's calls in flight, the caller's waits, restarts and
            deadline kills in ``envs.profiler`` (a `Profiler`: Chrome trace, timeline
            PNG, summary with the bottleneck; see ``docs/profiling.md``). Off,
            ``envs.profiler`` still exists: ``span()`` does nothing and its exports raise.
        info_layout: How `reset`/`step` (staged and whole-env) return infos:
            `"batched"`, gymnasium's dict of arrays with `"_key"` masks; or `"per_env"`,
            a list with one dict per env of the call exactly as the env wrote it (values,
            types and shapes untouched; under `SAME_STEP` an env whose episode ended has
            `"final_obs"`, `"final_info"` and its reset info's keys). The SB3 adapter
            uses `"per_env"`. Decoupled `recv` always batches. A public attribute; it may
            be changed between calls.
        fast_path: Step subprocess workers through shared-memory slots (actions in,
            rewards, flags and scalar infos out, a one-byte wake-up through the pipe)
            where the action space has a fixed array layout and the actions are a numpy
            array of its dtype; False pickles every step (the results are the same). See
            ``docs/wire_format.md``.

    Attributes:
        decoupled: The bookkeeping of decoupled stepping (`async_reset`/`recv`/`send`), a
            `DecoupledState`; the inference channel waits through it
            (`DecoupledState.wait`, `DecoupledState.has_results`). Not part of the
            gymnasium contract.

    Raises:
        ValueError: Bad arguments (checked before any worker starts).
        RuntimeError: Sub-env spaces that do not match as ``observation_mode`` requires.
        WaitTimeoutError: A worker did not start within ``start_timeout`` seconds (every
            worker is stopped first).
        Exception: An error raised by an env constructor is re-raised with its type
            (an env id the workers do not know even after loading the caller's main
            script: gymnasium's `UnregisteredEnv` subclass).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Env]],
        *,
        num_stages: int = 1,
        envs_per_worker: int = 1,
        context: str | Any | None = None,
        shared_memory: bool = True,
        copy: bool = True,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        observation_mode: str | tuple[Space, Space] = "same",
        cpu_affinity: str | Sequence[Sequence[int]] | None = None,
        worker_threads: int | None = 1,
        worker_nice: int | str | None = None,
        daemon: bool = True,
        max_restarts: int = 0,
        step_deadline: float | None = None,
        backend: str = "multiprocessing",
        ray_options: Any = None,
        start_timeout: float = 300.0,
        profile: bool = False,
        info_layout: str = "batched",
        fast_path: bool = True,
    ) -> None:
        self.closed = True  # until the workers are up, close() has nothing to do
        self.profiler = Profiler(enabled=bool(profile))
        self._pool = WorkerPool(
            start_timeout=300.0, step_deadline=None, max_restarts=0, profiler=None
        )
        self._obs: ObservationStore | None = None
        env_fns = list(env_fns)
        if not env_fns or not all(callable(fn) for fn in env_fns):
            raise ValueError("env_fns: expected a non-empty sequence of callables returning envs")
        num_envs = len(env_fns)
        if not isinstance(num_stages, (int, np.integer)) or not 1 <= num_stages <= num_envs:
            raise ValueError(f"num_stages: expected an int in [1, {num_envs}], got {num_stages!r}")
        if not isinstance(envs_per_worker, (int, np.integer)) or envs_per_worker < 1:
            raise ValueError(f"envs_per_worker: expected an int >= 1, got {envs_per_worker!r}")
        if not isinstance(max_restarts, (int, np.integer)) or max_restarts < 0:
            raise ValueError(f"max_restarts: expected an int >= 0, got {max_restarts!r}")
        if step_deadline is not None and not step_deadline > 0:
            raise ValueError(f"step_deadline: expected None or seconds > 0, got {step_deadline!r}")
        if (
            isinstance(start_timeout, bool)
            or not isinstance(start_timeout, (int, float, np.integer, np.floating))
            or not 0 < start_timeout < float("inf")
        ):
            raise ValueError(f"start_timeout: expected finite seconds > 0, got {start_timeout!r}")
        if worker_threads is not None and (
            not isinstance(worker_threads, int) or worker_threads < 1
        ):
            raise ValueError(
                f"worker_threads: expected None or an int >= 1, got {worker_threads!r}"
            )
        if (
            worker_nice is not None
            and worker_nice != "idle"
            and (
                isinstance(worker_nice, bool)
                or not isinstance(worker_nice, (int, np.integer))
                or not -20 <= worker_nice <= 19
            )
        ):
            raise ValueError(
                f"worker_nice: expected None, 'idle' or an int in [-20, 19], got {worker_nice!r}"
            )
        if info_layout not in ("batched", "per_env"):
            raise ValueError(f"info_layout: expected 'batched' or 'per_env', got {info_layout!r}")
        if backend not in ("multiprocessing", "ray"):
            raise ValueError(f"backend: expected 'multiprocessing' or 'ray', got {backend!r}")
        if backend != "ray" and ray_options is not None:
            raise ValueError("ray_options: only used with backend='ray'")
        if backend == "ray" and cpu_affinity is not None:
            raise ValueError(
                "cpu_affinity: not available with backend='ray' (Ray places the actors; "
                "reserve CPUs with ray_options num_cpus)"
            )
        if not (
            observation_mode in ("same", "different")
            or (isinstance(observation_mode, tuple) and len(observation_mode) == 2)
        ):
            raise ValueError(
                "observation_mode: expected 'same', 'different' or a tuple "
                f"(batched_space, single_space), got {observation_mode!r}"
            )
        self.autoreset_mode = (
            autoreset_mode
            if isinstance(autoreset_mode, AutoresetMode)
            else AutoresetMode(autoreset_mode)
        )
        self.env_fns = env_fns
        self.num_envs = num_envs
        self.num_stages = int(num_stages)
        self.envs_per_worker = int(envs_per_worker)
        self.copy = copy
        self.observation_mode = observation_mode
        self.backend = backend
        # envs may live on other machines: observations travel through Ray's object store
        self.shared_memory = shared_memory and backend == "multiprocessing"
        shared_memory = self.shared_memory
        self.max_restarts = int(max_restarts)
        self.step_deadline = step_deadline
        self.start_timeout = float(start_timeout)
        self.info_layout = info_layout
        self.worker_nice = worker_nice if worker_nice in (None, "idle") else int(worker_nice)

        # layout: stages, then workers within each stage
        layout: list[tuple[int, list[tuple[int, int]]]] = []
        for s, (lo, hi) in enumerate(split_range(0, num_envs, self.num_stages)):
            n_workers = -(-(hi - lo) // self.envs_per_worker)
            layout.append((s, split_range(lo, hi, n_workers)))
        self.cpu_affinity = cpu_affinity
        self.stage_slices: tuple[slice, ...] = tuple(slice(w[0][0], w[-1][1]) for _, w in layout)
        self._pool = WorkerPool(
            start_timeout=self.start_timeout,
            step_deadline=step_deadline,
            max_restarts=self.max_restarts,
            profiler=self.profiler if profile else None,
        )
        self.closed = False
        try:
            self._pool.spawn(
                layout,
                env_fns,
                backend=backend,
                context=context,
                cpu_affinity=cpu_affinity,
                worker_threads=worker_threads,
                daemon=daemon,
                autoreset_mode=self.autoreset_mode,
                ray_options=ray_options,
                fast_path=bool(fast_path),
                worker_nice=self.worker_nice,
            )
            self.context = self._pool.context
            self._setup_spaces(self._pool.start())
        except BaseException:
            self.close(terminate=True)
            raise

        self.stages: tuple[Stage, ...] = tuple(
            Stage(
                s,
                self.stage_slices[s],
                [h for h in self._pool.handles if h.stage == s],
                profiler=self.profiler if profile else None,
            )
            for s in range(self.num_stages)
        )
        self._obs = ObservationStore(self.single_observation_space, num_envs, shared_memory)
        self._pool.attach(self.single_observation_space, self._obs.buffers, num_envs)
        self.decoupled = DecoupledState(self, self._pool, self._obs)
        self._stepping = StageStepping(
            self.stages,
            self._pool,
            self._obs,
            self.decoupled,
            num_envs=num_envs,
            autoreset_mode=self.autoreset_mode,
            max_restarts=self.max_restarts,
        )
        self._pending_call: CallInFlight | None = None  # a call started by call_async

    # ------------------------------------------------------------------ set-up

    def _setup_spaces(self, descriptions: list[dict[str, Any]]) -> None:
        obs_spaces = [s for d in descriptions for s in d["observation_spaces"]]
        act_spaces = [s for d in descriptions for s in d["action_spaces"]]
        first = descriptions[0]
        self.metadata = dict(first["metadata"])
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.render_mode = first["render_mode"]
        self.env_spec = first["spec"]
        self.single_action_space = act_spaces[0]
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        mode = self.observation_mode
        if isinstance(mode, tuple):
            self.observation_space, self.single_observation_space = mode
        elif mode == "same":
            self.single_observation_space = obs_spaces[0]
            self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        else:
            self.single_observation_space = obs_spaces[0]
            self.observation_space = batch_differing_spaces(obs_spaces)
        for i, (obs_space, act_space) in enumerate(zip(obs_spaces, act_spaces, strict=False)):
            if mode == "same" and obs_space != self.single_observation_space:
                raise RuntimeError(
                    f"observation_mode='same' but env {i}'s observation space {obs_space} "
                    f"differs from env 0's {self.single_observation_space}; use "
                    "observation_mode='different' if this is intended"
                )
            if mode != "same" and not is_space_dtype_shape_equiv(
                obs_space, self.single_observation_space
            ):
                raise RuntimeError(
                    f"env {i}'s observation space {obs_space} does not share shape and dtype "
                    f"with {self.single_observation_space}"
                )
            if act_space != self.single_action_space:
                raise RuntimeError(
                    f"env {i}'s action space {act_space} differs from env 0's "
                    f"{self.single_action_space}"
                )

    # ------------------------------------------------------------------ helpers

    def _select(self, stage: int | None) -> tuple[list[Stage], slice]:
        if stage is None:
            return list(self.stages), slice(0, self.num_envs)
        if (
            isinstance(stage, bool)
            or not isinstance(stage, (int, np.integer))
            or not (0 <= stage < self.num_stages)
        ):
            raise ValueError(
                f"stage: expected None or an int in [0, {self.num_stages}), got {stage!r}"
            )
        return [self.stages[stage]], self.stage_slices[stage]

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedEnvironmentError(
                f"Trying to operate on {type(self).__name__} after a call to close()"
            )

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        """Each env's `np_random_seed`, in env order (as gymnasium's `AsyncVectorEnv`).

        After `reset(seed=42)` on 4 envs: `(42, 43, 44, 45)`. Every stage must be idle.
        """
        return self.get_attr("np_random_seed")

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        """Copies of each env's `np_random` generator, in env order (as gymnasium's
        `AsyncVectorEnv`: the generators live in the workers)."""
        return self.get_attr("np_random")

    @property
    def restart_counts(self) -> tuple[int, ...]:
        """Restarts so far, per worker."""
        return tuple(w.restarts for w in self._pool.handles)

    @property
    def _handles(self) -> list[WorkerTransport]:
        """The worker handles (the pool's), for tests and benchmarks that inspect them."""
        return self._pool.handles

    @property
    def _shm_arrays(self) -> list[Any]:
        """The shared memory segments of the observations, for tests that check their
        release."""
        return [] if self._obs is None else self._obs.segments

    # ------------------------------------------------------------------ reset

    def _reset_arguments(
        self, seed: Any, options: Any, envs: slice
    ) -> tuple[list[Any], list[dict[str, Any] | None], np.ndarray]:
        """Per-env seeds, per-env options and the reset mask for a reset of ``envs``.

        Raises:
            ValueError / TypeError: Bad ``seed`` or ``options`` (see [`reset_async`][pipelined_vec_env.PipelinedVectorEnv.reset_async]).
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
                mask = env_options.pop("reset_mask")
                if not isinstance(mask, np.ndarray):
                    raise TypeError(
                        f"options['reset_mask']: expected a numpy array, got {type(mask)}"
                    )
                if mask.shape != (n,):
                    raise ValueError(
                        f"options['reset_mask']: expected shape ({n},) (one per env of the "
                        f"call), got {mask.shape}"
                    )
                if mask.dtype != np.bool_:
                    raise TypeError(f"options['reset_mask']: expected dtype bool, got {mask.dtype}")
                if not mask.any():
                    raise ValueError("options['reset_mask']: expected at least one True entry")
            per_env = [env_options] * n
        else:
            per_env = list(options)
            if len(per_env) != n or not all(o is None or isinstance(o, dict) for o in per_env):
                raise ValueError(
                    f"options: a list of options must hold one dict (or None) per env of the "
                    f"call ({n}), got {options!r}"
                )
        return seeds, per_env, mask

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every env (all stages); see [`reset_async`][pipelined_vec_env.PipelinedVectorEnv.reset_async] for ``seed``/``options``.

        Returns:
            ``(observations, infos)`` batched over all ``num_envs`` envs.
        """
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    def reset_async(
        self,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
        stage: int | None = None,
    ) -> None:
        """Start resetting one stage's envs (or all envs with ``stage=None``).

        Args:
            seed: None; an int ``seed`` (env ``i`` gets ``seed + i``, ``i`` its *global*
                index whatever the stage); or a list with one seed per env of the call.
            options: A dict passed to every env, whose optional ``"reset_mask"`` (bool
                array, one entry per env of the call) selects the envs to reset; or a
                list with one options dict per env of the call (for example one init
                state per env).
            stage: The stage to reset, or None for all stages (every stage must be idle).

        Raises:
            ValueError / TypeError: Bad ``seed``, ``options`` or ``stage`` (before any
                worker is touched).
            AlreadyPendingCallError: A selected stage has a call in flight.
            WorkerCrashedError: A worker of the call was found dead and the reset leaves
                out some of its envs. A reset covering all of a dead worker's envs
                rebuilds it first (a fresh process; this blocks for its start-up and
                does not count against ``max_restarts``).
        """
        self._check_open()
        stages, envs = self._select(stage)
        seeds, per_env, mask = self._reset_arguments(seed, options, envs)
        check_startable(stages, "reset", stage is None)
        self.decoupled.check_free(envs, "reset")
        self._stepping.send_reset(stages, envs, seeds, per_env, mask, stage is None)

    def reset_wait(
        self, stage: int | None = None, timeout: float | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Wait for the reset started by [`reset_async`][pipelined_vec_env.PipelinedVectorEnv.reset_async] with the same ``stage``.

        Args:
            stage: The stage, or None for a whole-env reset.
            timeout: Seconds to wait; None waits as long as the workers are alive.

        Returns:
            ``(observations, infos)`` for the stage's envs (all envs with ``stage=None``).
            Envs left out by a ``reset_mask`` keep their last observation.

        Raises:
            NoAsyncCallError: No matching reset in flight.
            WaitTimeoutError: Timed out; the reset stays in flight.
            WorkerCrashedError / the worker's exception: A worker failed; that stage is
                marked failed, the other stages are unaffected. The exception carries
                ``partial_results`` ``(obs, rewards, terminations, truncations, infos)``
                (rewards 0, flags False) and ``partial_mask``, as for `step_wait`.
        """
        self._check_open()
        stages, envs = self._select(stage)
        return self._stepping.collect_reset(
            stages, envs, stage is None, timeout, info_layout=self.info_layout, copy=self.copy
        )

    # ------------------------------------------------------------------ step

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env (all stages) with ``actions`` batched over ``num_envs``."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any, stage: int | None = None) -> None:
        """Send actions to one stage's envs (or all envs with ``stage=None``) and return.

        Args:
            actions: A batch for the stage's envs only (all envs with ``stage=None``) in
                gymnasium's batched layout of ``single_action_space``: numpy arrays or
                torch tensors (CPU or CUDA).
            stage: The stage, or None for all stages (every stage must be idle).

        Raises:
            ValueError: Wrong shape, dtype or out-of-space values, naming the expected
                shape (before any worker is touched). The envs get the caller's values
                and dtype; nothing is cast.
            TypeError: A scalar where a batch is expected; a space's `contains` raised
                TypeError (named).
            gymnasium.error.ClosedEnvironmentError: The env is closed.
            AlreadyPendingCallError: The stage has a call in flight.
            StageFailedError: The stage failed earlier and was not reset.
        """
        self._check_open()
        stages, envs = self._select(stage)
        check_startable(stages, "step", stage is None)
        self.decoupled.check_free(envs, "step")
        space = self.single_action_space
        batch = check_actions(space, to_numpy(actions), envs.stop - envs.start)
        self._stepping.send_step(stages, envs, batch, space, stage is None)

    def step_wait(
        self, stage: int | None = None, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Wait for the step started by [`step_async`][pipelined_vec_env.PipelinedVectorEnv.step_async] with the same ``stage``.

        Args:
            stage: The stage, or None for a whole-env step.
            timeout: Seconds to wait; None waits as long as the workers are alive (a dead
                worker is noticed at once).

        Returns:
            ``(observations, rewards, terminations, truncations, infos)`` for the stage's
            envs: rewards float64, terminations/truncations bool, each of shape
            ``(stage_size,)``; infos merged as gymnasium does (a list of per-env
            dicts with ``info_layout="per_env"``).

        Raises:
            NoAsyncCallError: No matching step in flight.
            WaitTimeoutError: Timed out; the step stays in flight.
            WorkerCrashedError / the worker's exception: A worker failed; its stage is
                marked failed until reset, other stages are unaffected. The exception
                carries ``partial_results`` (this call's 5-tuple, the healthy workers'
                results included) and ``partial_mask`` (bool per env of the call, True
                where the results are real); see docs/errors.md.
        """
        self._check_open()
        stages, envs = self._select(stage)
        return self._stepping.collect_step(
            stages, envs, stage is None, timeout, info_layout=self.info_layout, copy=self.copy
        )

    def wait_any(self, timeout: float | None = None) -> int:
        """Block until some stage's call in flight has completed and return that stage.

        Use it to serve whichever stage finishes first:

            s = envs.wait_any()
            obs, rew, term, trunc, info = envs.step_wait(stage=s)

        The call stays in flight until collected with the matching wait. Among completed
        stages the lowest index is returned.

        Raises:
            NoAsyncCallError: No stage has a call in flight.
            WaitTimeoutError: No stage completed within ``timeout`` seconds.
        """
        self._check_open()
        return wait_any_stage(list(self.stages), self._pool, timeout)

    # ------------------------------------------------------------------ decoupled

    def async_reset(
        self,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
    ) -> None:
        """Start resetting every env for decoupled stepping (EnvPool's ``async_reset``).

        Afterwards, [`recv`][pipelined_vec_env.PipelinedVectorEnv.recv] returns the results of whichever envs are ready and
        [`send`][pipelined_vec_env.PipelinedVectorEnv.send] steps any subset of the received envs; every env advances at its own
        pace. ``seed`` and ``options`` work as in [`reset_async`][pipelined_vec_env.PipelinedVectorEnv.reset_async] (``reset_mask`` is
        not supported here). Autoreset follows ``autoreset_mode``.

        Raises:
            RuntimeError: A stage has a call in flight, or envs are still in flight from
                an earlier ``send``.
        """
        self._check_open()
        self.decoupled.check_can_reset()
        everything = slice(0, self.num_envs)
        seeds, per_env, mask = self._reset_arguments(seed, options, everything)
        if not mask.all():
            raise ValueError("async_reset: options['reset_mask'] is not supported; reset all envs")
        self._stepping.revive_dead(list(self.stages), mask, everything)
        self.decoupled.async_reset(seeds, per_env)

    def recv(
        self, batch_size: int | None = None, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Return the results of at least ``batch_size`` envs (None: whatever is ready, at
        least one), waiting if needed.

        Returns:
            ``(observations, rewards, terminations, truncations, infos)`` batched over the
            returned envs, in arrival order; ``infos["env_id"]`` (int64) holds their global
            ids. A reset's result has reward 0 and no termination. Counts are in envs.

        Raises:
            NoAsyncCallError: No [`async_reset`][pipelined_vec_env.PipelinedVectorEnv.async_reset] first.
            ValueError: ``batch_size`` larger than the envs in flight.
            WaitTimeoutError: Fewer than ``batch_size`` results within ``timeout``
                seconds; what arrived stays queued for the next ``recv``.
            WorkerCrashedError / the worker's exception: A worker failed (past
                ``max_restarts``); its envs leave the decoupled flow (reset them), the
                others go on. Within the bound the worker is rebuilt here instead: its
                envs whose step was lost are returned with ``truncated=True`` and
                ``info["worker_restarted"]``; a sibling not in flight gets that result
                from its next [`send`][pipelined_vec_env.PipelinedVectorEnv.send] (docs/fault_tolerance.md).
        """
        self._check_open()
        return self.decoupled.recv(batch_size, timeout)

    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray) -> None:
        """Send actions to envs returned by [`recv`][pipelined_vec_env.PipelinedVectorEnv.recv] and not yet sent (any subset).

        Args:
            actions: A batch with one action per id, in gymnasium's batched layout (numpy
                or torch).
            env_ids: Global env ids, as in ``infos["env_id"]``.

        Raises:
            ValueError: Unknown, duplicate or not-received ids, or bad actions (before any
                worker is touched).
        """
        self._check_open()
        self.decoupled.send(actions, env_ids)

    # ------------------------------------------------------------------ calls

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call ``name`` on every env (its value if it is not callable), like gymnasium.

        Every stage must be idle.

        Returns:
            One result per env, in env order.
        """
        return self.call_at(None, name, *args, **kwargs)

    def call_at(
        self,
        env_indices: Sequence[int] | None,
        name: str | Callable[..., Any],
        *args: Any,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Like [`call`][pipelined_vec_env.PipelinedVectorEnv.call] but only on the envs ``env_indices`` (global; None: all).

        ``name`` may also be a picklable function, called in the worker as
        ``name(env, *args, **kwargs)`` with the (wrapped) env, e.g. to check its wrappers.
        The stages holding those envs must be idle; other stages may be busy.

        Returns:
            One result per selected env, in the order of ``env_indices``.
        """
        self._check_open()
        self._pending_call = self._stepping.start_call(env_indices, name, args, kwargs)
        return self.call_wait()

    def call_async(self, name: str | Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Start calling ``name`` on every env and return (gymnasium ``AsyncVectorEnv``'s
        ``call_async``); collect the results with [`call_wait`][pipelined_vec_env.PipelinedVectorEnv.call_wait].

        Raises:
            AlreadyPendingCallError: A stage has a call in flight.
        """
        self._check_open()
        self._pending_call = self._stepping.start_call(None, name, args, kwargs)

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Wait for the call started by [`call_async`][pipelined_vec_env.PipelinedVectorEnv.call_async].

        Args:
            timeout: Seconds to wait; None waits as long as the workers are alive (a dead
                worker is noticed at once).

        Returns:
            One result per env, in env order.

        Raises:
            NoAsyncCallError: No call in flight.
            WaitTimeoutError: Timed out; the call stays in flight and a later
                ``call_wait`` returns its results.
            The env's exception / WorkerCrashedError: A worker failed (the call ends).
        """
        self._check_open()
        if self._pending_call is None:
            raise NoAsyncCallError("call_wait without a prior call_async", "call")
        try:
            result = self._stepping.gather(self._pending_call, timeout)
        except WaitTimeoutError:
            raise
        except BaseException:
            self._pending_call = None
            raise
        self._pending_call = None
        return result

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Get attribute ``name`` of every env (through wrappers), like gymnasium."""
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute ``name`` on every env.

        Args:
            name: Attribute name (set through wrappers with ``set_wrapper_attr``).
            values: A list or tuple with one value per env, or one value for all.

        Raises:
            ValueError: A list/tuple whose length is not ``num_envs``.
        """
        self.set_attr_at(None, name, values)

    def set_attr_at(self, env_indices: Sequence[int] | None, name: str, values: Any) -> None:
        """Like [`set_attr`][pipelined_vec_env.PipelinedVectorEnv.set_attr] but only on the envs ``env_indices`` (global; None: all)."""
        self._check_open()
        count = self.num_envs if env_indices is None else len(env_indices)
        if not isinstance(values, (list, tuple)):
            values = [values] * count
        if len(values) != count:
            raise ValueError(
                f"values: expected one value per env ({count}) or a single value, got {len(values)}"
            )
        self._stepping.gather(self._stepping.start_set_attr(env_indices, name, values))

    def render(self) -> tuple[Any, ...]:
        """Return one rendered frame per env (``render_mode`` set at env construction)."""
        return self.call("render")

    # ------------------------------------------------------------------ close

    def close_extras(
        self, timeout: float | None = None, terminate: bool = False, **kwargs: Any
    ) -> None:
        """Stop every worker and release shared memory. Always returns.

        All workers are stopped in parallel: each is asked to close its envs, and answers
        nobody read are drained meanwhile; those still alive after ``timeout`` seconds in
        all are terminated, then killed.

        Args:
            timeout: Seconds for all workers together to close their envs before the ones
                left are terminated (default 5).
            terminate: Terminate the workers at once instead of asking them to close.
        """
        grace = 0.0 if terminate else (5.0 if timeout is None else timeout)
        self._pool.close(grace)
        if self._obs is not None:
            self._obs.release()

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            try:
                self.close(terminate=True)
            except Exception:
                pass

    def __repr__(self) -> str:
        return (
            f"PipelinedVectorEnv(num_envs={getattr(self, 'num_envs', '?')}, "
            f"num_stages={getattr(self, 'num_stages', '?')}, "
            f"envs_per_worker={getattr(self, 'envs_per_worker', '?')})"
        )
