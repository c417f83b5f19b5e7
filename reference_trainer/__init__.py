"""Reference PPO trainer whose rollout loop overlaps policy inference with env stepping."""

from __future__ import annotations

__version__ = "0.1.0"
