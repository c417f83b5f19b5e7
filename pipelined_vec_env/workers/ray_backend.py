"""Ray backend: each worker is a Ray actor, so envs can run on any node of a Ray cluster.

``PipelinedVectorEnv(..., backend="ray")`` builds one `RayWorkerHandle` per worker
instead of a subprocess [`WorkerHandle`][pipelined_vec_env.workers.worker_handle.WorkerHandle]. The actor
(`EnvWorkerActor`) owns the same `WorkerEnvs` as a subprocess worker and answers
the same commands with the same typed answers (`Ok`, `Raised`; one dispatch,
`pipelined_vec_env.workers.worker.serve_command`), so the
stages, decoupled stepping, errors, ``max_restarts`` and ``step_deadline`` of the core work
unchanged on top of it:

- Each command is one actor method call; its ``ObjectRef`` is the pending answer. Actor
  calls from one caller run in submission order, like messages on a pipe.
- Waiting is `ray.wait` on the outstanding refs, with the caller's timeout.
- A dead actor (``ray.kill``, a crashed process, a lost node) resolves its refs with
  `ray.exceptions.RayActorError`; that becomes the `Crashed` answer (exit code None) a
  dead subprocess gives, hence [`WorkerCrashedError`][pipelined_vec_env.errors.WorkerCrashedError] or a restart.
- Observations travel as return values through Ray's object store (no shared memory: the
  envs may live on another machine).

This module imports ray; the rest of the package never imports it at module import.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import ray
from gymnasium.vector import AutoresetMode
from ray.exceptions import GetTimeoutError, RayActorError, RayError

from .process_setup import limit_threads, limit_torch_threads
from .protocol import NO_ANSWER, Answer, Command, Crashed, Raised, Ready
from .waiting import deadline_after, poll_fds, remaining
from .worker import serve_command
from .worker_envs import WorkerEnvs

__all__ = ["EnvWorkerActor", "RayBackend", "RayOptions", "RayWorkerHandle"]

logger = logging.getLogger(__name__)


@dataclass
class RayOptions:
    """How the env actors are placed on a Ray cluster.

    Attributes:
        address: Ray address for `ray.init` when Ray is not initialised yet
            (``"auto"``, ``"ray://head:10001"``, ...); None: the ``RAY_ADDRESS`` variable
            or a new local instance. Ignored when ``ray.init`` was already called.
        num_cpus: CPUs each worker actor reserves (fractions allowed). One worker holds
            ``envs_per_worker`` envs.
        num_gpus: GPUs each worker actor reserves (e.g. for a GPU-rendered simulator).
        memory: Bytes of memory each actor reserves, or None.
        resources: Custom resources each actor reserves, e.g. ``{"sim_node": 1}`` to keep
            simulators on nodes started with ``ray start --resources='{"sim_node": 8}'``.
        placement_group: A `ray.util.placement_group.PlacementGroup` to place the
            actors in; worker ``k`` goes to bundle ``bundle_indices[k]`` (default ``k``).
            Each bundle must hold the actor's request (``num_cpus`` ...).
        bundle_indices: Bundle per worker (global worker order), or None for ``k``.
        node_ids: Ray node ids (hex strings, ``ray.nodes()[i]["NodeID"]``); worker ``k``
            is pinned to ``node_ids[k % len(node_ids)]`` with
            ``NodeAffinitySchedulingStrategy``. Not together with ``placement_group``.
        soft_affinity: With ``node_ids``: allow another node when the chosen one is
            full or gone (else the actor waits for that node).
        check_resources: Refuse, before starting any actor, a request larger than the
            cluster's total resources (an actor that can never be placed would make the
            constructor wait forever). Turn off on autoscaling clusters.
        actor_options: Extra keyword arguments for ``.options()`` of every actor
            (``runtime_env``, ``max_concurrency`` is refused: commands must run in order).
    """

    address: str | None = None
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    memory: int | None = None
    resources: dict[str, float] = field(default_factory=dict)
    placement_group: Any = None
    bundle_indices: Sequence[int] | None = None
    node_ids: Sequence[str] | None = None
    soft_affinity: bool = False
    check_resources: bool = True
    actor_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_value(cls, value: RayOptions | Mapping[str, Any] | None) -> RayOptions:
        """Build options from None, a mapping of the fields, or an instance.

        Raises:
            ValueError: Unknown keys, negative requests, or conflicting placement.
        """
        if value is None:
            options = cls()
        elif isinstance(value, cls):
            options = value
        elif isinstance(value, Mapping):
            unknown = set(value) - set(cls.__dataclass_fields__)
            if unknown:
                raise ValueError(
                    f"ray_options: unknown keys {sorted(unknown)}; expected some of "
                    f"{sorted(cls.__dataclass_fields__)}"
                )
            options = cls(**value)
        else:
            raise ValueError(f"ray_options: expected None, a dict or RayOptions, got {value!r}")
        if options.num_cpus < 0 or options.num_gpus < 0:
            raise ValueError("ray_options: num_cpus and num_gpus must be >= 0")
        if options.placement_group is not None and options.node_ids:
            raise ValueError("ray_options: give placement_group or node_ids, not both")
        if "max_concurrency" in options.actor_options:
            raise ValueError(
                "ray_options.actor_options: max_concurrency is not allowed; a worker serves "
                "its commands one at a time, in order"
            )
        return options

    def actor_kwargs(self, worker: int) -> dict[str, Any]:
        """The ``.options()`` keyword arguments for worker ``worker``'s actor."""
        kwargs: dict[str, Any] = {
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "max_restarts": 0,  # restarts are the vector env's (max_restarts), not Ray's
            "max_concurrency": 1,
            **self.actor_options,
        }
        if self.resources:
            kwargs["resources"] = dict(self.resources)
        if self.memory is not None:
            kwargs["memory"] = self.memory
        if self.placement_group is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            bundle = worker if self.bundle_indices is None else self.bundle_indices[worker]
            kwargs["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group, placement_group_bundle_index=bundle
            )
        elif self.node_ids:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            kwargs["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                node_id=self.node_ids[worker % len(self.node_ids)], soft=self.soft_affinity
            )
        return kwargs


