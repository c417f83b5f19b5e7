"""Camera frames to a CUDA device: `TorchObservations` (DMA from the page-locked shared
buffers) against gymnasium's ``NumpyToTorch`` wrapper and a plain
``torch.from_numpy(obs).to(device)``, on the same vector env in one run.

Each backend steps ``num_envs`` `CameraEnv` envs (two pre-built 224 px frames and a state
an env step) through `PipelinedVectorEnv` and puts each step's observations on the GPU;
a small reduction on the GPU read back to the CPU stands for the policy's actions (it
waits for the upload, as actions moved to the CPU do). Rounds are interleaved; the table
gives env steps/s, the GB/s of frames delivered to the GPU and the ratio to the plain
upload (the median of per-round ratios), and the upload's own time per batch.

- ``plain``: ``PipelinedVectorEnv(copy=True)``; ``torch.from_numpy(a).to(device)`` per
  array (pageable memory: CUDA stages it through a pinned buffer of its own).
- ``NumpyToTorch``: ``gymnasium.wrappers.vector.NumpyToTorch(envs, device)`` on the same
  env (``copy=True``).
- ``ours``: ``PipelinedVectorEnv(copy=False)`` and ``TorchObservations(envs, "cuda")``:
  the buffers registered once (``cudaHostRegister``), non-blocking copies straight from
  them, no CPU copy.

Needs a CUDA device (``--device cpu`` runs the same code as a check), and gymnasium's
torch extra for ``NumpyToTorch`` (``array_api_compat``; the row is left out without it).
Run::

    python benchmarks/frames_cuda.py                  # 8, 32, 64 envs, < 2 minutes
    python benchmarks/frames_cuda.py --envs 32 --steps 50 --rounds 2

Results go to ``benchmarks/results/frames_cuda.json`` (the table beside it, ``.md``).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _machine.py, also when loaded by path
from _machine import run_record, write_results  # noqa: E402

from pipelined_vec_env import PipelinedVectorEnv  # noqa: E402
from pipelined_vec_env.debug_envs import CameraEnv  # noqa: E402
from pipelined_vec_env.torch_observations import TorchObservations  # noqa: E402

__all__ = ["Args", "format_table", "main"]

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Args:
    """Options of the CUDA frames benchmark."""

    envs: tuple[int, ...] = (8, 32, 64)
    """Envs per vector env."""
    side: int = 224
    """Image side (pixels); two cameras."""
    steps: int = 100
    """Vector steps timed per backend and round."""
    warmup: int = 10
    """Vector steps before each timing."""
    rounds: int = 3
    """Interleaved rounds."""
    device: str = "cuda"
    """The torch device."""
    output: Path = REPO / "benchmarks" / "results" / "frames_cuda.json"
    """Where the JSON goes."""


Step = Callable[[], float]
"""``step()``: one vector step with its upload; returns the upload's seconds."""


def _read_back(tensors: Any) -> None:
    """Stand-in for the policy: a reduction on the device read back on the CPU."""
    first = tensors["camera0_image"]
    first[:, 0, 0, 0].float().sum().item()


def _plain(envs: PipelinedVectorEnv, device: torch.device) -> Step:
    actions = np.zeros((envs.num_envs, 7), np.float32)

    def step() -> float:
        obs = envs.step(actions)[0]
        start = time.perf_counter()
        tensors = {k: torch.from_numpy(v).to(device) for k, v in obs.items()}
        _read_back(tensors)
        return time.perf_counter() - start

    return step


def _numpy_to_torch(envs: Any, device: torch.device) -> Step:
    actions = torch.zeros((envs.num_envs, 7), dtype=torch.float32)

    def step() -> float:
        start = time.perf_counter()  # the wrapper's step holds its upload
        obs = envs.step(actions)[0]
        _read_back(obs)
        return time.perf_counter() - start

    return step


