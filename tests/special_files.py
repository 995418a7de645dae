"""Paths that are not regular files (devices, a pipe, a directory), and a check that a
reader refuses one before reading it."""

from __future__ import annotations

import os
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def special_path(special: str, tmp_path: Path) -> Any:
    """``special`` as a path: a device as named (skipped where absent), a new FIFO, or
    a directory."""
    if special.startswith("/dev/") and not os.path.exists(special):
        pytest.skip(f"no {special} here")
    if special == "fifo":
        os.mkfifo(tmp_path / "pipe")
        return tmp_path / "pipe"
    return tmp_path if special == "directory" else special


def refusal_and_peak(read: Callable[[], Any], what: str) -> tuple[BaseException | None, int]:
    """What ``read()`` raised and the peak memory it traced, run on a daemon thread (a
    regression would hang) that must return within 60 s."""
    outcome: list[Any] = []

    def run() -> None:
        tracemalloc.start()
        try:
            read()
        except BaseException as err:
            outcome.append(err)
        else:
            outcome.append(None)
        outcome.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), f"{what} did not return"
    return outcome[0], outcome[1]