def ensure_ray(options: RayOptions, num_workers: int) -> None:
    """Connect to Ray if needed and check that ``num_workers`` actors can be placed.

    Raises:
        ValueError: ``check_resources`` is on and the cluster's total CPUs, GPUs or custom
            resources are fewer than the workers request (with a hint to fix it).
    """
    if not ray.is_initialized():
        logger.info("connecting to Ray (address=%s)", options.address)
        ray.init(address=options.address, include_dashboard=False, log_to_driver=True)
    if not options.check_resources or options.placement_group is not None:
        return  # a placement group has already reserved its bundles
    total = ray.cluster_resources()
    wanted = {"CPU": options.num_cpus * num_workers, "GPU": options.num_gpus * num_workers}
    for name, amount in options.resources.items():
        wanted[name] = wanted.get(name, 0.0) + amount * num_workers
    short = {k: (v, total.get(k, 0.0)) for k, v in wanted.items() if v > total.get(k, 0.0) + 1e-9}
    if short:
        detail = ", ".join(
            f"{k}: {v:g} requested, {have:g} in the cluster" for k, (v, have) in short.items()
        )
        raise ValueError(
            f"backend='ray': {num_workers} env workers cannot all be placed ({detail}). Use "
            "fewer workers (a larger envs_per_worker), a fractional ray_options num_cpus, "
            "more nodes, or check_resources=False on an autoscaling cluster"
        )


