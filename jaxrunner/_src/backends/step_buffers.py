"""The stacked buffers a block of sub-envs writes its step into, their
:class:`~jaxrunner._src.backends.batch_step.BatchStep` views, and the failed slot."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.allocators import Allocator, Zeros
from jaxrunner._src.backends.batch_step import BatchStep


class StepBuffers:
    """The stacked buffers a step writes (all ``[num_envs, ...]``, by global index), and
    their views per block of rows (made once: a consumer can tell a step of the same
    buffers by identity)."""

    __slots__ = ("_blocks", "next_obs", "obs", "reward", "terminated", "truncated")

    def __init__(
        self,
        obs: Any,
        next_obs: Any,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
    ) -> None:
        self.obs, self.next_obs = obs, next_obs
        self.reward, self.terminated, self.truncated = reward, terminated, truncated
        self._blocks: dict[tuple[int, int], tuple[Any, ...]] = {}

    @classmethod
    def allocate(
        cls, obs_space: gymnasium.Space, num_envs: int, alloc: Allocator | None = None
    ) -> StepBuffers:
        """Buffers for ``num_envs`` sub-envs from ``alloc`` (default: new zeroed ones)."""
        alloc = alloc or Zeros(num_envs)
        return cls(
            alloc.space(obs_space),
            alloc.space(obs_space),
            alloc.take((num_envs,), np.float64),
            alloc.take((num_envs,), np.bool_),
            alloc.take((num_envs,), np.bool_),
        )

    def batch_step(
        self,
        obs_space: gymnasium.Space,
        rows: slice | None,
        infos: list[dict[str, Any]],
        reset_infos: dict[int, dict[str, Any]],
        failed: np.ndarray | None = None,
        errors: dict[int, BaseException] | None = None,
    ) -> BatchStep:
        """Rows ``rows``' results as a :class:`BatchStep` of views (``env_ids`` is
        ``rows``); None: the buffers themselves, every env."""
        if rows is None:  # the buffers themselves: the same arrays every step
            views: tuple[Any, ...] = (
                self.obs, self.next_obs, self.reward, self.terminated, self.truncated
            )  # fmt: skip
        else:
            views = self._blocks.get((rows.start, rows.stop))  # type: ignore[assignment]
            if views is None:
                views = self._blocks[rows.start, rows.stop] = (
                    space_arrays.rows(obs_space, self.obs, rows),
                    space_arrays.rows(obs_space, self.next_obs, rows),
                    self.reward[rows], self.terminated[rows], self.truncated[rows],
                )  # fmt: skip
        obs, next_obs, reward, terminated, truncated = views
        return BatchStep(
            obs, next_obs, reward, terminated, truncated, infos, reset_infos, failed, errors, rows
        )

    def merge(self, obs_space: gymnasium.Space, results: Sequence[BatchStep]) -> BatchStep:
        """Results of contiguous blocks (``env_ids`` slices, in order) as one BatchStep
        whose ``env_ids`` is an int array; its arrays are copies from these buffers."""
        ids = np.concatenate([np.arange(block.start, block.stop) for block in map(span, results)])
        failed = [
            np.zeros(len(r.reward), np.bool_) if r.failed is None else r.failed for r in results
        ]
        errors = {i: e for r in results for i, e in (r.errors or {}).items()}
        return BatchStep(
            space_arrays.take(obs_space, self.obs, ids),
            space_arrays.take(obs_space, self.next_obs, ids),
            self.reward[ids],
            self.terminated[ids],
            self.truncated[ids],
            [info for r in results for info in r.infos],
            {i: info for r in results for i, info in r.reset_infos.items()},
            np.concatenate(failed) if any(r.failed is not None for r in results) else None,
            errors or None,
            ids,
        )


def span(result: BatchStep) -> slice:
    """The contiguous envs of a block's result (blocks report theirs as a slice)."""
    if not isinstance(result.env_ids, slice):
        raise TypeError(
            f"expected a block's result, whose env_ids is a slice; got {result.env_ids!r}"
        )
    return result.env_ids


def fail_slot(buffers: StepBuffers, space: gymnasium.Space, index: int | slice) -> None:
    """Sub-envs ``index``' slots of the step under way hold no transition: reward 0,
    no flags, ``next_obs = obs`` (by then the reset observation of the new sub-env).
    The one failed-slot helper of every backend."""
    buffers.reward[index], buffers.terminated[index], buffers.truncated[index] = 0.0, False, False
    space_arrays.copy_into(
        space, buffers.next_obs, space_arrays.rows(space, buffers.obs, index), index
    )