def _ours(envs: PipelinedVectorEnv, device: torch.device) -> Step:
    to_device = TorchObservations(envs, device)
    actions = np.zeros((envs.num_envs, 7), np.float32)

    def step() -> float:
        envs.step(actions)
        start = time.perf_counter()
        tensors = to_device.batch()
        _read_back(tensors)
        return time.perf_counter() - start

    return step


def build(name: str, num_envs: int, side: int, device: torch.device) -> tuple[Any, Step]:
    """The vector env of backend ``name`` and its step."""
    fns = [lambda: CameraEnv(2, side, 9)] * num_envs
    if name == "ours":
        envs = PipelinedVectorEnv(fns, copy=False)
        envs.reset(seed=0)
        return envs, _ours(envs, device)
    envs = PipelinedVectorEnv(fns)
    envs.reset(seed=0)
    if name == "plain":
        return envs, _plain(envs, device)
    from gymnasium.wrappers.vector import NumpyToTorch

    wrapped = NumpyToTorch(envs, device=device)
    return wrapped, _numpy_to_torch(wrapped, device)


def _has_numpy_to_torch() -> bool:
    try:
        from gymnasium.wrappers.vector import NumpyToTorch  # noqa: F401
    except ImportError as error:  # gymnasium's torch extra: array_api_compat
        print(f"NumpyToTorch left out ({error}): pip install 'gymnasium[torch]'")
        return False
    return True


def measure(args: Args, num_envs: int) -> dict[str, Any]:
    """Every backend on ``num_envs`` envs, interleaved rounds."""
    device = torch.device(args.device)
    names = ("plain", "NumpyToTorch", "ours") if _has_numpy_to_torch() else ("plain", "ours")
    built = {name: build(name, num_envs, args.side, device) for name in names}
    rates: dict[str, list[float]] = {name: [] for name in names}
    uploads: dict[str, list[float]] = {name: [] for name in names}
    try:
        for _ in range(args.rounds):
            for name in names:
                _, step = built[name]
                for _ in range(args.warmup):
                    step()
                start = time.perf_counter()
                times = [step() for _ in range(args.steps)]
                rates[name].append(num_envs * args.steps / (time.perf_counter() - start))
                uploads[name].append(statistics.median(times))
    finally:
        for envs, _ in built.values():
            envs.close()
    frame_bytes = 2 * args.side * args.side * 3
    rows = []
    for name in names:
        sps = statistics.median(rates[name])
        rows.append(
            {
                "name": name,
                "steps_per_s": sps,
                "frames_gb_per_s": sps * frame_bytes / 1e9,
                "vs_plain": statistics.median(
                    a / b for a, b in zip(rates[name], rates["plain"], strict=True)
                ),
                "upload_us": statistics.median(uploads[name]) * 1e6,
                "rounds": rates[name],
            }
        )
    return {"num_envs": num_envs, "side": args.side, "rows": rows}


def format_table(result: dict[str, Any]) -> str:
    """Per envs and backend: env steps/s, frames GB/s to the GPU, ratio to the plain
    upload, and the upload's time per batch (``NumpyToTorch``: its whole step)."""
    lines = [
        "| envs | backend | env steps/s | frames GB/s | vs plain | upload per batch (us) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for case in result["cases"]:
        for r in case["rows"]:
            lines.append(
                f"| {case['num_envs']} | {r['name']} | {r['steps_per_s']:.0f} "
                f"| {r['frames_gb_per_s']:.2f} | {r['vs_plain']:.2f} | {r['upload_us']:.0f} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = tyro.cli(Args, args=argv)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("frames_cuda.py needs a CUDA device (torch.cuda.is_available() is False)")
    started, load = time.time(), os.getloadavg()[0]
    result: dict[str, Any] = {
        "args": {k: str(v) for k, v in asdict(args).items()},
        "cases": [measure(args, n) for n in args.envs],
        "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }
    result["run"] = run_record(REPO, started, load, ("numpy", "gymnasium", "torch"))
    write_results(args.output, result, format_table(result))
    return result


if __name__ == "__main__":
    main()