class EnvWorkerActor:
    """The Ray actor of one worker: builds its envs and serves the worker commands.

    Made a Ray actor class with `ray.remote` when first used (see
    `_actor_class`). Its methods return the subprocess protocol's answers (see
    [`pipelined_vec_env.workers.protocol`][pipelined_vec_env.workers.protocol]); env exceptions come back as `Raised`.

    Args:
        worker_index: This worker's index (for messages).
        pickled_env_fns: cloudpickled list of env constructors, one per env (each a
            `ByValue`: the envs share no object).
        env_indices: Global indices of its envs.
        autoreset_mode: gymnasium's autoreset mode, applied per env.
        worker_threads: Cap for OpenMP/BLAS/torch threads, or None.
    """

    def __init__(
        self,
        worker_index: int,
        pickled_env_fns: bytes,
        env_indices: tuple[int, ...],
        autoreset_mode: AutoresetMode,
        worker_threads: int | None,
    ) -> None:
        self.worker_index = worker_index
        self._args = (pickled_env_fns, env_indices, autoreset_mode, worker_threads)
        self.envs: WorkerEnvs | None = None

    def start(self) -> Ready | Raised:
        """Build the envs; answer `Ready` or `Raised`."""
        pickled_env_fns, env_indices, autoreset_mode, worker_threads = self._args
        try:
            limit_threads(worker_threads)
            env_fns = cloudpickle.loads(pickled_env_fns)
            self.envs = WorkerEnvs([fn() for fn in env_fns], env_indices, autoreset_mode)
            limit_torch_threads(worker_threads)
            return Ready(self.envs.describe())
        except Exception as exc:
            return Raised.from_exception(exc)

    def pid(self) -> int:
        """The actor's process id."""
        return os.getpid()

    def node_id(self) -> str:
        """The Ray node id the actor runs on (hex)."""
        return ray.get_runtime_context().get_node_id()

    def handle(self, command: Command, payload: Any) -> Answer | None:
        """Serve one command of the worker protocol and return its answer (None for
        commands without one): the subprocess worker's dispatch, `serve_command`."""
        assert self.envs is not None, "command before start()"
        return serve_command(self.envs, command, payload)


_ACTOR_CLASS: Any = None


def _actor_class() -> Any:
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = ray.remote(EnvWorkerActor)
    return _ACTOR_CLASS


