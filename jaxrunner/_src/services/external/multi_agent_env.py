"""MultiAgentExternalEnv (RLlib's ExternalMultiAgentEnv): the external env core's calls with
``{agent_id: value}`` dicts, agents batched per policy."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from gymnasium import spaces

import jaxrunner._src.services.external.checks as checks
from jaxrunner._src.arg_checks import check_bool
from jaxrunner._src.core.agent_groups import PolicyMappingFn, build_groups
from jaxrunner._src.core.episode import AgentEpisode, Episode
from jaxrunner._src.core.params import refuse_params_by_policy_id
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.services.external.config import ExternalEnvConfig
from jaxrunner._src.services.external.core import ExternalEnvCore
from jaxrunner._src.services.external.delivery import wait_for
from jaxrunner._src.services.external.episodes import AgentRecord


class MultiAgentExternalEnv(ExternalEnvCore[AgentEpisode]):
    """Serves policies to multi-agent episodes stepped elsewhere (see docs/serving.md).

    Args:
        observation_spaces: ``agent_id -> space``, every agent that may appear, in the
            env's agent order (PettingZoo's ``possible_agents``).
        action_spaces: ``agent_id -> space``, the same agents.
        policies: one :class:`~jaxrunner.Policy` for every policy id, or a dict keyed
            by exactly the policy ids.
        params: ``policy_id -> params``, exactly the policy ids.
        policy_mapping_fn: ``agent_id -> policy_id``; None: one policy per distinct
            pair of spaces (:func:`~jaxrunner.multi_agent.default_policy_mapping`).
        seed: an agent's action key derives from it, the episode id, the agent and
            its step, so the same calls get the same actions whatever the batching.
        config: limits and batching (:class:`ExternalEnvConfig`), per policy for
            batching; ``max_episode_steps`` bounds each agent's actions.

    Subclass and override :meth:`run` to drive episodes from a thread of your own,
    started with :meth:`start`.
    """

    multi_agent: ClassVar[Literal[True]] = True
    """The kind of env (see :attr:`RunDriven.multi_agent`): agents in policy groups."""

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
        agents = checks.check_agent_spaces(observation_spaces, action_spaces)
        groups = build_groups(
            agents, observation_spaces.__getitem__, action_spaces.__getitem__, policy_mapping_fn
        )
        ids = tuple(g.policy_id for g in groups)
        self.policies = checks.per_policy("policies", policies, ids)
        initial_params = checks.per_policy("params", params, ids, mapping_only=True)
        for group in groups:
            pid = group.policy_id
            checks.check_construction(
                group.observation_space,
                group.action_space,
                self.policies[pid],
                seed,
                "MultiAgentExternalEnv",
                f"policies[{pid!r}]",
            )
        super().__init__(groups, self.policies, initial_params, seed, config)

    @classmethod
    def from_pettingzoo(
        cls,
        env: Any,
        policies: Policy | Mapping[str, Policy],
        params: Mapping[str, Params],
        **kwargs: Any,
    ) -> MultiAgentExternalEnv:
        """The env for the agents of a PettingZoo env (parallel or AEC): its
        ``possible_agents`` and their spaces; ``kwargs`` as for the constructor."""
        agents = list(env.possible_agents)
        return cls(
            {a: env.observation_space(a) for a in agents},
            {a: env.action_space(a) for a in agents},
            policies,
            params,
            **kwargs,
        )

    def get_action(self, episode_id: int, obs: dict[str, Any]) -> dict[str, Any]:
        """The policies' actions for ``obs`` (``{agent_id: obs}``, the agents that act
        now), as ``{agent_id: action}``. Blocks until every action is computed.

        Raises:
            InvalidArgumentError: an unknown agent, or none.
            SpaceMismatchError: an observation does not fit its agent's space.
            EpisodeNotFoundError: no such live episode (``ended=True`` if it ended).
            EpisodeConflictError: a call for the episode is in flight, or an agent has
                ended.
            MemoryLimitError: the steps would pass ``max_memory_bytes``.
            TimeoutError: the actions took longer than ``action_timeout_s`` (withdrawn,
                nothing recorded).
        """
        return wait_for(self.submit_action(episode_id, obs), self.config.action_timeout_s)

    def log_action(self, episode_id: int, obs: dict[str, Any], actions: dict[str, Any]) -> None:
        """Records that ``actions`` (``{agent_id: action}``, the same agents as ``obs``),
        chosen elsewhere, were taken at ``obs`` (off-policy); stored as given, with
        their log-probs under the current params. Blocks until recorded."""
        wait_for(self.submit_log_action(episode_id, obs, actions), self.config.action_timeout_s)

    def submit_action(self, episode_id: int, obs: dict[str, Any]) -> concurrent.futures.Future:
        """Like :meth:`get_action`, without waiting: the future resolves to the actions."""
        return self._submit(episode_id, self._check_obs(obs, "get_action"), None, "get_action")

    def submit_log_action(
        self, episode_id: int, obs: dict[str, Any], actions: dict[str, Any]
    ) -> concurrent.futures.Future:
        """Like :meth:`log_action`, without waiting: the future resolves to ``{}``."""
        obs = self._check_obs(obs, "log_action")
        actions = checks.check_logged_actions(
            actions, obs, self._agent_index, self._group_of, episode_id
        )
        return self._submit(episode_id, obs, actions, "log_action")

    def log_returns(
        self, episode_id: int, rewards: dict[str, float], info: dict[str, Any] | None = None
    ) -> None:
        """Adds each agent's reward (``{agent_id: reward}``) to the reward of its latest
        action; before its first action, onto that action (an agent that ends without
        one: to ``get_metrics()["unassigned_reward"]``). ``info`` as for
        :meth:`ExternalEnv.log_returns <jaxrunner.ExternalEnv.log_returns>` (RLlib's
        ``info_dict``): a dict or None, not stored.

        Raises:
            EpisodeConflictError: an agent has ended (its rewards belong before
                ``end_agents``), or a call for the episode is in flight.
        """
        rewards = checks.check_agent_rewards(rewards, self._agent_index)
        checks.check_info(info)
        with self._lock:
            live = self._get_live(episode_id, "log_returns", rewards)
            call = f"log_returns(episode_id={episode_id})"
            totals = {  # an agent new to the episode has nothing to overflow yet
                a: live.agents[a].reward_plus(float(r), call, f"agent {a!r}'s")
                if a in live.agents
                else float(r)
                for a, r in rewards.items()
            }
            # All checked first: a refusal adds no reward and no agent record.
            self._join(live, list(rewards), "log_returns")
            for agent, total in totals.items():
                live.agents[agent].pending_reward = total
            live.last_seen = time.monotonic()

    def end_agents(self, episode_id: int, obs: dict[str, Any], *, truncated: bool = False) -> None:
        """Ends the agents of ``obs`` (``{agent_id: final_obs}``) while the episode goes
        on: terminated, or truncated (bootstrap from the final observation). Each agent
        that acted is output as an AgentEpisode; none of them may act again in this
        episode. One not yet in the episode is recorded as ended, so it cannot join
        later: charged to ``max_memory_bytes`` as every agent a call names (past it,
        ``MemoryLimitError``, nothing ended)."""
        obs = self._check_obs(obs, "end_agents")
        check_bool("end_agents", "truncated", truncated)
        with self._lock:
            live = self._get_live(episode_id, "end_agents", obs)
            self._join(live, list(obs), "end_agents")
            ended = [self._endings.close(live.agents[a], obs[a]) for a in obs]
        self._endings.finish(ended, truncated)

    def end_episode(self, episode_id: int, obs: dict[str, Any], *, truncated: bool = False) -> None:
        """Ends the episode: every agent that acted and has not ended needs its final
        observation in ``obs`` (``{agent_id: final_obs}``; others may be given too and
        only get checked); each ends terminated, or truncated.

        Raises:
            InvalidArgumentError: an agent that acted has no final observation (nothing
                changes: pass it, or end that agent first with :meth:`end_agents`).
        """
        obs = self._check_obs(obs, "end_episode", empty=True)
        self._end(episode_id, obs, truncated, "end_episode")

    def set_params(self, params: Params, policy_id: str | None = None) -> int:
        """Replaces ``policy_id``'s params (None: the env's one policy) from its next
        batch on (never recompiles); returns their new version. (The arguments of every
        runner's ``set_params``.)"""
        what = f"{type(self).__name__}.set_params(params, {policy_id!r})"
        batcher = self._batcher(policy_id, "set_params")
        refuse_params_by_policy_id(params, self.policy_ids, batcher.get_params()[0], what)
        return batcher.set_params(params, what)

    def get_params(self, policy_id: str | None = None) -> tuple[Params, int]:
        """``policy_id``'s current params (None: the env's one policy) and their version
        (0: those given first)."""
        return self._batcher(policy_id, "get_params").get_params()

    def get_spaces(self) -> dict[str, dict[str, spaces.Space]]:
        """Each policy id's one-agent observation and action spaces, by policy id (as a
        multi-agent ``EnvRunner.get_spaces()``)."""
        return {
            "observation_space": {g.policy_id: g.observation_space for g in self.groups},
            "action_space": {g.policy_id: g.action_space for g in self.groups},
        }

    def get_metrics(self) -> dict[str, Any]:
        """As :meth:`ExternalEnv.get_metrics <jaxrunner.ExternalEnv.get_metrics>`, with
        ``num_env_steps`` counting action calls (env steps), ``num_agent_steps`` the
        agent transitions of ended agent episodes, ``num_episodes`` and the episode
        statistics agent episodes, ``num_ended_episodes`` env episodes,
        ``unassigned_reward`` also the rewards logged to agents that ended without an
        action (as the multi-agent runner's), batch counts summed over the policies and
        ``params_version`` per policy id. ``memory_bytes`` counts every agent named in
        a live episode, acting or not."""
        metrics = self._metrics("num_env_steps", "num_agent_steps", "num_ended_episodes")
        metrics["params_version"] = {pid: b.get_params()[1] for pid, b in self._batchers.items()}
        return metrics

    def _check_obs(self, obs: Any, what: str, *, empty: bool = False) -> dict[str, Any]:
        obs = checks.check_agent_dict(obs, self._agent_index, what, "obs", empty=empty)
        return {
            a: checks.check_obs(self._group_of[a].observation_space, o, f"obs[{a!r}]")
            for a, o in obs.items()
        }

    def _as_output(self, record: AgentRecord, episode: Episode) -> AgentEpisode:
        return record.to_agent_episode(episode)
