"""Keeping this process's threads off the CPUs a backend's threads are pinned to (EnvPool's
``thread_affinity_offset``) while the sampler runs, so that the policy, JAX's threads and
the sampler's Python do not preempt the env threads (Linux; elsewhere nothing moves)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Set


def _threads() -> list[int]:
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:  # not Linux
        return []


@contextlib.contextmanager
def kept_off(cpus: Set[int]) -> Iterator[None]:
    """Moves every thread of this process that may run on ``cpus`` and elsewhere off
    ``cpus`` for the block, then moves it back. Threads allowed only on ``cpus`` (the
    pinned ones) stay; threads started in the block inherit their starter's CPUs, and
    those that still run after it get the calling thread's CPUs back."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        yield
        return
    home = os.sched_getaffinity(0)
    moved: dict[int, set[int]] = {}
    before = _threads()
    for tid in before:
        with contextlib.suppress(OSError):  # (a thread may end meanwhile)
            allowed = os.sched_getaffinity(tid)
            if allowed - cpus and allowed & cpus:
                os.sched_setaffinity(tid, allowed - cpus)
                moved[tid] = allowed
    try:
        yield
    finally:
        started = set(_threads()).difference(before)
        for tid in started:
            with contextlib.suppress(OSError):
                if os.sched_getaffinity(tid) == home - cpus:
                    moved[tid] = home
        for tid, allowed in moved.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, allowed)
