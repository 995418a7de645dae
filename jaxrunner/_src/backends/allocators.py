"""Where stacked step buffers come from: fresh zeroed arrays (:class:`Zeros`), or views
carved out of one shared-memory block (:class:`Carver`); the buffer classes declare
their layout once, as calls to either."""

from __future__ import annotations

import mmap
import os
from typing import Any

import gymnasium
import numpy as np

from jaxrunner._src import space_arrays

_ALIGN = 64  # a cache line: carved arrays never share one


class Zeros:
    """New zeroed arrays, owned by the caller. Both allocators hand out the arrays of a
    block of ``num_envs`` sub-envs, in the order asked."""

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs

    def take(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An array of ``shape`` (its first axis ``num_envs``)."""
        return np.zeros(shape, dtype)

    def space(self, space: gymnasium.Space, lead: tuple[int, ...] = ()) -> Any:
        """Buffers of ``space``'s values, ``[num_envs, *lead, ...]``."""
        return space_arrays.allocate(space, (self.num_envs, *lead))


class Carver:
    """Carves consecutive, cache-line aligned arrays out of ``buffer`` (None: only
    counts the bytes, in :attr:`offset`, handing out empty arrays)."""

    def __init__(self, buffer: Any, num_envs: int) -> None:
        self.buffer, self.num_envs, self.offset = buffer, num_envs, 0

    def take(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        start = self.offset
        self.offset += -(-max(size, 1) // _ALIGN) * _ALIGN
        if self.buffer is None:
            return np.empty((0, *shape[1:]), dtype)
        return np.frombuffer(self.buffer, dtype, int(np.prod(shape)), start).reshape(shape)

    def space(self, space: gymnasium.Space, lead: tuple[int, ...] = ()) -> Any:
        template = space_arrays.allocate(space, (0,))
        return space_arrays.map_structure(
            space,
            lambda leaf: self.take((self.num_envs, *lead, *leaf.shape[1:]), leaf.dtype),
            template,
        )


Allocator = Zeros | Carver


def create_shared_block(nbytes: int) -> tuple[int, mmap.mmap]:
    """An anonymous shared-memory file (no name to leak) and its mapping."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("jaxrunner-process", os.MFD_CLOEXEC)
    else:  # other Unixes: an unlinked temporary file
        import tempfile

        with tempfile.TemporaryFile() as file:
            fd = os.dup(file.fileno())
    os.ftruncate(fd, nbytes)
    return fd, mmap.mmap(fd, nbytes)
