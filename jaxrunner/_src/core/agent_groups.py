"""Agent groups and the policy mapping: the agents one policy id serves, with one
observation and one action space (never padded together), stacked along an agent axis in
the order of the env's ``possible_agents``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from gymnasium import spaces

from jaxrunner._src import space_arrays
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError, SpaceMismatchError

PolicyMappingFn = Callable[[str], str]
"""``agent_id -> policy_id``."""

DEFAULT_POLICY_ID = "default_policy"
"""The policy id of a single-agent env's one policy (RLlib's name for it)."""
ONE_AGENT = "agent_0"
"""The agent id of a single-agent env's one agent."""


@dataclasses.dataclass(frozen=True)
class AgentGroup:
    """The agents one policy serves, stacked along an agent axis of size ``len(agents)``."""

    policy_id: str
    """The policy that acts for every agent of the group."""
    agents: tuple[str, ...]
    """Agent ids, in the order of their slots on the agent axis."""
    observation_space: spaces.Space
    """One agent's observation space (shared by the group)."""
    action_space: spaces.Space
    """One agent's action space (shared by the group)."""

    @property
    def num_agents(self) -> int:
        """A_g, the size of the group's agent axis."""
        return len(self.agents)

    @classmethod
    def one_agent(cls, observation_space: spaces.Space, action_space: spaces.Space) -> AgentGroup:
        """A single-agent env's one group: its one agent, acting for the default policy."""
        return cls(DEFAULT_POLICY_ID, (ONE_AGENT,), observation_space, action_space)


class GroupedAgents:
    """What a multi-agent env's groups say about it (its policy ids and agents), shared
    by every multi-agent vector env."""

    groups: tuple[AgentGroup, ...]
    """The agent groups, one per policy id."""

    @property
    def policy_ids(self) -> tuple[str, ...]:
        """The groups' policy ids, in group order."""
        return tuple(g.policy_id for g in self.groups)

    @property
    def possible_agents(self) -> tuple[str, ...]:
        """Every agent id, group by group, in agent-axis order."""
        return tuple(a for g in self.groups for a in g.agents)


def default_policy_mapping(
    possible_agents: Sequence[str],
    observation_space: Callable[[str], spaces.Space],
    action_space: Callable[[str], spaces.Space],
) -> dict[str, str]:
    """One shared policy per distinct (observation space, action space) pair, named
    ``policy_0``, ``policy_1``, ... in the order of each pair's first agent."""
    ids: list[tuple[spaces.Space, spaces.Space]] = []
    mapping = {}
    for agent in possible_agents:
        key = (observation_space(agent), action_space(agent))
        if key not in ids:
            ids.append(key)
        mapping[agent] = f"policy_{ids.index(key)}"
    return mapping


def build_groups(
    possible_agents: Sequence[str],
    observation_space: Callable[[str], spaces.Space],
    action_space: Callable[[str], spaces.Space],
    policy_mapping_fn: PolicyMappingFn | None = None,
) -> tuple[AgentGroup, ...]:
    """The groups of ``possible_agents`` under ``policy_mapping_fn`` (None: the
    default mapping, :func:`default_policy_mapping`), in order of their first agent.

    Raises:
        SpaceMismatchError: two agents mapped to one policy have different spaces.
        InvalidArgumentError: the mapping raises, or returns something other than a str.
        InvalidArgumentTypeError: the mapping is not callable.
    """
    agents = list(possible_agents)
    if not agents:
        raise InvalidArgumentError(
            "multi-agent env: possible_agents is empty; expected at least one agent id."
        )
    if policy_mapping_fn is None:
        default = default_policy_mapping(agents, observation_space, action_space)
        policy_mapping_fn = default.__getitem__
    elif not callable(policy_mapping_fn):
        raise InvalidArgumentTypeError(
            f"policy_mapping_fn={policy_mapping_fn!r:.80}: expected a function agent_id -> "
            "policy_id (str), or None for one policy per distinct pair of spaces; got "
            f"{type(policy_mapping_fn).__name__}."
        )
    members: dict[str, list[str]] = {}
    for agent in agents:
        try:
            policy_id = policy_mapping_fn(agent)
        except Exception as err:
            raise InvalidArgumentError(
                f"policy_mapping_fn({agent!r}) raised {type(err).__name__}: {err}; it must map "
                "every possible agent id to a policy id (str)."
            ) from err
        if not isinstance(policy_id, str):
            raise InvalidArgumentError(
                f"policy_mapping_fn({agent!r}) returned {policy_id!r}; expected a policy id (str)."
            )
        members.setdefault(policy_id, []).append(agent)
    groups = []
    for policy_id, group_agents in members.items():
        obs_space = observation_space(group_agents[0])
        act_space = action_space(group_agents[0])
        for agent in group_agents[1:]:
            for name, expected, got in (
                ("observation", obs_space, observation_space(agent)),
                ("action", act_space, action_space(agent)),
            ):
                if got != expected:
                    raise SpaceMismatchError(
                        f"policy_mapping_fn maps agents {group_agents[0]!r} and {agent!r} to "
                        f"policy {policy_id!r}, but their {name} spaces differ ({expected} vs "
                        f"{got}). A policy serves agents of one observation and action space: "
                        "map them to different policy ids."
                    )
        space_arrays.check_supported(obs_space, f"observation_space({group_agents[0]!r})")
        space_arrays.check_supported(act_space, f"action_space({group_agents[0]!r})")
        groups.append(AgentGroup(policy_id, tuple(group_agents), obs_space, act_space))
    return tuple(groups)


@dataclasses.dataclass(frozen=True)
class AgentsDescription:
    """What a PettingZoo env is, as a process worker reports it (picklable, comparable):
    its agents, their spaces and its API."""

    possible_agents: tuple[str, ...]
    observation_spaces: tuple[spaces.Space, ...]
    action_spaces: tuple[spaces.Space, ...]
    turn_based: bool
    """An ``AECEnv`` (one agent acts per step), not a ``ParallelEnv``."""

    def groups(self, policy_mapping_fn: PolicyMappingFn | None) -> tuple[AgentGroup, ...]:
        """The env's agent groups under ``policy_mapping_fn`` (see :func:`build_groups`)."""
        index = {a: k for k, a in enumerate(self.possible_agents)}
        return build_groups(
            self.possible_agents,
            lambda a: self.observation_spaces[index[a]],
            lambda a: self.action_spaces[index[a]],
            policy_mapping_fn,
        )


def describe_agents(env: Any) -> AgentsDescription:
    """``env``'s :class:`AgentsDescription`."""
    from pettingzoo.utils.env import AECEnv

    agents = tuple(env.possible_agents)
    return AgentsDescription(
        agents,
        tuple(env.observation_space(a) for a in agents),
        tuple(env.action_space(a) for a in agents),
        isinstance(env, AECEnv),
    )
