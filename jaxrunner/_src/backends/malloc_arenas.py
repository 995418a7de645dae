"""glibc's malloc arenas for EnvPool's threads: enough that none shares the sampling
thread's. See docs/backends/envpool.md, "Threads and malloc"."""

from __future__ import annotations

import ctypes
import functools
import os
import sys

M_ARENA_MAX = -8  # glibc's malloc.h
ARENAS = 128
"""glibc's own limit is 8 per CPU: 16 on 2 cores, fewer than the threads of a process with
JAX and a few EnvPool pools (two threads each), so later threads share arenas."""


@functools.cache
def allow_an_arena_per_thread() -> bool:
    """Raises glibc's arena limit to :data:`ARENAS`, once per process (True if it did).

    Each EnvPool pool has a thread that allocates its next state buffers while the
    sampling thread frees the last ones; where the two share an arena, both wait on its
    lock. glibc fixes the limit once a process has more than 8 arenas, so this acts only
    if called before; a user's ``MALLOC_ARENA_MAX`` is left as it is, as are other C
    libraries."""
    if not sys.platform.startswith("linux") or "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):  # musl's mallopt does nothing
            return False
        return bool(libc.mallopt(M_ARENA_MAX, ARENAS))
    except (OSError, AttributeError):
        return False
