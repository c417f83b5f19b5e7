"""Observations as torch tensors: views on the CPU, DMA from page-locked buffers on a GPU.

The workers write every observation into shared memory (gymnasium's layout); the caller
needs no copy of it on the CPU. `TorchObservations` reads those buffers as tensors:

- on the CPU, ``torch.from_numpy`` views of the buffers: no copy at all;
- on a CUDA device, the buffers are page-locked once (``cudaHostRegister`` through
  ``torch.cuda.cudart()``) and each call copies the rows asked for into new device tensors
  with ``non_blocking=True``: a DMA from the workers' buffers to the GPU, with no copy on
  the CPU in between (without page-locking, CUDA stages a pageable copy through a pinned
  buffer of its own first). The buffers are unregistered before `close` unmaps them.

The rows of the envs that a step (whole or staged) or a ``recv`` returned are read with
`TorchObservations.batch` (a slice of envs, a stage) or `TorchObservations.rows` (the
``info["env_id"]`` of a ``recv``). Dict and Tuple observations keep gymnasium's layout (a
dict of tensors, a tuple of tensors); dtypes are the space's (``uint8`` frames stay
``uint8``). `as_tensors` converts any numpy batch the same way, for code that holds
arrays rather than a vector env.

When the buffers are overwritten: env ``g``'s rows hold the observation of its last
result until a command to ``g`` is sent (``step_async``/``step``, ``send``, a reset);
from then on the worker may write them. A CPU view must be used (or copied) before then;
a CUDA copy must have finished, which it has once anything computed from it was read on
the CPU (the policy's actions moved to the CPU to step the envs), or after
`TorchObservations.synchronize`.

Pinned uploads of shared buffers: PyTorch's ``pin_memory`` copies into a new pinned
buffer; ``cudaHostRegister`` pins memory in place (CUDA Runtime API, "Memory
Management"), as PufferLib's proposed pinned transfer and Sample Factory's shared tensors
keep observations where the workers write them.

Examples:
    >>> import numpy as np
    >>> from pipelined_vec_env import PipelinedVectorEnv
    >>> from pipelined_vec_env.debug_envs import CameraEnv
    >>> from pipelined_vec_env.torch_observations import TorchObservations
    >>> envs = PipelinedVectorEnv([lambda: CameraEnv(side=32)] * 2, copy=False)
    >>> to_torch = TorchObservations(envs, device="cpu")
    >>> _ = envs.reset(seed=0)
    >>> obs = to_torch.batch()
    >>> obs["camera0_image"].shape, obs["camera0_image"].dtype
    (torch.Size([2, 32, 32, 3]), torch.uint8)
    >>> envs.close()
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from gymnasium.error import ClosedEnvironmentError

from .batching import leaves

__all__ = ["CudaHostRegistrar", "HostRegistrar", "TorchObservations", "as_tensors"]

logger = logging.getLogger(__name__)


class HostRegistrar(Protocol):
    """Pins host memory in place for device copies (`CudaHostRegistrar`)."""

    def register(self, pointer: int, nbytes: int) -> None:
        """Page-lock ``nbytes`` from address ``pointer``."""

    def unregister(self, pointer: int) -> None:
        """Undo `register` of the memory at ``pointer``."""


class CudaHostRegistrar:
    """`HostRegistrar` through the CUDA runtime: ``cudaHostRegister(ptr, nbytes, 0)`` and
    ``cudaHostUnregister(ptr)`` (``torch.cuda.cudart()``).

    Raises:
        RuntimeError: CUDA's error (``torch.cuda.check_error``), e.g. no CUDA device.
    """

    def __init__(self) -> None:
        self._cudart = torch.cuda.cudart()

    def register(self, pointer: int, nbytes: int) -> None:
        torch.cuda.check_error(self._cudart.cudaHostRegister(pointer, nbytes, 0))

    def unregister(self, pointer: int) -> None:
        torch.cuda.check_error(self._cudart.cudaHostUnregister(pointer))


def _map(batch: Any, fn: Callable[[np.ndarray], Any]) -> Any:
    """``fn`` of each array of a batch in gymnasium's layout, the layout kept."""
    if isinstance(batch, dict):
        return {key: _map(value, fn) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_map(value, fn) for value in batch)
    return fn(batch)


