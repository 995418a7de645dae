"""Multi-agent trajectories: per-group ``[T, B, A_g, ...]`` arrays with masks, env-level
``[T, B]`` ids, and per-agent episodes. See docs/multi-agent.md."""

from __future__ import annotations

import collections
import itertools
import os
from typing import Any

import flax.struct
import jax
import numpy as np

from jaxrunner._src.core.episode import EpisodeSpan, cut_steps, join_steps
from jaxrunner._src.core.trajectory import MAX_LOAD_BYTES, HostOrDevice
from jaxrunner._src.core.trajectory_file import (
    ErrorFn,
    TrajectoryFile,
    check_fields,
    encode_tree,
    lead_shape,
    write_file,
)
from jaxrunner.errors import InvalidArgumentError

_FORMAT = "jaxrunner.MultiAgentTrajectory"
_VERSION = 1


class GroupTrajectory(flax.struct.PyTreeNode):
    """One group's transitions, every field ``[T, B, A_g, ...]``.

    Attributes:
        obs: the observation the agent acted on.
        action: the action as sampled by the policy (Box actions unclipped).
        reward: float64, every reward the agent received for that action (in an AEC
            env: up to its next turn or the end of its episode).
        terminated: the agent's episode ended in a terminal state.
        truncated: the agent's episode was cut (or the env's episode ended while the
            agent was still in it): bootstrap from ``next_obs``.
        next_obs: the agent's next observation: at its next turn, or its final one
            where its episode ended (never a reset observation).
        extras: policy outputs of the action (``log_prob``, ``value``, ...).
        valid: bool, False where the slot holds no transition (the agent was absent,
            had left, or waited for its turn). Every other field is zero there.
        agent_step: index of the transition within the agent's episode.
    """

    obs: Any
    action: Any
    reward: HostOrDevice
    terminated: HostOrDevice
    truncated: HostOrDevice
    next_obs: Any
    extras: dict[str, Any]
    valid: HostOrDevice
    agent_step: HostOrDevice

    @property
    def done(self) -> np.ndarray:
        """``terminated | truncated``: where an agent's episode ended."""
        return np.logical_or(self.terminated, self.truncated)


