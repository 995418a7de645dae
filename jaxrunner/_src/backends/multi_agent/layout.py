"""Where each agent of a multi-agent sub-env lives in the group buffers: its group and slot,
and the views of its row the step loop writes through."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.steps import GroupBuffers
from jaxrunner._src.core.agent_groups import AgentGroup
from jaxrunner.errors import EnvError


class Layout:
    """Where each agent lives: its group's buffers and its slot on the agent axis.
    Buffer rows ``0..n-1`` are sub-envs ``offset..offset+n-1`` (errors name them so)."""

    def __init__(
        self, groups: Sequence[AgentGroup], buffers: Sequence[GroupBuffers], offset: int = 0
    ) -> None:
        self.groups = tuple(groups)
        self.buffers = tuple(buffers)
        self.offset = offset
        self.slot: dict[str, tuple[int, int]] = {}
        for g, group in enumerate(self.groups):
            for a, agent in enumerate(group.agents):
                self.slot[agent] = (g, a)
        self.obs_apart = False
        """A driver wrote an observation to act on that is no transition's ``next_obs`` (a
        reset's, an agent's that appeared) since the step loop last cleared this: only
        then can ``obs`` hold values the ``next_obs`` check has not seen."""
        self.row_names = [self._row_names(group) for group in self.groups]
        """Per group, ``where(row)``: names a flat ``[B * A_g]`` row by sub-env and agent."""
        self.writers = [
            (
                space_arrays.make_writer(group.observation_space, buf.obs_rows, "obs", where),
                space_arrays.make_writer(
                    group.observation_space, buf.next_obs_rows, "next_obs", where
                ),
            )
            for group, buf, where in zip(self.groups, self.buffers, self.row_names)
        ]

    def _row_names(self, group: AgentGroup) -> Any:
        agents, offset = group.agents, self.offset
        return lambda row: agent_label(offset + row // len(agents), agents[row % len(agents)])


class AgentSlot:
    """One agent's place in one env's row of the buffers, resolved once (the step loop
    writes through these views per agent and step)."""

    __slots__ = (
        "a",
        "acting",
        "completed",
        "g",
        "obs_rows",
        "reward",
        "row",
        "start",
        "terminated",
        "truncated",
        "write_next",
        "write_obs",
    )

    def __init__(self, layout: Layout, agent: str, b: int) -> None:
        slot = layout.slot.get(agent)
        if slot is None:
            raise unknown_agent(layout, layout.offset + b, agent)
        self.g, self.a = g, a = slot
        self.row = b * layout.groups[g].num_agents + a
        buf = layout.buffers[g]
        self.write_obs, self.write_next = layout.writers[g]
        self.acting, self.start = buf.acting[b], buf.agent_start[b]
        self.completed, self.reward = buf.completed[b], buf.reward[b]
        self.terminated, self.truncated = buf.terminated[b], buf.truncated[b]
        # A plain array buffer: an observation already checked by ``write_next`` is
        # copied in without a second check.
        self.obs_rows = buf.obs_rows if isinstance(buf.obs_rows, np.ndarray) else None


def unknown_agent(layout: Layout, env_index: int, agent: Any) -> EnvError:
    """The error for an agent id the env never declared."""
    return EnvError(
        f"sub-env {env_index}: agent {agent!r} is not among possible_agents "
        f"{list(layout.slot)}; a multi-agent env must declare every agent it may have "
        "in possible_agents.",
        env_index,
    )


def agent_label(env_index: int, agent: str) -> str:
    """How errors name an agent of a sub-env: ``"1, agent 'c'"`` (read as "sub-env 1,
    agent 'c' returned ...")."""
    return f"{env_index}, agent {agent!r}"
