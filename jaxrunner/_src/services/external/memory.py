"""The memory budget of an :class:`~jaxrunner.ExternalEnv`, in bytes: each call reserves its
steps' bytes when admitted, so concurrent calls never pass ``max_memory_bytes`` together."""

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
from jaxrunner.errors import MemoryLimitError

ARRAY_OVERHEAD_BYTES = 112
"""A numpy array object without its data (CPython 3.11, 64-bit)."""
STEP_OVERHEAD_BYTES = 384
"""Per recorded step, beside its arrays: the extras dict, list slots, the reward (with
the arrays about 750 B a CartPole step, the figure issue 16 measured)."""
EPISODE_OVERHEAD_BYTES = 448
"""Per finished episode, beside its arrays: the Episode object (~200 B), its extras
dict (~230 B) and its slot in the output queue (CPython 3.11, 64-bit, measured with
tracemalloc). Without it a one-step CartPole episode was charged 616 B of ~1,000."""
AGENT_RECORD_BYTES = 608
"""Per agent record of a live episode, beside its steps and carry: the record, its
lists and its slot in the episode's dict (580 B measured with tracemalloc). An agent
that never acts (only named by ``log_returns`` or ``end_agents``) costs this much."""


TRIM_EVERY_BYTES = 8 << 20
"""Ending an episode hands the freed rows back to the OS after this many bytes."""


@functools.cache
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: its allocator returns memory itself
        return None


def release_freed_memory() -> None:
    """Returns freed heap memory to the OS (glibc's ``malloc_trim``; elsewhere nothing).

    A recorded step's rows are small allocations from the C heap; freeing them keeps
    their pages resident, so stacking an episode (a new large array) while freeing its
    rows would still double the resident memory. Trimming as the copy goes keeps the
    peak near one episode (``benchmarks/serve_episode_end.py``)."""
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
    """What one step of ``policy`` costs before any was recorded: a sample of each
    space and the policy's extras for one row (traced abstractly, nothing compiled),
    so the first step's reservation covers its extras too."""
    _, extras, _ = jax.eval_shape(policy.apply_fn, *one_row_args(policy, params, observation_space))
    row_extras = {k: np.zeros(v.shape[1:], v.dtype) for k, v in dict(extras).items()}
    return step_nbytes(observation_space.sample(), action_space.sample(), row_extras)


def episode_nbytes(episode: EpisodeSpan) -> int:
    """What a finished episode (an Episode or an AgentEpisode) takes, arrays and
    objects (charged until it is polled)."""
    arrays = tree_nbytes(
        episode.obs,  # type: ignore[attr-defined]
        episode.action,  # type: ignore[attr-defined]
        episode.reward,
        episode.extras,  # type: ignore[attr-defined]
    )
    return arrays + EPISODE_OVERHEAD_BYTES


class MemoryBudget:
    """Bytes held by live records (each agent record costs ``record_nbytes`` from its
    agent's first mention until its episode ends) and by finished, unpolled episodes, and
    bytes reserved for steps being computed, together at most ``max_bytes``. Every
    method is called with the env's lock held."""

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
        """Replaces a reservation of ``reserved`` bytes by the ``grown`` bytes that live
        records took for ``steps`` recorded steps; keeps the estimate at the largest
        step seen (extras may be larger than the spaces suggest)."""
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
        """Reserves the bytes of ``steps`` more steps and charges ``records`` new agent
        records to ``live`` (see :meth:`check`); returns the steps' bytes, for
        :meth:`settle`."""
        need = self.check(steps, what, records)
        self.reserved += need
        self.live += records * self.record_nbytes
        return need
