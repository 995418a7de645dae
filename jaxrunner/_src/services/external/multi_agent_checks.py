"""Argument checks of :class:`MultiAgentExternalEnv`: its spaces and per-policy dicts, the
action-key bound, and the agent dicts of its calls."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jaxrunner._src.services.external.checks as checks
from jaxrunner._src.core.agent_groups import AgentGroup
from jaxrunner._src.services.external.agents import MultiAgentEpisodeRecord
from jaxrunner._src.space_arrays import check_value
from jaxrunner.errors import EpisodeConflictError, InvalidArgumentError, InvalidArgumentTypeError

KEY_STEPS = 2**32
"""Action keys fold in ``agent step * num_agents + agent index`` as a uint32."""


def check_agent_spaces(
    observation_spaces: Mapping[str, Any], action_spaces: Mapping[str, Any]
) -> list[str]:
    """The agents of the constructor's two space dicts, which must name the same agents."""
    for name, value in (
        ("observation_spaces", observation_spaces),
        ("action_spaces", action_spaces),
    ):
        if not isinstance(value, Mapping):
            raise InvalidArgumentTypeError(
                f"MultiAgentExternalEnv({name}=...): expected a dict agent_id -> space, got "
                f"{type(value).__name__}."
            )
    agents = list(observation_spaces)
    if set(action_spaces) != set(agents):
        raise InvalidArgumentError(
            f"MultiAgentExternalEnv: observation_spaces names the agents {agents}, "
            f"action_spaces {list(action_spaces)}; expected the same agents in both."
        )
    return agents


def check_key_steps(max_episode_steps: int, num_agents: int) -> None:
    """Every agent step of an episode must fit an action key (:data:`KEY_STEPS`)."""
    if max_episode_steps * num_agents >= KEY_STEPS:
        raise InvalidArgumentError(
            f"MultiAgentExternalEnv: max_episode_steps={max_episode_steps} times "
            f"{num_agents} agents must stay below 2**32 (action keys); lower "
            "ExternalEnvConfig.max_episode_steps."
        )


def per_policy(
    name: str, value: Any, ids: tuple[str, ...], *, mapping_only: bool = False
) -> dict[str, Any]:
    """``value`` per policy id: a dict keyed by exactly ``ids``, or (unless
    ``mapping_only``) one value for every id."""
    if isinstance(value, Mapping):
        if set(value) != set(ids):
            raise InvalidArgumentError(
                f"MultiAgentExternalEnv({name}=...): expected a dict keyed by exactly the "
                f"policy ids {list(ids)}, got the keys {list(value)}. Check the keys against "
                "the policy mapping."
            )
        return {pid: value[pid] for pid in ids}
    if mapping_only:
        raise InvalidArgumentTypeError(
            f"MultiAgentExternalEnv({name}=...): expected a dict policy_id -> {name}, got "
            f"{type(value).__name__}; the policy ids are {list(ids)}."
        )
    return dict.fromkeys(ids, value)


def check_agent_obs(
    obs: Any,
    possible_agents: Sequence[str],
    group_of: Mapping[str, AgentGroup],
    what: str,
    *,
    empty: bool = False,
) -> dict[str, Any]:
    """``obs`` of call ``what``: known agents, each observation in its agent's space."""
    obs = checks.check_agent_dict(obs, possible_agents, what, "obs", empty=empty)
    return {
        a: checks.check_obs(group_of[a].observation_space, o, f"obs[{a!r}]") for a, o in obs.items()
    }


def check_logged_actions(
    actions: Any,
    obs: Mapping[str, Any],
    possible_agents: Sequence[str],
    group_of: Mapping[str, AgentGroup],
    episode_id: int,
) -> dict[str, Any]:
    """``log_action``'s actions: one per observed agent, each in its agent's space."""
    actions = checks.check_agent_dict(actions, possible_agents, "log_action", "actions")
    if set(actions) != set(obs):
        raise InvalidArgumentError(
            f"log_action(episode_id={episode_id}): observations for {sorted(obs)}, actions "
            f"for {sorted(actions)}; expected one action per observed agent."
        )
    return {
        a: check_value(group_of[a].action_space, v, f"actions[{a!r}]", bounds=False)
        for a, v in actions.items()
    }


def check_not_ended(live: MultiAgentEpisodeRecord, agents: Mapping[str, Any], what: str) -> None:
    """None of ``agents`` has ended in ``live``."""
    ended = [a for a in agents if a in live.agents and live.agents[a].done]
    if ended:
        raise EpisodeConflictError(
            f"{what}(episode_id={live.episode_id}): agents {ended} have ended in this "
            "episode; an agent that ended neither acts nor gets rewards again. Leave them "
            "out."
        )
