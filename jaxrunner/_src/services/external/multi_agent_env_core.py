"""The core of :class:`~jaxrunner._src.services.external.multi_agent_env.MultiAgentExternalEnv`:
its parts (built from the single-agent ExternalEnv's) wired together, and the internal
steps its public calls share."""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from gymnasium import spaces

import jaxrunner._src.services.external.checks as checks
from jaxrunner._src.core.agent_groups import (
    AgentGroup,
    GroupedAgents,
    PolicyMappingFn,
    build_groups,
)
from jaxrunner._src.core.episode import AgentEpisode
from jaxrunner._src.core.metrics import EpisodeStats
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.services.external.agents import AgentRecord, MultiAgentEpisodeRecord
from jaxrunner._src.services.external.batching import PolicyBatcher, Row
from jaxrunner._src.services.external.config import ExternalEnvConfig
from jaxrunner._src.services.external.episodes import EpisodeRecord, EpisodeTable
from jaxrunner._src.services.external.memory import MemoryBudget, estimate_step_nbytes
from jaxrunner._src.services.external.multi_agent_batchers import group_batchers, row_carry
from jaxrunner._src.services.external.multi_agent_checks import (
    check_agent_obs,
    check_agent_spaces,
    check_key_steps,
    check_not_ended,
    per_policy,
)
from jaxrunner._src.services.external.multi_agent_delivery import MultiAgentDelivery
from jaxrunner._src.services.external.multi_agent_endings import AgentEndings
from jaxrunner._src.services.external.output import EpisodeOutput
from jaxrunner._src.services.external.reaper import Reaper
from jaxrunner._src.services.external.run_thread import RunThread
from jaxrunner.errors import ClosedError, InvalidArgumentError


