"""The memory budget of the external envs, in bytes."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

import jax
import numpy as np
from gymnasium import spaces

from jaxrunner._src.core.episode import EpisodeSpan
from jaxrunner._src.core.policy import Params, Policy, one_row_args
from jaxrunner._src.samplers.policy_step import apply_output
from jaxrunner.errors import MemoryLimitError

# Object overheads beside the arrays, measured with tracemalloc (CPython 3.11, 64-bit).
ARRAY_OVERHEAD_BYTES = 112  # a numpy array object without its data
STEP_OVERHEAD_BYTES = 384  # per recorded step: extras dict, list slots, reward
EPISODE_OVERHEAD_BYTES = 448  # per finished episode: Episode, extras dict, queue slot
AGENT_RECORD_BYTES = 608  # per agent record of a live episode, beside steps and carry
TRIM_EVERY_BYTES = 8 << 20  # ending an episode hands freed rows back to the OS this often


@functools.cache
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: its allocator returns memory itself
        return None


def release_freed_memory() -> None:
    """Returns freed heap memory to the OS (glibc's ``malloc_trim``), so stacking an
    episode while freeing its small rows does not double the resident memory."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def tree_nbytes(*trees: Any) -> int:
    """The bytes the arrays of ``trees`` take, with their objects."""
    leaves = [leaf for tree in trees for leaf in jax.tree.leaves(tree)]
    return sum(np.asarray(leaf).nbytes + ARRAY_OVERHEAD_BYTES for leaf in leaves)


def step_nbytes(obs: Any, action: Any, extras: Any) -> int:
    """What one recorded step costs."""
    return tree_nbytes(obs, action, extras) + STEP_OVERHEAD_BYTES


def estimate_step_nbytes(
    policy: Policy, params: Params, observation_space: spaces.Space, action_space: spaces.Space
) -> int:
    """What one step of ``policy`` costs before any was recorded, its extras traced
    abstractly (nothing compiled)."""
    args = one_row_args(policy, params, observation_space)
    _, extras, _ = apply_output(jax.eval_shape(policy.apply_fn, *args), args[2], 1)
    row_extras = {k: np.zeros(v.shape[1:], v.dtype) for k, v in dict(extras).items()}
    return step_nbytes(observation_space.sample(), action_space.sample(), row_extras)


def episode_nbytes(episode: EpisodeSpan) -> int:
    """What a finished Episode or AgentEpisode takes (charged until it is polled)."""
    arrays = tree_nbytes(
        episode.obs,  # type: ignore[attr-defined]
        episode.action,  # type: ignore[attr-defined]
        episode.reward,
        episode.extras,  # type: ignore[attr-defined]
    )
    return arrays + EPISODE_OVERHEAD_BYTES


class MemoryBudget:
    """Bytes of live records, finished unpolled episodes and steps being computed,
    together at most ``max_bytes``; each call reserves its steps' bytes when admitted.
    Every method is called with the env's lock held."""

    def __init__(self, max_bytes: int, step_estimate: int, record_nbytes: int) -> None:
        self.max_bytes = max_bytes
        self.live = 0
        self.output = 0
        self.reserved = 0
        self.step_estimate = step_estimate
        self.record_nbytes = record_nbytes

    @property
    def used(self) -> int:
        return self.live + self.output + self.reserved

    def settle(self, reserved: int, grown: int, steps: int) -> None:
        """Replaces a reservation by the ``grown`` bytes of ``steps`` recorded steps;
        the estimate becomes the largest step seen."""
        self.reserved -= reserved
        self.live += grown
        if grown > 0:
            self.step_estimate = max(self.step_estimate, grown // steps)

    def check(self, steps: int, what: str, records: int = 0) -> int:
        """Raises (MemoryLimitError: HTTP 429) unless ``steps`` more steps and ``records``
        new agent records fit now; returns the steps' estimated bytes."""
        need = steps * self.step_estimate
        more = need + records * self.record_nbytes
        if self.used + more > self.max_bytes:
            new = f" and {records} new agent record(s)" if records else ""
            raise MemoryLimitError(
                f"{what}(): {steps} more step(s){new} (~{more} bytes) would take the records "
                f"past max_memory_bytes={self.max_bytes} ({self.live} bytes live, {self.output} "
                f"in finished episodes not yet polled, {self.reserved} reserved for steps being "
                "computed); poll_episodes() or end episodes first, or raise "
                "ExternalEnvConfig.max_memory_bytes."
            )
        return need

    def reserve(self, steps: int, what: str, records: int = 0) -> int:
        """:meth:`check`, then reserves the steps' bytes (returned, for :meth:`settle`)
        and charges the new records to ``live``."""
        need = self.check(steps, what, records)
        self.reserved += need
        self.live += records * self.record_nbytes
        return need
