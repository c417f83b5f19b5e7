"""The pick-and-place expert's earlier import path (`pipelined_vec_env.libero.experts.pick_place`)."""

from __future__ import annotations

from .experts.pick_place import PickPlaceExpert

__all__ = ["PickPlaceExpert"]