class RayWorkerHandle:
    """The caller's side of one worker running as a Ray actor.

    Implements `transport.WorkerTransport`, as the subprocess
    [`WorkerHandle`][pipelined_vec_env.workers.worker_handle.WorkerHandle] does; the waits on
    several actors at once are `RayBackend`'s. Answers are ``ObjectRef``\\ s queued in
    ``refs`` in submission order; each one not received yet counts as an expected answer
    (``pending``).

    Attributes:
        backend: ``"ray"`` (a label for callers; nothing dispatches on it).
        actor: The current actor handle (replaced by `restart`).
        refs: Outstanding answer refs, oldest first.
    """

    backend = "ray"
    #: The vector env's ``Profiler`` when profiling is on; Ray answers carry no worker
    #: times, so it records round trips on the caller's clock.
    profiler: Any = None

    def __init__(
        self,
        index: int,
        stage: int,
        env_indices: tuple[int, ...],
        pickled_env_fns: bytes,
        autoreset_mode: AutoresetMode,
        worker_threads: int | None,
        options: RayOptions,
    ) -> None:
        self.index = index
        self.stage = stage
        self.env_indices = env_indices
        self.restarts = 0
        self._args = (pickled_env_fns, autoreset_mode, worker_threads)
        self._options = options
        self._start()

    def _start(self) -> None:
        self.answer: Answer | None = None
        self.dead = False
        self.deadline_exceeded = False
        self.stacks: str | None = None  # a busy actor serves no other call: no dump
        self._pid: int | None = None
        pickled_env_fns, autoreset_mode, worker_threads = self._args
        self.actor = (
            _actor_class()
            .options(**self._options.actor_kwargs(self.index))
            .remote(self.index, pickled_env_fns, self.env_indices, autoreset_mode, worker_threads)
        )
        self.refs: deque[Any] = deque([self.actor.start.remote()])  # the "ready" answer

    @property
    def pending(self) -> bool:
        """Whether answers are expected and not all received yet (refs outstanding)."""
        return bool(self.refs)

    def send(self, command: Command, payload: Any, expect_answer: bool = True) -> None:
        """Submit one command; its answer is collected by `RayBackend.receive_ready` (the pool).

        A worker already known dead answers `Crashed` at once (when an answer
        is expected), as a subprocess worker found dead while sending does.
        """
        if self.dead:
            if expect_answer and command not in NO_ANSWER and self.answer is None:
                self.answer = Crashed(None)
            self.refs.clear()
            return
        if self.profiler is not None:
            self.profiler.command_sent(self.index, command)
        ref = self.actor.handle.remote(command, payload)
        if command not in NO_ANSWER and expect_answer:
            self.refs.append(ref)

    def next_answer(self) -> Answer:
        """Pop the oldest outstanding ref and return its answer (blocks until ready).

        A dead actor gives `Crashed` (exit code None); a Ray failure of the call itself
        (e.g. a result Ray could not serialise) gives `Raised`.
        """
        ref = self.refs.popleft()
        try:
            answer = ray.get(ref)
            if self.profiler is not None:
                self.profiler.answer_received(self.index, answer.kind, None)
            return answer
        except RayActorError as exc:
            logger.debug("worker %d's actor died: %s", self.index, exc)
            self.dead = True
            self.refs.clear()  # the later answers are lost with the actor
            return Crashed(None)
        except RayError as exc:
            return Raised.from_exception(exc)

    def receive(self) -> None:
        """Store the oldest outstanding answer in ``answer``."""
        self.answer = self.next_answer()

    @property
    def exitcode(self) -> None:
        """Always None: Ray does not report an actor's exit code."""
        return None

    @property
    def pid(self) -> int | None:
        """The actor's process id (on its node), or None if it cannot be asked."""
        if self._pid is None and not self.dead:
            try:
                self._pid = ray.get(self.actor.pid.remote(), timeout=30)
            except (RayError, GetTimeoutError):
                return None
        return self._pid

    def take(self) -> Answer:
        """Return and clear the received answer."""
        assert self.answer is not None
        answer, self.answer = self.answer, None
        return answer

    def kill(self) -> None:
        """Kill the actor now (``ray.kill``); its outstanding refs resolve as dead."""
        if not ray.is_initialized():
            return  # Ray was shut down (its actors with it); do not start a new instance
        try:
            ray.kill(self.actor, no_restart=True)
        except (RayError, ValueError):
            logger.debug("ray.kill of worker %d failed", self.index, exc_info=True)

    def dump_stacks(self, timeout: float = 1.0) -> None:
        """None: a Ray actor runs one call at a time, so a busy one cannot be asked for
        its stacks (``ray stack`` on its node dumps them with py-spy)."""
        return None

    def kill_for_deadline(self) -> None:
        """Kill an actor that overran its deadline; the wait then reports a crash."""
        self.deadline_exceeded = True
        if self.profiler is not None:
            self.profiler.deadline_kill(self.index)
        self.kill()

    def restart(self, counted: bool = True) -> None:
        """Kill this worker's actor and start a fresh one for the same envs.

        The new actor answers with its start-up ``ready`` answer.

        Args:
            counted: Count it in ``restarts`` (see the subprocess ``WorkerHandle``).
        """
        self.close(timeout=0.0)
        self.restarts += int(counted)
        if self.profiler is not None:
            self.profiler.worker_restarted(self.index)
        self._start()

    def close(self, timeout: float = 5.0) -> None:
        """Ask the actor to close its envs (up to ``timeout`` s), then kill it. Returns."""
        if not self.dead and timeout > 0 and ray.is_initialized():
            ref = self.actor.handle.remote(Command.CLOSE, None)
            try:
                ray.wait([ref], num_returns=1, timeout=timeout)
            except RayError:
                pass
        self.kill()
        self.refs.clear()
        self.dead = True


