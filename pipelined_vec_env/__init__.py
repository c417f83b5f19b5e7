"""pipelined-vec-env: staged subprocess vector environments that overlap policy inference
with simulator stepping."""

from __future__ import annotations

__version__ = "0.1.0"