class MultiAgentTrajectory(flax.struct.PyTreeNode):
    """``T`` env steps of ``B`` multi-agent envs.

    Attributes:
        groups: policy id -> :class:`GroupTrajectory` (``[T, B, A_g, ...]``).
        env_id: ``[T, B]`` index of the env.
        episode_id: ``[T, B]`` the env's episode (unique per runner); an agent's
            episode is identified by this id and its agent id.
        step: ``[T, B]`` index of the env step within the env's episode.
        env_done: ``[T, B]`` bool, the env's episode ended at this step (it was reset).
        agents: policy id -> the agent ids of its group's slots (static).
        valid: ``[T, B]`` bool, False where the env's step failed (its sub-env was
            restarted): no agent has a transition there, and the agent episodes it cut
            end as faults (None: no step failed).
    """

    groups: dict[str, GroupTrajectory]
    env_id: np.ndarray
    episode_id: np.ndarray
    step: np.ndarray
    env_done: np.ndarray
    agents: dict[str, tuple[str, ...]] = flax.struct.field(pytree_node=False)
    valid: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        return int(self.env_id.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.env_id.shape[1])

    def agent(self, agent_id: str) -> tuple[str, int]:
        """``(policy_id, slot)`` of ``agent_id``."""
        for policy_id, agents in self.agents.items():
            if agent_id in agents:
                return policy_id, agents.index(agent_id)
        raise InvalidArgumentError(
            f"MultiAgentTrajectory.agent({agent_id!r}): no such agent; the agents are "
            f"{[a for agents in self.agents.values() for a in agents]}."
        )

    def env_rows(self, name: str, steps: slice, env: int) -> dict[str, Any]:
        """Policy id -> a copy of its group's field ``name`` at steps ``steps`` of env
        ``env``, ``[len, A_g, ...]`` (as ``Trajectory.env_rows``, for live episodes)."""
        return {
            pid: jax.tree.map(lambda x: np.array(x[steps, env]), getattr(group, name))
            for pid, group in self.groups.items()
        }

    def to_numpy(self) -> MultiAgentTrajectory:
        """Every leaf as a numpy array (device -> host)."""
        return jax.tree.map(np.asarray, jax.device_get(self))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Saves to one ``.npz`` file (no pickle); :meth:`load` restores it exactly.

        The spec holds the env-level fields and, per policy id, the group's agent ids
        and its fields; every array is one member of the file.
        """
        arrays: dict[str, np.ndarray] = {}
        fields = {
            name: encode_tree(getattr(self, name), arrays)
            for name in _ENV_FIELDS
            if getattr(self, name) is not None
        }
        groups = {
            pid: {
                "agents": list(self.agents[pid]),
                "fields": {n: encode_tree(getattr(g, n), arrays) for n in _GROUP_FIELDS},
            }
            for pid, g in self.groups.items()
        }
        spec = {"format": _FORMAT, "version": _VERSION, "fields": fields, "groups": groups}
        write_file(path, spec, arrays)

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], *, max_bytes: int | None = MAX_LOAD_BYTES
    ) -> MultiAgentTrajectory:
        """Loads a file written by :meth:`save`, trusting nothing in it: the bounded
        reader of :meth:`jaxrunner.Trajectory.load`, with its limits.

        Only the members its spec names are read (never pickle), each once and checked
        against its own header before any memory is allocated. The env-level fields
        must be ``[T, B]``; each group's ``[T, B, A_g, ...]`` with ``A_g`` its number of
        agents; flags and ``valid`` bool, ids and steps integer, rewards float;
        ``next_obs`` shaped like ``obs``; agent ids unique strings.

        Args:
            path: the file.
            max_bytes: the most bytes the arrays may take in memory (None: no cap).

        Raises:
            InvalidArgumentError: the file is not a valid multi-agent trajectory file;
                the message names the field (or member) at fault and what is wrong.
        """
        with TrajectoryFile(path, _FORMAT, _VERSION, max_bytes, cls.__name__) as file:
            spec = file.read_spec()
            env = file.read_fields(spec.get("fields"), _ENV_FIELDS, optional=("valid",))
            lead = lead_shape(env, "env_id", "[T, B]", file.error)
            check_fields(env, lead, "env_id's", file.error)
            agents = _agents_of(spec.get("groups"), file.error)
            groups = {}
            for pid, ids in agents.items():
                where = f"groups.{pid}."
                fields = file.read_fields(spec["groups"][pid].get("fields"), _GROUP_FIELDS, where)
                source = f"env_id's [T, B] and the group's {len(ids)} agents"
                check_fields(fields, (*lead, len(ids)), source, file.error, where)
                groups[pid] = GroupTrajectory(**fields)
        return cls(groups=groups, **env, agents=agents)

    def split_episodes(self) -> list[AgentEpisode]:
        """Per-agent episodes, env by env, agent by agent, in time order. Episodes
        still running at the end are not ``is_done``; those begun before the first
        step (``start_step > 0``) are not ``is_complete``; those a failed step of their
        env cut (``valid``) end there, ``faulty`` and ``truncated``."""
        host = self.to_numpy()
        episodes = []
        failed = [
            np.zeros(0, np.int64) if host.valid is None else np.flatnonzero(~host.valid[:, b])
            for b in range(host.num_envs)
        ]
        for policy_id, group in host.groups.items():
            done = group.done
            for b, (a, agent) in itertools.product(
                range(host.num_envs), enumerate(host.agents[policy_id])
            ):
                steps = np.flatnonzero(group.valid[:, b, a])
                if steps.size == 0:
                    continue
                ends = set((np.flatnonzero(done[steps, b, a]) + 1).tolist())
                # A failed step cuts the episode of the agent's transitions before it.
                cuts = set(np.searchsorted(steps, failed[b]).tolist()) - ends - {0}
                for lo, hi in itertools.pairwise([0, *sorted(ends | cuts), steps.size]):
                    if lo < hi:
                        rows = steps[lo:hi]
                        episodes.append(_episode(host, policy_id, agent, b, a, rows, hi in cuts))
        return episodes


_ENV_FIELDS = ("env_id", "episode_id", "step", "env_done", "valid")
_GROUP_FIELDS = tuple(GroupTrajectory.__dataclass_fields__)


def _agents_of(groups: Any, error: ErrorFn) -> dict[str, tuple[str, ...]]:
    """Policy id -> agent ids, from a spec's ``groups``: an object of objects, each
    with a non-empty list of agent ids, every id a str and in one group only."""
    if not isinstance(groups, dict):
        raise error("has no 'groups' object in its spec")
    agents: dict[str, tuple[str, ...]] = {}
    seen: set[str] = set()
    for pid, group in groups.items():
        ids = group.get("agents") if isinstance(group, dict) else None
        if not isinstance(ids, list) or not ids or not all(isinstance(a, str) for a in ids):
            raise error(
                f"has field groups.{pid}.agents {ids!r:.80}; expected a non-empty "
                "list of agent ids (str)"
            )
        counts = collections.Counter(ids)
        twice = sorted(seen.intersection(ids) | {a for a, n in counts.items() if n > 1})
        if twice:
            raise error(f"has field groups.{pid}.agents naming {twice} more than once")
        seen.update(ids)
        agents[pid] = tuple(ids)
    return agents


class AgentEpisode(EpisodeSpan, flax.struct.PyTreeNode):
    """One agent's episode (or the part of it in one trajectory).

    Attributes:
        agent_id, policy_id: who acted, with which policy.
        env_id: the env.
        episode_id: the env's episode id (shared by every agent of that env episode).
        obs: ``[L + 1, ...]`` the agent's observations, first to final.
        action, reward, extras: ``[L, ...]``.
        env_step: ``[L]`` the env's step within its episode where each transition
            completed.
        terminated, truncated: how the agent's episode ended (both False if it goes on).
        start_step: the agent step of the first transition (0: seen from its start).
        faulty: the episode was cut by a failure of its env (then ``truncated`` is True
            too: bootstrap from its last observation), as ``Episode.faulty``.
    """

    obs: Any
    action: Any
    reward: np.ndarray
    extras: dict[str, Any]
    env_step: np.ndarray
    terminated: bool = flax.struct.field(pytree_node=False)
    truncated: bool = flax.struct.field(pytree_node=False)
    agent_id: str = flax.struct.field(pytree_node=False)
    policy_id: str = flax.struct.field(pytree_node=False)
    env_id: int = flax.struct.field(pytree_node=False)
    episode_id: int = flax.struct.field(pytree_node=False)
    start_step: int = flax.struct.field(pytree_node=False)
    faulty: bool = flax.struct.field(pytree_node=False, default=False)

    @property
    def total_reward(self) -> float:
        return float(np.sum(self.reward))


def concatenate_agent_episodes(head: AgentEpisode, tail: AgentEpisode) -> AgentEpisode:
    """``head`` followed by ``tail`` (the same agent episode, cut by a sample boundary)."""
    key = (head.agent_id, head.env_id, head.episode_id)
    if key != (tail.agent_id, tail.env_id, tail.episode_id) or head.is_done:
        raise InvalidArgumentError(
            f"concatenate_agent_episodes: expected two parts of one unfinished agent episode, "
            f"got (agent, env, episode) {key} and "
            f"{(tail.agent_id, tail.env_id, tail.episode_id)}."
        )

    return tail.replace(
        **join_steps(head, tail),
        env_step=np.concatenate([head.env_step, tail.env_step]),
        start_step=head.start_step,
    )


def _episode(
    host: MultiAgentTrajectory,
    policy_id: str,
    agent: str,
    b: int,
    a: int,
    rows: np.ndarray,
    faulty: bool = False,
) -> AgentEpisode:
    group = host.groups[policy_id]
    last = rows[-1]
    return AgentEpisode(
        **cut_steps(group, (rows, b, a), (last, b, a)),
        env_step=host.step[rows, b],
        terminated=bool(group.terminated[last, b, a]),
        truncated=faulty or bool(group.truncated[last, b, a]),
        faulty=faulty,
        agent_id=agent,
        policy_id=policy_id,
        env_id=int(host.env_id[rows[0], b]),
        episode_id=int(host.episode_id[rows[0], b]),
        start_step=int(group.agent_step[rows[0], b, a]),
    )
