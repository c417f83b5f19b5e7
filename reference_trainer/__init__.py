"""Reference PPO trainer whose rollout loop overlaps policy inference with env stepping.

The trainer: `train` (the loop), `training_run` (its set-up and state), `budget` (when to
stop for the final evaluation), `run_summary`, with `rollout` / `decoupled_rollout`,
`ppo`, `self_imitation`, `agent`, `evaluation` / `vector_eval` and `checkpoint`.
The LIBERO main job's steps around it (``examples/train_libero.py``): `main_job` and
`main_job_cli` (its checks, config and ``--help``), `init_states`, `warm_start` (demos and
BC), `bc_control`, `checkpoint_evaluation`, `job_plots` and `job_report`. It imports
`pipelined_vec_env`; nothing there imports it.
"""

from __future__ import annotations

__version__ = "0.1.0"
