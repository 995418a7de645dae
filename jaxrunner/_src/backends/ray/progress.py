"""The step progress marks the env actors share with the driver (the process backend's
``status``), so that the steps of a dead or hung actor are counted lost or unrun exactly."""

from __future__ import annotations

import mmap
import os
from typing import NamedTuple

import numpy as np

from jaxrunner._src.backends.allocators import create_shared_block
from jaxrunner._src.backends.sub_env_block import DONE, NOT_RUN

TOKEN_BYTES = 16


def _carve(memory: mmap.mmap, num_units: int, num_envs: int) -> tuple[np.ndarray, np.ndarray]:
    """Each actor's attached flag and each sub-env's mark, after the token."""
    flags = np.frombuffer(memory, np.int8, num_units, TOKEN_BYTES)
    return flags, np.frombuffer(memory, np.int8, num_envs, TOKEN_BYTES + num_units)


class SharedMarks(NamedTuple):
    """Where actor ``unit`` finds the marks: a path that opens the driver's memory on the
    driver's machine only, and the token that proves it is that memory."""

    path: str
    token: bytes
    num_units: int
    num_envs: int
    unit: int


def attach(where: SharedMarks | None) -> np.ndarray | None:
    """Actor side: the marks of every sub-env (by global index), with this actor's
    attached flag set; None where the driver's memory cannot be opened."""
    if where is None:
        return None
    nbytes = TOKEN_BYTES + where.num_units + where.num_envs
    try:
        fd = os.open(where.path, os.O_RDWR)
    except OSError:  # another machine, or /proc not readable: no shared marks
        return None
    try:
        if os.fstat(fd).st_size != nbytes:
            return None
        memory = mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)
    if memory[:TOKEN_BYTES] != where.token:  # not the driver's memory
        memory.close()
        return None
    flags, marks = _carve(memory, where.num_units, where.num_envs)
    flags[where.unit] = 1
    return marks


class ProgressMarks:
    """Driver side: a token, each actor's attached flag and each sub-env's mark
    (``NOT_RUN`` set here before a send, ``RUNNING``/``DONE`` set by the actor's block),
    in an anonymous shared-memory file that actors on this machine open through
    ``/proc``. Where they cannot (another node, no ``/proc``), a dead actor's steps in
    flight count as neither lost nor unrun."""

    def __init__(self, num_units: int, num_envs: int) -> None:
        self.num_units, self.num_envs = num_units, num_envs
        self._fd, self._memory = create_shared_block(TOKEN_BYTES + num_units + num_envs)
        self._token = os.urandom(TOKEN_BYTES)
        self._memory[:TOKEN_BYTES] = self._token
        self.flags, self.marks = _carve(self._memory, num_units, num_envs)
        self._path: str | None = f"/proc/{os.getpid()}/fd/{self._fd}"

    def where(self, unit: int) -> SharedMarks | None:
        """What actor ``unit`` is given (None: closed); a new actor of the unit must
        attach again."""
        if self._path is None:
            return None
        self.flags[unit] = 0
        return SharedMarks(self._path, self._token, self.num_units, self.num_envs, unit)

    def count(self, unit: int, rows: slice) -> tuple[int, int]:
        """Of ``rows``, a dead actor's step: how many sub-envs had completed it (their
        results lost) and how many never started it; (0, 0) where the actor did not
        share its marks."""
        if not self.flags[unit]:
            return 0, 0
        marks = self.marks[rows]
        return int(np.count_nonzero(marks == DONE)), int(np.count_nonzero(marks == NOT_RUN))

    def close(self) -> None:
        if self._path is not None:
            self._path = None
            # The views go first: a memory map with views on it cannot close.
            self.flags, self.marks = np.zeros_like(self.flags), np.zeros_like(self.marks)
            self._memory.close()
            os.close(self._fd)
