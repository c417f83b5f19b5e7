"""``PipelinedVectorEnv``: a gymnasium VectorEnv over staged subprocess workers."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium import Env, Space
from gymnasium.error import ClosedEnvironmentError
from gymnasium.vector import AutoresetMode, VectorEnv

from .arguments import ArgumentField, check_arguments
from .batching import check_actions, to_numpy
from .calls import EnvCalls
from .env_spaces import EnvSpaces, spaces_from_descriptions
from .observations import ObservationStore
from .profiling.profiler import Profiler
from .reset_arguments import reset_arguments
from .stepping.decoupled import DecoupledState
from .stepping.decoupled_guards import check_free
from .stepping.decoupled_methods import DecoupledMethods
from .stepping.stage_stepping import StageStepping
from .stepping.stages import Stage, check_startable, wait_any_stage
from .workers.pool import WorkerPool
from .workers.render_devices import check_render_devices, resolve_render_devices
from .workers.transport import WorkerTransport

__all__ = ["PipelinedVectorEnv"]

logger = logging.getLogger(__name__)


class PipelinedVectorEnv(EnvCalls, DecoupledMethods, VectorEnv):
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
            steps). Workers per stage: ``ceil(stage_size / envs_per_worker)``. Default
            None: about one worker per usable core in each stage (the affinity mask;
            never more workers than envs), see `default_envs_per_worker`. Fuller workers mean a crash ends the episodes of
            more envs and each process holds more envs in memory; ``1`` isolates every
            env in its own process. An int means exactly that many.
        context: ``multiprocessing`` start method name or context. Default ``"forkserver"``
            on Linux, else ``"spawn"``. ``"fork"`` works when chosen (restarts included,
            no shared memory leaked), but many simulators and CUDA do not survive a fork
            of a process that already uses them.
        shared_memory: Put observations in shared memory when the space allows it.
        shm_fallback: Where the observation buffers do not fit in the free space of
            /dev/shm (Docker's and Kubernetes' default is 64 MiB), which would end in a
            SIGBUS at the first write: ``"file"`` (default) puts them in file-backed
            mappings in a temporary directory, with one `SharedMemoryFallbackWarning`
            naming the bytes needed and free and how to grow /dev/shm; ``"error"`` raises
            `SharedMemoryFullError` (an `OSError`) from the constructor instead. See
            ``docs/frames.md``.
        copy: Return observations the caller owns, which no later step changes. For
            large ones (camera frames: batches of 256 KiB and more) in shared memory,
            ``step`` returns views of a generation of the buffers that nothing the caller
            still holds refers to (two more generations, where they fit in /dev/shm;
            numpy's reference counts say which are free), so nothing is copied; where
            every generation is held it copies each worker's rows out of shared memory as
            that worker answers, while the others still step. False returns views of the
            shared buffers (`shared_observations`) and copies nothing: env ``g``'s rows
            are overwritten once a command to ``g`` is sent (the next
            ``step_async``/``step``/``reset`` that includes it), so read or copy them
            before. ``recv`` always returns copies.
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
            restart; None (the default) inherits the caller's. Measured on the overlap
            benchmark's workload (4 ms CPU-bound steps, a policy sleeping 2 ms per
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
        render_devices: CUDA ids (as torch sees them, after ``CUDA_VISIBLE_DEVICES``) for
            headless EGL rendering, handed out round-robin: worker ``i`` renders on CUDA
            device ``render_devices[i % len(render_devices)]``; ``"auto"``: every CUDA
            device the caller sees. Each worker finds the EGL device that is that CUDA
            device (``EGL_CUDA_DEVICE_NV``; EGL numbers devices its own way) and sets
            ``MUJOCO_EGL_DEVICE_ID`` (and ``EGL_DEVICE_ID``) to its EGL index
            (``MUJOCO_GL`` and ``PYOPENGL_PLATFORM`` default to ``"egl"``) before its envs
            are built; where it cannot map, it logs so once and sets the CUDA id itself.
            None leaves the environment alone. Raises ValueError for anything but None,
            ``"auto"`` or a non-empty sequence of ints >= 0. See ``docs/frames.md``.

    Attributes:
        arguments: The checked constructor arguments, a `VectorEnvArguments`; its fields
            (``num_stages``, ``envs_per_worker`` as resolved, ``stage_slices``,
            ``step_deadline`` ...) also read as attributes of the vector env.
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

    env_fns = ArgumentField()
    num_stages = ArgumentField()
    envs_per_worker = ArgumentField()
    observation_mode = ArgumentField()
    backend = ArgumentField()
    shared_memory = ArgumentField()
    shm_fallback = ArgumentField()
    max_restarts = ArgumentField()
    step_deadline = ArgumentField()
    start_timeout = ArgumentField()
    worker_nice = ArgumentField()
    cpu_affinity = ArgumentField()
    stage_slices = ArgumentField()

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Env]],
        *,
        num_stages: int = 1,
        envs_per_worker: int | None = None,
        context: str | Any | None = None,
        shared_memory: bool = True,
        shm_fallback: str = "file",
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
        render_devices: Sequence[int] | str | None = None,
    ) -> None:
        self.closed = True  # until the workers are up, close() has nothing to do
        self.profiler = Profiler(enabled=bool(profile))
        self._pool = WorkerPool(
            start_timeout=300.0, step_deadline=None, max_restarts=0, profiler=None
        )
        self._obs: ObservationStore | None = None
        self._checked_space: Space | None = None  # step_async's action check, per space
        self._check_actions: Callable[..., Any] = check_actions
        args = check_arguments(
            env_fns,
            num_stages=num_stages,
            envs_per_worker=envs_per_worker,
            max_restarts=max_restarts,
            step_deadline=step_deadline,
            start_timeout=start_timeout,
            worker_threads=worker_threads,
            worker_nice=worker_nice,
            info_layout=info_layout,
            backend=backend,
            ray_options=ray_options,
            cpu_affinity=cpu_affinity,
            observation_mode=observation_mode,
            autoreset_mode=autoreset_mode,
            shared_memory=shared_memory,
            shm_fallback=shm_fallback,
        )
        self.render_devices = resolve_render_devices(check_render_devices(render_devices))
        self.arguments = args
        self.autoreset_mode = args.autoreset_mode
        self.num_envs = args.num_envs
        self.copy = copy
        self.info_layout = args.info_layout  # a public attribute that may change between calls
        recorder = self.profiler if profile else None
        found = self._start_workers(
            recorder,
            context=context,
            worker_threads=worker_threads,
            daemon=daemon,
            ray_options=ray_options,
            fast_path=bool(fast_path),
        )
        self._take_spaces(found)
        try:
            self._build_stepping(recorder)
        except BaseException:  # e.g. SharedMemoryFullError: no worker is left behind
            self.close(terminate=True)
            raise

    def _start_workers(
        self,
        recorder: Profiler | None,
        *,
        context: str | Any | None,
        worker_threads: int | None,
        daemon: bool,
        ray_options: Any,
        fast_path: bool,
    ) -> EnvSpaces:
        """Start the workers (their pool) and read the spaces they describe; on any
        failure close what started and re-raise."""
        self._pool = WorkerPool(
            start_timeout=self.start_timeout,
            step_deadline=self.step_deadline,
            max_restarts=self.max_restarts,
            profiler=recorder,
        )
        self.closed = False
        try:
            self._pool.spawn(
                self.arguments.layout,
                self.env_fns,
                backend=self.backend,
                context=context,
                cpu_affinity=self.cpu_affinity,
                worker_threads=worker_threads,
                daemon=daemon,
                autoreset_mode=self.autoreset_mode,
                ray_options=ray_options,
                fast_path=fast_path,
                worker_nice=self.worker_nice,
                render_devices=self.render_devices,
            )
            self.context = self._pool.context
            return spaces_from_descriptions(
                self._pool.start(), self.num_envs, self.observation_mode, self.autoreset_mode
            )
        except BaseException:
            self.close(terminate=True)
            raise

    def _take_spaces(self, found: EnvSpaces) -> None:
        """The spaces, metadata and spec the workers' envs described."""
        self.metadata = found.metadata
        self.render_mode = found.render_mode
        self.env_spec = found.env_spec
        self.single_action_space = found.single_action_space
        self.action_space = found.action_space
        self.single_observation_space = found.single_observation_space
        self.observation_space = found.observation_space

    def _build_stepping(self, recorder: Profiler | None) -> None:
        """The stages over the started workers, the observation buffers, and the
        stage and decoupled stepping over them."""
        self.stages: tuple[Stage, ...] = tuple(
            Stage(
                s,
                self.stage_slices[s],
                [h for h in self._pool.handles if h.stage == s],
                profiler=recorder,
            )
            for s in range(self.num_stages)
        )
        self._all_stages, self._all_envs = list(self.stages), slice(0, self.num_envs)
        self._obs = ObservationStore(
            self.single_observation_space,
            self.num_envs,
            self.shared_memory,
            self.arguments.shm_fallback,
            ring=self.copy,
        )
        self._pool.attach(
            self.single_observation_space,
            self._obs.buffers,
            self.num_envs,
            self._obs.generations,
        )
        self.decoupled = DecoupledState(self, self._pool, self._obs)
        self._stepping = StageStepping(
            self.stages,
            self._pool,
            self._obs,
            self.decoupled,
            num_envs=self.num_envs,
            autoreset_mode=self.autoreset_mode,
            max_restarts=self.max_restarts,
        )
        self._attach_calls(self._stepping, self._check_open)
        self._attach_decoupled(self._stepping, self._check_open)

    # ------------------------------------------------------------------ helpers

    def _select(self, stage: int | None) -> tuple[list[Stage], slice]:
        if stage is None:
            return self._all_stages, self._all_envs  # built once (callers do not mutate them)
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
    def workers(self) -> tuple[WorkerTransport, ...]:
        """Every worker's handle, in global order (stages, then workers within a stage; the
        same as ``[w for s in self.stages for w in s.workers]``): its ``env_indices``,
        ``restarts``, ``pid``, ``wire`` (`worker_handle.WireStats`, subprocess workers)."""
        return tuple(self._pool.handles)

    @property
    def pool(self) -> WorkerPool:
        """The workers' pool, for diagnostics and tests: the commands in flight on a
        worker (``envs.pool.in_flight(envs.workers[i])``, oldest first, each an
        `pipelined_vec_env.workers.pool.InFlight` with its ``command`` and ``env_ids``) and
        whether workers are idle (``envs.pool.idle(workers)``). Read it; commands sent
        through it directly bypass the env's own bookkeeping. `pipelined_vec_env.testing.kill_worker` kills a worker
        for fault tests."""
        return self._pool

    @property
    def shared_memory_names(self) -> list[str]:
        """Names of the shared-memory segments (files under ``/dev/shm`` on Linux; the
        files' paths where the buffers fell back to files, see ``shm_fallback``) that hold
        the observations, to check that none outlives `close` or a worker's death; empty
        when observations travel through pipes. The workers' step slots (a few KiB each)
        are not listed."""
        return [] if self._obs is None else [segment.name for segment in self._obs.segments]

    @property
    def shared_observations(self) -> Any:
        """The observations of all ``num_envs`` envs in shared memory, as numpy views in
        gymnasium's batched layout (a dict of arrays for a Dict space), or None where
        observations travel through pipes (``shared_memory=False``, the Ray backend, a
        space without a fixed layout) or the env is closed.

        Env ``g``'s rows hold the observation of its latest result (the one the last
        ``step``/``reset``/``recv`` returned for it) until a command to ``g`` is sent
        (``step_async``, ``send``, a reset): from then on its worker may write them. A
        view is read, or copied, before that; ``copy=False`` steps return such views.
        With ``copy=True``, reading this property ends the generations those steps
        return (see ``copy``): every later step then writes these buffers and copies
        out of them. The views end with `close` (read them no more).
        `TorchObservations` reads them as torch tensors
        (``pipelined_vec_env.torch_observations``).
        """
        return None if self._obs is None or self.closed else self._obs.hand_out_views()

    def on_close(self, callback: Callable[[], None]) -> None:
        """Have `close` call ``callback()`` after the workers stop and before the shared
        observation buffers are unmapped (e.g. to unregister page-locked memory, as
        `TorchObservations` does). A callback that raises is logged; close goes on."""
        self._check_open()
        assert self._obs is not None
        self._obs.on_release(callback)

    # ------------------------------------------------------------------ reset

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
        seeds, per_env, mask = reset_arguments(seed, options, envs)
        check_startable(stages, "reset", stage is None)
        check_free(self.decoupled, envs, "reset")
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
        check_free(self.decoupled, envs, "step")
        space = self.single_action_space
        if space is not self._checked_space:  # the check of this space, looked up once
            self._checked_space, self._check_actions = space, check_actions.dispatch(type(space))
        batch = self._check_actions(space, to_numpy(actions), envs.stop - envs.start)
        self._stepping.send_step(stages, envs, batch, space, stage is None, self.copy)

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
