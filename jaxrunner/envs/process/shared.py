"""The shared-memory block both sides read and write in place (both sides import it).

Bulk data never crosses a worker's socket: observations, rewards, flags, actions and
each sub-env's step progress live in one anonymous shared block, carved into numpy
views the same way on both sides (:class:`Layout`).
"""

from __future__ import annotations

import dataclasses
import mmap
import os
from typing import Any, NamedTuple

import gymnasium
import numpy as np

from jaxrunner import spaces as jr_spaces
from jaxrunner.envs.sub_envs import StepBuffers

# Each sub-env's step progress (``status``): the main process sets NOT_RUN before it
# sends a step; the worker's step loop sets RUNNING while env.step runs (and leaves it
# after a step that failed) and DONE once the step returned a valid transition (the
# block's transitions are written when all its sub-envs have stepped). When a worker
# dies, these marks tell which of its steps were done and which never ran.
_ALIGN = 64  # a cache line: arrays never share one


class Views(NamedTuple):
    """Numpy views of the shared block (all ``[num_envs, ...]``)."""

    obs: Any
    next_obs: Any
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    action: Any
    status: np.ndarray

    @property
    def step_buffers(self) -> StepBuffers:
        """The buffers the step loop writes."""
        return StepBuffers(self.obs, self.next_obs, self.reward, self.terminated, self.truncated)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each stacked buffer lives in the shared block; both sides compute the
    same offsets from the same spaces and ``num_envs``."""

    observation_space: gymnasium.Space
    action_space: gymnasium.Space
    num_envs: int

    def _carve(self, buffer: Any) -> tuple[Views, int]:
        offset = 0
        n = self.num_envs

        def take(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
            nonlocal offset
            dtype = np.dtype(dtype)
            size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            start = offset
            offset += -(-max(size, 1) // _ALIGN) * _ALIGN
            if buffer is None:
                return np.empty(0, dtype)
            return np.frombuffer(buffer, dtype, int(np.prod(shape)), start).reshape(shape)

        def carve_space(space: gymnasium.Space) -> Any:
            template = jr_spaces.allocate(space, (0,))
            return jr_spaces.map_structure(
                space, lambda leaf: take((n, *leaf.shape[1:]), leaf.dtype), template
            )

        views = Views(
            obs=carve_space(self.observation_space),
            next_obs=carve_space(self.observation_space),
            reward=take((n,), np.float64),
            terminated=take((n,), np.bool_),
            truncated=take((n,), np.bool_),
            action=carve_space(self.action_space),
            status=take((n,), np.int8),
        )
        return views, offset

    @property
    def nbytes(self) -> int:
        return self._carve(None)[1]

    def views(self, buffer: Any) -> Views:
        return self._carve(buffer)[0]


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
