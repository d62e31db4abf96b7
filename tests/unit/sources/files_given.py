"""What the file sources' unit tests share: seeds, and files aged into the past."""

from __future__ import annotations

import os
import time
from pathlib import Path

SEEDS = [1, 2, 3, 4, 5, 6, 7, 8]
OLD = time.time_ns() - 3600 * 10**9  # an hour ago: old enough for a listing to be trusted


def age(path: Path, tick: int) -> None:
    """Set a distinct modification time in the past (each write gets its own)."""
    os.utime(path, ns=(OLD + tick * 1000, OLD + tick * 1000))
