"""Argument checks of the external envs, run before a call touches any state."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from gymnasium import spaces

from jaxrunner._src import space_arrays
from jaxrunner._src.arg_checks import check_int, check_space
from jaxrunner._src.core.agent_groups import AgentGroup
from jaxrunner._src.core.policy import Policy
from jaxrunner._src.services.external.episodes import MAX_EPISODE_ID
from jaxrunner._src.space_arrays import check_value
from jaxrunner.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    SpaceMismatchError,
)

KEY_STEPS = 2**32  # action keys fold in agent step * num_agents + agent index as a uint32


def check_construction(
    observation_space: Any,
    action_space: Any,
    policy: Any,
    seed: Any,
    who: str = "ExternalEnv",
    policy_name: str = "policy",
) -> None:
    """Raises unless the arguments of ``who(...)`` are usable."""
    for name, space in (
        ("observation_space", observation_space),
        ("action_space", action_space),
    ):
        space_arrays.check_supported(check_space(who, name, space), name)
    if not isinstance(policy, Policy):
        raise InvalidArgumentTypeError(
            f"{who}({policy_name}=...): expected a jaxrunner.Policy, got {policy!r}."
        )
    check_int(who, "seed", seed, low=0)


def check_episode_id(episode_id: Any) -> None:
    check_int(
        "start_episode", "episode_id", episode_id, low=0, high=MAX_EPISODE_ID,
        hint="below 2**63", none="to pick a free one",
    )  # fmt: skip


def check_obs(space: spaces.Space, obs: Any, what: str) -> Any:
    """``obs`` checked against ``space``, and finite even where the space is unbounded."""
    obs = check_value(space, obs, what, bounds=False)
    for leaf in jax.tree.leaves(obs):  # first: one wording for NaN and ±inf
        if leaf.dtype.kind in "fc" and not np.isfinite(leaf).all():
            raise SpaceMismatchError(
                f"{what}: expected finite values, got NaN or infinity; observations of "
                "an external env must be finite, even in unbounded dimensions."
            )
    return check_value(space, obs, what, bounds=True)


def check_info(info: Any) -> None:
    if info is not None and not isinstance(info, dict):
        raise InvalidArgumentTypeError(
            f"log_returns(info=...): expected a dict or None, got {type(info).__name__}."
        )


def check_reward(reward: Any, name: str, call: str = "log_returns") -> None:
    if isinstance(reward, (bool, np.bool_)) or not isinstance(
        reward, (int, float, np.integer, np.floating)
    ):
        raise InvalidArgumentTypeError(
            f"{call}({name}={reward!r}): expected a real number, got {type(reward).__name__}."
        )
    try:
        finite = math.isfinite(float(reward))
    except OverflowError:  # an int past float64's range: float() cannot hold it
        finite = False
    if not finite:
        raise InvalidArgumentError(f"{call}({name}={reward!r:.40}): rewards must be finite.")


def check_steps(
    observation_space: spaces.Space,
    action_space: spaces.Space,
    obs: Sequence[Any],
    actions: Sequence[Any],
    rewards: Sequence[Any],
) -> tuple[list[Any], list[Any]]:
    """``log_steps``'s observations and actions, checked with its rewards."""
    if not len(obs) == len(actions) == len(rewards):
        raise InvalidArgumentError(
            f"log_steps(): got {len(obs)} observations, {len(actions)} actions and "
            f"{len(rewards)} rewards; expected one of each per step."
        )
    checked_obs = [check_obs(observation_space, o, f"obs[{t}]") for t, o in enumerate(obs)]
    checked_actions = [
        check_value(action_space, a, f"action[{t}]", bounds=False) for t, a in enumerate(actions)
    ]
    for t, reward in enumerate(rewards):
        check_reward(reward, f"rewards[{t}]", "log_steps")
    return checked_obs, checked_actions


def check_agent_dict(
    value: Any, possible_agents: Collection[str], call: str, name: str, *, empty: bool = False
) -> dict[str, Any]:
    """``value`` (argument ``name`` of ``call``) as a dict keyed by known agent ids."""
    if not isinstance(value, dict):
        raise InvalidArgumentTypeError(
            f"{call}({name}=...): expected a dict {{agent_id: value}}, got {type(value).__name__}."
        )
    for agent in value:
        if not isinstance(agent, str):
            raise InvalidArgumentTypeError(
                f"{call}({name}=...): agent id {agent!r} is not a str; keys are agent ids."
            )
        if agent not in possible_agents:
            raise InvalidArgumentError(
                f"{call}({name}=...): unknown agent {agent!r}; the env's agents are "
                f"{list(possible_agents)}."
            )
    if not value and not empty:
        raise InvalidArgumentError(
            f"{call}({name}={{}}): expected at least one agent; name the agents that act."
        )
    return dict(value)


def check_agent_rewards(rewards: Any, possible_agents: Collection[str]) -> dict[str, Any]:
    rewards = check_agent_dict(rewards, possible_agents, "log_returns", "rewards", empty=True)
    for agent, reward in rewards.items():
        check_reward(reward, f"rewards[{agent!r}]")
    return rewards


def check_agent_spaces(
    observation_spaces: Mapping[str, Any], action_spaces: Mapping[str, Any]
) -> list[str]:
    """The agents of the constructor's two space dicts, the same in both."""
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


def check_key_steps(where: str, max_episode_steps: int, num_agents: int) -> None:
    if max_episode_steps * num_agents >= KEY_STEPS:
        raise InvalidArgumentError(
            f"{where}: max_episode_steps={max_episode_steps} times "
            f"{num_agents} agents must stay below 2**32 (action keys); lower "
            "ExternalEnvConfig.max_episode_steps."
        )


def per_policy(
    name: str, value: Any, ids: tuple[str, ...], *, mapping_only: bool = False
) -> dict[str, Any]:
    """``value`` per policy id: a dict keyed by exactly ``ids``, or one value for all."""
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


def check_logged_actions(
    actions: Any,
    obs: Mapping[str, Any],
    possible_agents: Collection[str],
    group_of: Mapping[str, AgentGroup],
    episode_id: int,
) -> dict[str, Any]:
    """``log_action``'s actions, one per observed agent."""
    actions = check_agent_dict(actions, possible_agents, "log_action", "actions")
    if set(actions) != set(obs):
        raise InvalidArgumentError(
            f"log_action(episode_id={episode_id}): observations for {sorted(obs)}, actions "
            f"for {sorted(actions)}; expected one action per observed agent."
        )
    return {
        a: check_value(group_of[a].action_space, v, f"actions[{a!r}]", bounds=False)
        for a, v in actions.items()
    }
