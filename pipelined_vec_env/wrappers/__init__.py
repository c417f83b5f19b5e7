"""Gymnasium wrappers for pipelined rollouts."""

from __future__ import annotations

from .action_chunk import ActionChunk
from .episode_statistics import RecordEpisodeStatistics

__all__ = ["ActionChunk", "RecordEpisodeStatistics"]
