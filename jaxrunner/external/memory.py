"""The memory budget of an :class:`~jaxrunner.ExternalEnv`: bytes, not just counts.

Counts alone bound nothing useful: 1,024 live episodes of 100,000 steps at ~750 B a
step are 77 GB. So every recorded step is charged its arrays' bytes plus the Python
objects that hold them, and a call that would grow the records past
``max_memory_bytes`` is refused (``MemoryLimitError``, HTTP 429) before anything is
stored. Finished episodes count until they are polled.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxrunner.errors import MemoryLimitError
from jaxrunner.trajectory import Episode

ARRAY_OVERHEAD_BYTES = 112
"""A numpy array object without its data (CPython 3.11, 64-bit)."""
STEP_OVERHEAD_BYTES = 384
"""Per recorded step, beside its arrays: the extras dict, list slots, the reward (with
the arrays about 750 B a CartPole step, the figure issue 16 measured)."""


def tree_nbytes(*trees: Any) -> int:
    """The bytes the arrays of ``trees`` take, with their objects."""
    leaves = [leaf for tree in trees for leaf in jax.tree.leaves(tree)]
    return sum(np.asarray(leaf).nbytes + ARRAY_OVERHEAD_BYTES for leaf in leaves)


def step_nbytes(obs: Any, action: Any, extras: Any) -> int:
    """What one recorded step costs."""
    return tree_nbytes(obs, action, extras) + STEP_OVERHEAD_BYTES


def episode_nbytes(episode: Episode) -> int:
    """What a finished episode's arrays take (charged until it is polled)."""
    return tree_nbytes(episode.obs, episode.action, episode.reward, episode.extras)


class MemoryBudget:
    """Bytes held by live records and by finished, unpolled episodes.

    Args:
        max_bytes: the most both may hold together.
        step_estimate: the cost of one step before any was recorded.
    """

    def __init__(self, max_bytes: int, step_estimate: int) -> None:
        self.max_bytes = max_bytes
        self.live = 0
        self.output = 0
        self.step_estimate = step_estimate

    @property
    def used(self) -> int:
        return self.live + self.output

    def observe_step(self, nbytes: int) -> None:
        """Keeps the estimate at the largest step seen (extras may be larger than
        the spaces suggest)."""
        self.step_estimate = max(self.step_estimate, nbytes)

    def charge(self, grown: int, steps: int) -> None:
        """Charges ``grown`` bytes that live records took for ``steps`` recorded
        steps, and keeps the estimate at the largest step seen."""
        self.live += grown
        if grown > 0:
            self.observe_step(grown // steps)

    def check(self, steps: int, what: str) -> None:
        """Raises unless ``steps`` more steps fit.

        Raises:
            MemoryLimitError: they do not fit now (HTTP 429).
        """
        need = steps * self.step_estimate
        if self.used + need > self.max_bytes:
            raise MemoryLimitError(
                f"{what}(): {steps} more step(s) (~{need} bytes) would take the records past "
                f"max_memory_bytes={self.max_bytes} ({self.live} bytes live, {self.output} in "
                "finished episodes not yet polled); poll_episodes() or end episodes first, or "
                "raise ExternalEnvConfig.max_memory_bytes."
            )


__all__ = ["MemoryBudget", "episode_nbytes", "step_nbytes", "tree_nbytes"]
