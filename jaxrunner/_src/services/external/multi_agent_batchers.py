"""One :class:`PolicyBatcher` per policy of a :class:`MultiAgentExternalEnv`'s agent groups."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxrunner._src.core.agent_groups import AgentGroup
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.services.external.batching import PolicyBatcher
from jaxrunner._src.services.external.config import ExternalEnvConfig
from jaxrunner._src.services.external.episodes import EpisodeTable


def group_batchers(
    groups: Sequence[AgentGroup],
    policies: Mapping[str, Policy],
    params: Mapping[str, Params],
    seed: int,
    config: ExternalEnvConfig,
    episodes: EpisodeTable,
) -> dict[str, PolicyBatcher]:
    """A batcher per group's policy; those already started are closed if one fails."""
    batchers: dict[str, PolicyBatcher] = {}
    try:
        for group in groups:
            batchers[group.policy_id] = PolicyBatcher(
                policies[group.policy_id],
                params[group.policy_id],
                group.observation_space,
                group.action_space,
                seed,
                max_batch=config.max_batch,
                max_wait_s=config.max_wait_ms / 1000.0,
                buckets=config.bucket_sizes,
                ready_hint=rows_possible(episodes, group.num_agents),
            )
    except BaseException:
        for batcher in batchers.values():
            batcher.close()
        raise
    return batchers


def row_carry(policy: Policy) -> Any:
    """One row's initial recurrent state (numpy), or None if feed-forward."""
    carry = policy.batched_carry(1)
    return None if carry is None else jax.tree.map(lambda c: np.array(c[0]), carry)


def rows_possible(episodes: EpisodeTable, group_size: int) -> Callable[[], int]:
    """A batcher's ``ready_hint``: at most ``group_size`` rows per live episode."""
    return lambda: len(episodes) * group_size