class MultiAgentExternalCore(GroupedAgents):
    """The state and shared internal steps of a
    :class:`~jaxrunner._src.services.external.multi_agent_env.MultiAgentExternalEnv`, whose
    constructor's arguments are documented there."""

    # The reaper calls the env's public reap() (so a subclass's override is the one run).
    reap: Callable[[float], int]

    def __init__(
        self,
        observation_spaces: Mapping[str, spaces.Space],
        action_spaces: Mapping[str, spaces.Space],
        policies: Policy | Mapping[str, Policy],
        params: Mapping[str, Params],
        *,
        policy_mapping_fn: PolicyMappingFn | None = None,
        seed: int = 0,
        config: ExternalEnvConfig | None = None,
    ) -> None:
        agents = check_agent_spaces(observation_spaces, action_spaces)
        self.groups = build_groups(
            agents, observation_spaces.__getitem__, action_spaces.__getitem__, policy_mapping_fn
        )
        self.config = config = config or ExternalEnvConfig()
        self.policies = per_policy("policies", policies, self.policy_ids)
        initial_params = per_policy("params", params, self.policy_ids, mapping_only=True)
        for group in self.groups:
            checks.check_construction(
                group.observation_space, group.action_space, self.policies[group.policy_id], seed
            )
        self.seed = int(seed)
        check_key_steps(config.max_episode_steps, len(agents))
        self._agent_index = {a: k for k, a in enumerate(agents)}
        self._group_of: dict[str, AgentGroup] = {a: g for g in self.groups for a in g.agents}
        self._lock = threading.Lock()
        self._episodes = EpisodeTable(
            config.max_concurrent, config.max_episodes_per_client, MultiAgentEpisodeRecord
        )
        self._memory = MemoryBudget(
            config.max_memory_bytes,
            max(
                estimate_step_nbytes(
                    self.policies[g.policy_id],
                    initial_params[g.policy_id],
                    g.observation_space,
                    g.action_space,
                )
                for g in self.groups
            ),
        )
        self._output: EpisodeOutput[AgentEpisode] = EpisodeOutput(
            self._lock, self._memory, config.max_output_episodes
        )
        self._stats = EpisodeStats(config.episode_window)
        self._counts: collections.Counter[str] = collections.Counter()
        self._started_at = time.monotonic()
        self._closed = False
        self._initial_carry = {pid: row_carry(p) for pid, p in self.policies.items()}
        self._batchers = group_batchers(
            self.groups, self.policies, initial_params, self.seed, config, self._episodes
        )
        self._delivery = MultiAgentDelivery(self._lock, self._batchers, self._memory, self._counts)
        self._endings = AgentEndings(
            self._lock,
            self._episodes,
            self._memory,
            self._counts,
            self._stats,
            self.groups,
            self._emit,
        )
        self._reaper = (
            None
            if config.episode_timeout_s is None
            else Reaper(config.episode_timeout_s, self.reap)
        )
        self._run_thread = RunThread()

    def _check_obs(self, obs: Any, what: str, *, empty: bool = False) -> dict[str, Any]:
        return check_agent_obs(obs, self.possible_agents, self._group_of, what, empty=empty)

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise ClosedError(
                f"MultiAgentExternalEnv.{what}() called after close(); create a new one."
            )

    def _get_live(self, episode_id: Any, what: str) -> MultiAgentEpisodeRecord:
        """The live, idle episode ``episode_id`` (caller holds the lock)."""
        self._check_open(what)
        return _multi_agent(self._episodes.get_idle(episode_id, what))

    def _record(self, live: MultiAgentEpisodeRecord, agent: str) -> AgentRecord:
        group = self._group_of[agent]
        carry = self._initial_carry[group.policy_id]
        return live.agent(group, agent, self._agent_index[agent], carry)

    def _submit(
        self, episode_id: int, obs: dict[str, Any], actions: dict[str, Any] | None, what: str
    ) -> concurrent.futures.Future:
        """Claims the episode and requests one step per agent of ``obs``: sampled if
        ``actions`` is None, else logged."""
        limit, num_agents = self.config.max_episode_steps, len(self.possible_agents)
        with self._lock:
            live = self._get_live(episode_id, what)
            check_not_ended(live, obs, what)
            full = [a for a in obs if a in live.agents and live.agents[a].num_actions >= limit]
            if full:
                raise InvalidArgumentError(
                    f"{what}(episode_id={episode_id}): agents {full} would exceed "
                    f"max_episode_steps={limit}; end them (truncated=True)."
                )
            live.reserved = self._memory.reserve(len(obs), what)
            parts: dict[str, list[tuple[AgentRecord, Row]]] = {}
            for agent, agent_obs in obs.items():
                record = self._record(live, agent)
                step = record.num_actions * num_agents + record.index  # unique per agent
                action = None if actions is None else actions[agent]
                row = Row(agent_obs, action, live.episode_id, step, record.carry)
                parts.setdefault(record.policy_id, []).append((record, row))
            live.busy = True
            live.last_seen = time.monotonic()
        return self._delivery.submit(live, parts)

    def _emit(self, record: EpisodeRecord, episode: AgentEpisode | None) -> None:
        """Outputs an ended agent's episode (caller holds the lock); None: it never acted."""
        if episode is None or not record.training_enabled:
            return
        self._counts["num_training_episodes"] += 1
        self._counts["num_dropped_steps"] += self._output.put(episode)

    def _batcher(self, policy_id: Any, what: str) -> PolicyBatcher:
        batcher = self._batchers.get(policy_id) if isinstance(policy_id, str) else None
        if batcher is None:
            raise InvalidArgumentError(
                f"{what}(policy_id={policy_id!r}): unknown policy id; the env's policies are "
                f"{list(self.policy_ids)}."
            )
        return batcher


def _multi_agent(live: EpisodeRecord) -> MultiAgentEpisodeRecord:
    """``live`` as the multi-agent record it is (the table makes only those)."""
    return cast(MultiAgentEpisodeRecord, live)
