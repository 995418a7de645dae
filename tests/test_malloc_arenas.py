"""glibc's malloc arena limit, raised for EnvPool's threads (the EnvPool tests check the
backend asks for it)."""

from __future__ import annotations

import ctypes
import sys

import pytest

from jaxrunner._src.backends.malloc_arenas import allow_an_arena_per_thread


def _glibc() -> bool:
    return sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "gnu_get_libc_version")


@pytest.mark.skipif(not _glibc(), reason="glibc's mallopt only")
def test_raises_the_limit_unless_the_user_set_malloc_arena_max(monkeypatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert allow_an_arena_per_thread.__wrapped__() is True  # mallopt answered 1: accepted
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    assert allow_an_arena_per_thread.__wrapped__() is False


def test_does_nothing_off_linux(monkeypatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.setattr(sys, "platform", "darwin")
    assert allow_an_arena_per_thread.__wrapped__() is False