def _from_numpy(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing ``array``'s memory (a copy only for negative strides, which
    torch cannot view)."""
    if any(s < 0 for s in array.strides):
        array = np.ascontiguousarray(array)
    return torch.from_numpy(array)


def as_tensors(obs: Any, device: str | torch.device = "cpu") -> Any:
    """A numpy observation batch (an array, or gymnasium's dict/tuple layout) as tensors
    on ``device``, dtypes kept.

    On the CPU the tensors are views of the arrays (``torch.from_numpy``: no copy). On
    another device each array is copied with ``non_blocking=True``: asynchronous where
    the array lies in page-locked memory (a `TorchObservations` on CUDA registers the
    vector env's buffers, so views of them, ``copy=False``, upload by DMA), a plain copy
    otherwise.

    Raises:
        TypeError: An array of a dtype torch has no type for (object arrays of Text
            spaces ...).
    """
    device = torch.device(device)
    if device.type == "cpu":
        return _map(obs, lambda a: _from_numpy(np.asarray(a)))
    return _map(obs, lambda a: _from_numpy(np.asarray(a)).to(device, non_blocking=True))


def _runs(ids: np.ndarray) -> list[tuple[int, int, int]]:
    """``(position, first env, count)`` of each run of consecutive env ids in ``ids``."""
    if len(ids) == 0:
        return []
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(ids)]])
    return [(int(a), int(ids[a]), int(b - a)) for a, b in zip(starts, ends, strict=True)]


class TorchObservations:
    """A vector env's observations in shared memory, read as torch tensors on ``device``.

    Build it once after the vector env (a `PipelinedVectorEnv` with shared memory, the
    default; ``copy=False`` spares the copy its ``step`` would make for nothing), then
    read the rows of the envs each call returned:

    - ``envs.step(...)`` / ``envs.reset(...)``: ``to_torch.batch()``;
    - ``envs.step_wait(stage=s)``: ``to_torch.batch(stage=s)``;
    - ``envs.recv(...)``: ``to_torch.rows(infos["env_id"])``.

    Args:
        envs: The vector env (wrappers are looked through with ``unwrapped``).
        device: Where the tensors go.
        copy: Copy the rows into new tensors. Default: False on the CPU (views of the
            shared buffers, valid until the envs' next command, see the module doc),
            True on any other device (where a copy is the upload).
        registrar: Pins the buffers for device copies (`HostRegistrar`). Default: a
            `CudaHostRegistrar` on a CUDA device, else none. A registration that fails
            is logged and the copies go unpinned (synchronous).

    Attributes:
        device: ``torch.device`` of the tensors.
        pinned: Whether the buffers are registered now.

    Raises:
        ValueError: The vector env keeps no observations in shared memory (a space
            without a fixed layout, ``shared_memory=False``, the Ray backend), or it is
            closed.

    Reads after the vector env's `close` raise gymnasium's ``ClosedEnvironmentError``.
    """

    def __init__(
        self,
        envs: Any,
        device: str | torch.device = "cpu",
        *,
        copy: bool | None = None,
        registrar: HostRegistrar | None = None,
    ) -> None:
        env = envs.unwrapped
        views = env.shared_observations
        if views is None:
            raise ValueError(
                "envs: TorchObservations reads observations in shared memory; this vector "
                "env has none (shared_memory=False, the Ray backend, a space without a "
                "fixed layout, or closed). Use as_tensors(obs, device) on its observations."
            )
        self.device = torch.device(device)
        self.copy = self.device.type != "cpu" if copy is None else bool(copy)
        self._stage_slices: tuple[slice, ...] = tuple(env.stage_slices)
        self._num_envs = int(env.num_envs)
        self._views = views
        self._tensors = _map(views, _from_numpy)  # the whole batch, CPU views
        self._registrar = registrar
        if registrar is None and self.device.type == "cuda":
            self._registrar = CudaHostRegistrar()
        self._registered: list[int] = []
        self.pinned = False
        self._event: Any = None
        if self._registrar is not None and self.copy:
            self._pin()
        env.on_close(self._close)

    # ------------------------------------------------------------------ reads

    def batch(self, envs: slice | None = None, *, stage: int | None = None) -> Any:
        """The observations of a slice of envs (all of them by default, or stage
        ``stage``'s) as tensors, in gymnasium's layout.

        Returns:
            Views of the shared buffers (``copy=False``), else new tensors on ``device``.

        Raises:
            ValueError: Both ``envs`` and ``stage`` given, a stage out of range, or a
                slice with a step.
        """
        if stage is not None:
            if envs is not None:
                raise ValueError("batch: give envs or stage, not both")
            if not 0 <= stage < len(self._stage_slices):
                raise ValueError(
                    f"stage: expected an int in [0, {len(self._stage_slices)}), got {stage!r}"
                )
            envs = self._stage_slices[stage]
        lo, hi, step = (envs or slice(None)).indices(self._num_envs)
        if step != 1:
            raise ValueError(f"envs: expected a slice of consecutive envs, got {envs!r}")
        if not self.copy:
            return _map(self._whole(), lambda t: t[lo:hi])
        return self._upload(np.arange(lo, hi))

    def rows(self, env_ids: Sequence[int] | np.ndarray) -> Any:
        """The observations of the envs ``env_ids`` (a ``recv``'s ``info["env_id"]``), in
        that order, as tensors in gymnasium's layout.

        Returns:
            With ``copy=False``: views of the shared buffers where ``env_ids`` is one run
            of consecutive envs in order, else new CPU tensors (an index copies). With
            ``copy=True``: new tensors on ``device``, one copy per run of consecutive
            envs.

        Raises:
            ValueError: Ids out of ``[0, num_envs)`` or not a 1-D integer sequence.
        """
        ids = np.asarray(env_ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ValueError(f"env_ids: expected a 1-D sequence of env ids, got {env_ids!r}")
        ids = ids.astype(np.int64, copy=False)
        if ids.size and (ids.min() < 0 or ids.max() >= self._num_envs):
            raise ValueError(f"env_ids: expected ids in [0, {self._num_envs}), got {ids.tolist()}")
        if self.copy:
            return self._upload(ids)
        runs = _runs(ids)
        if len(runs) == 1:
            _, first, count = runs[0]
            return _map(self._whole(), lambda t: t[first : first + count])
        index = torch.from_numpy(ids)
        return _map(self._whole(), lambda t: t.index_select(0, index))

    def __call__(self, obs: Any) -> Any:
        """`as_tensors` of ``obs`` on ``device`` (any numpy batch: views of the buffers
        upload from the pinned memory)."""
        return as_tensors(obs, self.device)

    def synchronize(self) -> None:
        """Wait until the last device copies finished (the buffers may be written again)."""
        if self._event is not None:
            self._event.synchronize()

    def _close(self) -> None:
        """The vector env closes: unregister the buffers and drop the views of them."""
        self.unpin()
        self._views = self._tensors = None

    def _whole(self) -> Any:
        if self._tensors is None:
            raise ClosedEnvironmentError("TorchObservations: the vector env was closed")
        return self._tensors

    # ------------------------------------------------------------------ pinning

    def _pin(self) -> None:
        assert self._registrar is not None
        try:
            for array in leaves(self._views):
                pointer = array.ctypes.data
                self._registrar.register(pointer, array.nbytes)
                self._registered.append(pointer)
        except Exception as exc:  # noqa: BLE001 - copies still work, unpinned
            logger.warning(
                "could not page-lock the observation buffers (%s); copying unpinned", exc
            )
            self.unpin()
            return
        self.pinned = True

    def unpin(self) -> None:
        """Unregister the buffers (done by the vector env's `close` before it unmaps
        them; harmless when nothing is registered)."""
        self.synchronize()
        registered, self._registered = self._registered, []
        for pointer in registered:
            try:
                assert self._registrar is not None
                self._registrar.unregister(pointer)
            except Exception as exc:  # noqa: BLE001 - close goes on
                logger.warning("could not unregister observation buffer at %#x: %s", pointer, exc)
        self.pinned = False

    def _upload(self, ids: np.ndarray) -> Any:
        """New tensors on ``device`` holding the rows ``ids``: one non-blocking copy per
        run of consecutive envs."""
        runs = _runs(ids)
        non_blocking = self.device.type != "cpu"

        def copy(source: torch.Tensor) -> torch.Tensor:
            out = torch.empty((len(ids), *source.shape[1:]), dtype=source.dtype, device=self.device)
            for position, first, count in runs:
                out[position : position + count].copy_(
                    source[first : first + count], non_blocking=non_blocking
                )
            return out

        result = _map(self._whole(), copy)
        if self.device.type == "cuda":
            self._event = torch.cuda.Event()
            self._event.record()
        return result
