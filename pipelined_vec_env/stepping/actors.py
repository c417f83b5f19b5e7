"""Inference actors: threads that each run one policy on batches of posted env requests.

The driver of an `InferenceChannel` posts requests (the observations of some envs of
one worker) and takes replies (their actions); each actor thread takes up to
``batch_limit`` requests at a time, waiting at most ``max_wait`` seconds after the first
for more (Sample Factory's dynamic batching: Petrenko et al., 2020, "Sample Factory:
Egocentric 3D Control from Pixels at 100000 FPS with Asynchronous Reinforcement
Learning"), runs its policy on them as one batch and replies. A reply also writes a byte
to a wake pipe, so the driver can sleep on the env workers and the actors together
(`DecoupledState.wait`).
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..batching import concat_batches, to_numpy

__all__ = ["ActorStats", "InferenceActors", "Policy", "Reply", "Request", "take_requests"]

logger = logging.getLogger(__name__)

Policy = Callable[[Any, np.ndarray], Any]
"""``policy(obs_batch, env_ids) -> actions`` or ``(actions, extras)``.

``obs_batch`` is a batch of ``n`` observations in gymnasium's batched layout of the env's
``single_observation_space``; ``env_ids`` is an int64 array ``(n,)`` of their global env
ids. ``actions`` is a batch of ``n`` actions (numpy or torch); ``extras`` a dict of arrays
or tensors with leading dimension ``n`` (log-probabilities, values, ...), kept with the
transitions.
"""


@dataclass
class ActorStats:
    """What one inference actor did during a run (appended by the actor's thread).

    Attributes:
        batch_sizes: Envs in each policy call.
        env_batches: Env batches (worker posts) merged into each policy call.
        queue_waits: Seconds each env batch waited in the channel, from its post to the
            moment an actor took it.
        infer_seconds: Wall-clock seconds of each policy call (including conversion of
            its outputs to numpy).
    """

    batch_sizes: list[int] = field(default_factory=list)
    env_batches: list[int] = field(default_factory=list)
    queue_waits: list[float] = field(default_factory=list)
    infer_seconds: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        """Counts, means and tails of the lists (NaN where a list is empty).

        Returns:
            ``calls``, ``envs``, ``mean_batch``, ``mean_env_batches``,
            ``mean_queue_wait_ms``, ``p99_queue_wait_ms``, ``busy_seconds``.
        """
        waits = np.asarray(self.queue_waits, dtype=np.float64) * 1e3
        return {
            "calls": float(len(self.batch_sizes)),
            "envs": float(sum(self.batch_sizes)),
            "mean_batch": float(np.mean(self.batch_sizes)) if self.batch_sizes else math.nan,
            "mean_env_batches": float(np.mean(self.env_batches)) if self.env_batches else math.nan,
            "mean_queue_wait_ms": float(waits.mean()) if waits.size else math.nan,
            "p99_queue_wait_ms": float(np.percentile(waits, 99)) if waits.size else math.nan,
            "busy_seconds": float(sum(self.infer_seconds)),
        }


@dataclass
class Request:
    """The observations of some envs of one worker, posted for one policy call.

    Attributes:
        epoch: The channel's epoch when posted (a reply of an older epoch is dropped).
        env_ids: ``(n,)`` int64 global env ids.
        obs: A batch of their ``n`` observations.
        posted_at: ``time.monotonic()`` at the post.
    """

    epoch: int
    env_ids: np.ndarray
    obs: Any
    posted_at: float


@dataclass
class Reply:
    """One policy call's answer to the requests it took.

    Attributes:
        epoch: The epoch of its requests.
        actor: The actor's index.
        env_ids: ``(n,)`` the envs of its requests, in order.
        actions: A batch of ``n`` actions (numpy), or None after an error.
        extras: The policy's extras, arrays with leading dimension ``n``.
        arrived_at: When each of its requests was posted.
        error: What the policy (or the checks of its outputs) raised, or None.
    """

    epoch: int
    actor: int
    env_ids: np.ndarray
    actions: Any
    extras: dict[str, np.ndarray]
    arrived_at: list[float]
    error: BaseException | None = None


_STOP = object()


def take_requests(
    requests: queue.Queue[Any], limit: int, max_wait: float
) -> tuple[list[Any], bool]:
    """What one actor takes for one policy call: Sample Factory's dynamic batching.

    Blocks until the first item arrives, then takes up to ``limit`` items in all, waiting
    at most ``max_wait`` seconds after the first for more (0: only what is queued).

    Args:
        requests: The channel's request queue (a `queue.Queue`; see the note in
            `InferenceActors` on why not ``SimpleQueue``).
        limit: Most items to take (>= 1).
        max_wait: Seconds to wait for more after the first.

    Returns:
        ``(taken, stop)``: the requests taken (possibly none) and whether the stop
        sentinel was met (the actor then exits after serving ``taken``).
    """
    first = requests.get()
    if first is _STOP:
        return [], True
    taken = [first]
    deadline = time.monotonic() + max_wait
    while len(taken) < limit:
        left = deadline - time.monotonic()
        try:
            item = requests.get(timeout=left) if left > 0 else requests.get_nowait()
        except queue.Empty:
            break
        if item is _STOP:
            return taken, True
        taken.append(item)
    return taken, False


class InferenceActors:
    """One daemon thread per policy, serving posted `Request`s with `Reply`s.

    Args:
        policies: One policy per actor (see `Policy`).
        observation_space: The envs' single observation space (to join requests).
        batch_limit: Most requests an actor merges into one policy call (>= 1).
        max_wait: Seconds an actor waits for more requests after the first.
        name: A name for the threads (``"{name}-actor-{i}"``).

    Attributes:
        threads: The actor threads.
        stats: One `ActorStats` per actor, since the last `reset_stats`.
        closed: `close` was called.
    """

    def __init__(
        self,
        policies: Sequence[Policy],
        observation_space: Any,
        *,
        batch_limit: int,
        max_wait: float,
        name: str,
    ) -> None:
        self._policies = list(policies)
        self._space = observation_space
        self.batch_limit = batch_limit
        self.max_wait = max_wait
        # queue.Queue, not SimpleQueue: on CPython <= 3.13 a SimpleQueue.get(timeout=...) whose
        # deadline passes while it holds the queue's lock waits forever (a negative timeout
        # reaches the lock as "no limit"), so an actor with a small max_wait could sit on
        # its requests until the next post, which never comes.
        self._requests: queue.Queue[Any] = queue.Queue()
        self._replies: queue.SimpleQueue[Reply] = queue.SimpleQueue()  # only get_nowait
        self.stats = [ActorStats() for _ in self._policies]
        self.closed = False
        self._wake_lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.threads = [
            threading.Thread(
                target=self._actor_loop, args=(i,), name=f"{name}-actor-{i}", daemon=True
            )
            for i in range(len(self._policies))
        ]
        for t in self.threads:
            t.start()

    @property
    def wake_fd(self) -> int:
        """A descriptor that turns readable when a reply is posted (see `replies`)."""
        return self._wake_r

    def reset_stats(self) -> None:
        """Start new `ActorStats` for every actor."""
        self.stats = [ActorStats() for _ in self._policies]

    def post(self, request: Request) -> None:
        """Queue ``request`` for the next idle actor."""
        self._requests.put(request)

    def replies(self) -> list[Reply]:
        """Every reply posted so far (and not taken yet), oldest first; clears the wake
        pipe."""
        try:
            while True:
                os.read(self._wake_r, 4096)
        except BlockingIOError:
            pass
        out = []
        while True:
            try:
                out.append(self._replies.get_nowait())
            except queue.Empty:
                return out

    def discard(self) -> None:
        """Drop every queued request and reply."""
        for q in (self._requests, self._replies):
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    break

    def diagnosis(self) -> str:
        """Actors alive and the queues' lengths, for a timeout's message."""
        alive = sum(t.is_alive() for t in self.threads)
        return (
            f"actors alive {alive}/{len(self.threads)}, requests queued "
            f"{self._requests.qsize()}, replies queued {self._replies.qsize()}"
        )

    def close(self, timeout: float) -> None:
        """Stop the actors within about ``timeout`` seconds in all; an actor still inside
        its policy is left to finish in its daemon thread. Always returns."""
        if self.closed:
            return
        self.discard()
        for _ in self.threads:
            self._requests.put(_STOP)
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self.threads if t.is_alive()]
        if alive:
            logger.warning("actors %s still busy at close; left to finish as daemon threads", alive)
        with self._wake_lock:
            self.closed = True
            os.close(self._wake_r)
            os.close(self._wake_w)

    # ------------------------------------------------------------------ the threads

    def _actor_loop(self, index: int) -> None:
        policy = self._policies[index]
        while True:
            taken, stop = take_requests(self._requests, self.batch_limit, self.max_wait)
            if taken:
                self._serve(index, policy, taken)
            if stop:
                return

    def _serve(self, index: int, policy: Policy, taken: list[Request]) -> None:
        started = time.monotonic()
        env_ids = np.concatenate([r.env_ids for r in taken])
        reply = Reply(taken[0].epoch, index, env_ids, None, {}, [r.posted_at for r in taken])
        try:
            space = self._space
            obs = taken[0].obs if len(taken) == 1 else concat_batches(space, [r.obs for r in taken])
            out = policy(obs, env_ids)
            if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], Mapping):
                actions, extras = out
            else:
                actions, extras = out, {}
            reply.actions = to_numpy(actions)
            reply.extras = {k: np.asarray(to_numpy(v)) for k, v in extras.items()}
            for k, v in reply.extras.items():
                if v.ndim == 0 or v.shape[0] != len(env_ids):
                    raise ValueError(
                        f"policy extras[{k!r}]: expected leading dimension {len(env_ids)} (one "
                        f"row per env), got shape {v.shape}"
                    )
        except BaseException as exc:  # noqa: BLE001 - raised in the driving thread
            reply.error = exc
        stats = self.stats[index]
        stats.batch_sizes.append(len(env_ids))
        stats.env_batches.append(len(taken))
        stats.queue_waits.extend(started - r.posted_at for r in taken)
        stats.infer_seconds.append(time.monotonic() - started)
        self._replies.put(reply)
        self._wake()

    def _wake(self) -> None:
        # under the lock, so a byte never goes to a descriptor number close() released
        with self._wake_lock:
            if self.closed:
                return
            try:
                os.write(self._wake_w, b"x")
            except BlockingIOError:  # the pipe is full: the driver is awake anyway
                pass