class RayBackend:
    """The Ray backend's waits on several actors at once (implements
    `transport.WorkerBackend`): ``ray.wait`` on each actor's oldest outstanding ref."""

    @staticmethod
    def receive_ready(
        handles: Sequence[RayWorkerHandle], timeout: float | None, wake_fd: int | None = None
    ) -> bool:
        """Wait (``ray.wait``) until at least one pending handle's answer is ready, then
        receive every ready one; at most ``timeout`` seconds.

        An actor has no descriptor to poll, so with a ``wake_fd`` the wait alternates
        short ``ray.wait`` slices (2 ms) with a zero-timeout look at ``wake_fd``.

        Returns:
            Whether ``wake_fd`` was readable.
        """
        heads = {h.refs[0]: h for h in handles if h.refs and h.answer is None}
        if not heads and wake_fd is None:
            return False
        deadline = deadline_after(timeout)
        while True:
            left = remaining(deadline)
            wait = _slice(left) if heads and wake_fd is not None else left
            ready: list[Any] = []
            if heads:
                ready, rest = ray.wait(list(heads), num_returns=1, timeout=wait)
                if ready and rest:
                    more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                    ready += more
            else:
                poll_fds([wake_fd], wait)  # type: ignore[list-item]
            for ref in ready:
                heads[ref].receive()
            woken = wake_fd is not None and bool(poll_fds([wake_fd], 0))
            if ready or woken or wake_fd is None or left == 0:
                return woken

    @staticmethod
    def none_written(handles: Sequence[RayWorkerHandle]) -> bool:
        """False: an actor's answer is seen only through ``ray.wait``."""
        return False

    @staticmethod
    def spin_for_answers(handles: Sequence[RayWorkerHandle], seconds: float) -> None:
        """Returns at once: an actor's answer is seen only through ``ray.wait``."""

    @staticmethod
    def find_dead(handles: Sequence[RayWorkerHandle], timeout: float = 10.0) -> None:
        """One ``pid`` call per live actor, awaited together (at most ``timeout``
        seconds); an actor whose call fails as dead is marked dead. An actor that does
        not answer in time is left as it is (its next command tells)."""
        probes = {}
        for h in handles:
            if not h.dead:
                probes[h.actor.pid.remote()] = h
        if not probes:
            return
        ready, _ = ray.wait(list(probes), num_returns=len(probes), timeout=timeout)
        for ref in ready:
            try:
                ray.get(ref)
            except RayActorError:
                probes[ref].dead = True
            except RayError:
                logger.debug("probing worker %d failed", probes[ref].index, exc_info=True)

    @staticmethod
    def close_all(handles: Sequence[RayWorkerHandle], timeout: float) -> None:
        """Ask every live actor to close its envs at once, wait for them at most
        ``timeout`` seconds in all, then kill every actor. Always returns."""
        if timeout > 0 and ray.is_initialized():
            refs = []
            for h in handles:
                if not h.dead:
                    try:
                        refs.append(h.actor.handle.remote(Command.CLOSE, None))
                    except RayError:
                        logger.debug("close of worker %d failed", h.index, exc_info=True)
            if refs:
                try:
                    ray.wait(refs, num_returns=len(refs), timeout=timeout)
                except RayError:
                    logger.debug("waiting for the actors' close failed", exc_info=True)
        for h in handles:
            h.close(timeout=0.0)


#: The longest ``ray.wait`` slice between two looks at a wake descriptor (seconds).
_RAY_POLL_SECONDS = 0.002


def _slice(left: float | None) -> float:
    return _RAY_POLL_SECONDS if left is None else min(_RAY_POLL_SECONDS, left)
