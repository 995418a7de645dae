"""The multi-agent trajectory: per policy group, ``[T, B, A_g]`` arrays with masks, and
the env-level ``[T, B]`` fields; split into agent episodes."""

from __future__ import annotations

import collections
import itertools
import os
from collections.abc import Sequence
from typing import Any

import flax.struct
import numpy as np

from jaxrunner._src.core import next_obs_store
from jaxrunner._src.core.episode import AgentEpisode, cut_steps
from jaxrunner._src.core.time_major import (
    MAX_LOAD_BYTES,
    HostOrDevice,
    StoredNextObs,
    TimeMajor,
    concatenate_leaves,
    replace_fields,
)
from jaxrunner._src.core.trajectory_file import (
    ErrorFn,
    TrajectoryFile,
    check_fields,
    encode_tree,
    lead_shape,
)
from jaxrunner.errors import InvalidArgumentError


class GroupTrajectory(StoredNextObs, flax.struct.PyTreeNode):
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
            where its episode ended (never a reset observation). A property, on a
            compact trajectory built on demand (as ``Trajectory.next_obs``).
        extras: policy outputs of the action (``log_prob``, ``value``, ...).
        valid: bool, False where the slot holds no transition (the agent was absent,
            had left, or waited for its turn). Every other field is zero there.
        agent_step: index of the transition within the agent's episode; at a failed env
            step's slot, the length of the agent episode it cut (0: none under way).
    """

    obs: Any
    action: Any
    reward: HostOrDevice
    terminated: HostOrDevice
    truncated: HostOrDevice
    next_obs_store: Any
    extras: dict[str, Any]
    valid: HostOrDevice
    agent_step: HostOrDevice

    def __init__(
        self,
        obs: Any,
        action: Any,
        reward: HostOrDevice,
        terminated: HostOrDevice,
        truncated: HostOrDevice,
        next_obs: Any = None,
        extras: dict[str, Any] | None = None,
        valid: HostOrDevice | None = None,
        agent_step: HostOrDevice | None = None,
        *,
        next_obs_store: Any = None,
    ) -> None:
        self._set_fields(locals())

    def _turns(self) -> np.ndarray:
        return np.asarray(self.valid)


# After the class: flax's dataclass transform sets its own replace on the class.
GroupTrajectory.replace = replace_fields  # type: ignore[method-assign]


def compact_group(group: GroupTrajectory) -> GroupTrajectory:
    """``group`` (host arrays) with ``next_obs`` stored only where it is not the obs at
    the slot's next valid row."""
    if group.is_compact:
        return group
    store = next_obs_store.compact(group.obs, group.next_obs_store, group._turns())
    return group.replace(next_obs_store=store)


class MultiAgentTrajectory(TimeMajor, flax.struct.PyTreeNode):
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

    _lead = "env_id"
    _FORMAT = "jaxrunner.MultiAgentTrajectory"

    groups: dict[str, GroupTrajectory]
    env_id: np.ndarray
    episode_id: np.ndarray
    step: np.ndarray
    env_done: np.ndarray
    agents: dict[str, tuple[str, ...]] = flax.struct.field(pytree_node=False)
    valid: np.ndarray | None = None

    @property
    def is_compact(self) -> bool:
        return any(g.is_compact for g in self.groups.values())

    def dense(self) -> MultiAgentTrajectory:
        if not self.is_compact:
            return self
        return self.replace(groups={p: g.dense() for p, g in self.groups.items()})

    @classmethod
    def _aligned(cls, parts: Sequence[MultiAgentTrajectory]) -> Sequence[MultiAgentTrajectory]:
        # A sample without failed steps has no env-level valid.
        if all(p.valid is None for p in parts) or all(p.valid is not None for p in parts):
            return parts
        return [
            p if p.valid is not None else p.replace(valid=np.ones(p.env_id.shape, np.bool_))
            for p in parts
        ]

    @classmethod
    def _joined(cls, parts: Sequence[MultiAgentTrajectory], axis: int) -> MultiAgentTrajectory:
        groups = {
            pid: GroupTrajectory._joined([p.groups[pid] for p in parts], axis)
            for pid in parts[0].groups
        }
        env_level = concatenate_leaves([p.replace(groups={}) for p in parts], axis)
        return env_level.replace(groups=groups)

    def _time_slice(self, start: int, stop: int) -> MultiAgentTrajectory:
        env_level = super(MultiAgentTrajectory, self.replace(groups={}))._time_slice(start, stop)
        groups = {p: g._time_slice(start, stop) for p, g in self.groups.items()}
        return env_level.replace(groups=groups)

    def env_rows(self, name: str, steps: slice, env: int) -> dict[str, Any]:
        """Policy id -> a copy of its group's field ``name`` at steps ``steps`` of env
        ``env``, ``[len, A_g, ...]`` (as ``Trajectory.env_rows``, for live episodes)."""
        return {pid: group.env_rows(name, steps, env) for pid, group in self.groups.items()}

    def agent(self, agent_id: str) -> tuple[str, int]:
        """``(policy_id, slot)`` of ``agent_id``."""
        for policy_id, agents in self.agents.items():
            if agent_id in agents:
                return policy_id, agents.index(agent_id)
        raise InvalidArgumentError(
            f"MultiAgentTrajectory.agent({agent_id!r}): no such agent; the agents are "
            f"{[a for agents in self.agents.values() for a in agents]}."
        )

    def save(self, path: str | os.PathLike[str]) -> None:
        """Saves to one ``.npz`` file (no pickle); :meth:`load` restores it exactly."""

        def groups(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
            return {
                pid: {
                    "agents": list(self.agents[pid]),
                    "fields": {n: encode_tree(getattr(g, n), arrays) for n in _GROUP_FIELDS},
                }
                for pid, g in self.groups.items()
            }

        self._save(path, [n for n in _ENV_FIELDS if getattr(self, n) is not None], groups=groups)

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], *, max_bytes: int | None = MAX_LOAD_BYTES
    ) -> MultiAgentTrajectory:
        """Loads a file written by :meth:`save`, trusting nothing in it, as
        :meth:`jaxrunner.Trajectory.load` does. The env-level fields must be ``[T, B]``;
        each group's ``[T, B, A_g, ...]`` with ``A_g`` its number of agents; agent ids
        unique strings.

        Args:
            path: the file.
            max_bytes: the most bytes the arrays may take in memory (None: no cap).

        Raises:
            InvalidArgumentError: the file is not a valid multi-agent trajectory file;
                the message names the field (or member) at fault and what is wrong.
        """
        with TrajectoryFile(path, cls, max_bytes) as file:
            spec = file.read_spec()
            env = file.read_fields(spec.get("fields"), _ENV_FIELDS, optional=("valid",))
            lead = lead_shape(env, "env_id", file.error)
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
        """Per-agent episodes, env by env, agent by agent, in time order, as
        :meth:`Trajectory.split_episodes`; those a failed step of their env cut
        (``valid``) end there, ``faulty`` and ``truncated``."""
        host = self.dense().to_numpy()
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
                ends = set((np.flatnonzero(done[steps, b, a]) + 1).tolist())
                # A failed step cuts the agent's episode before it; one before its first
                # transition here ends (zero-length) an episode begun earlier, if any.
                at = np.searchsorted(steps, failed[b])
                cuts = set(at.tolist()) - ends - {0}
                ended = [f for f, i in zip(failed[b], at) if i == 0 and group.agent_step[f, b, a]]
                for f in ended:
                    episodes.append(_episode(host, policy_id, agent, b, a, np.array([f]), True))
                for lo, hi in itertools.pairwise([0, *sorted(ends | cuts), steps.size]):
                    if lo < hi:
                        rows = steps[lo:hi]
                        episodes.append(_episode(host, policy_id, agent, b, a, rows, hi in cuts))
        return episodes


_ENV_FIELDS = ("env_id", "episode_id", "step", "env_done", "valid")
_GROUP_FIELDS = GroupTrajectory._file_fields()


def _agents_of(groups: Any, error: ErrorFn) -> dict[str, tuple[str, ...]]:
    """Policy id -> agent ids, from a spec's ``groups``, checked."""
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


def _episode(
    host: MultiAgentTrajectory,
    policy_id: str,
    agent: str,
    b: int,
    a: int,
    rows: np.ndarray,
    faulty: bool = False,
) -> AgentEpisode:
    """The agent's transitions at ``rows`` (an invalid row alone: the zero-length end
    of an episode begun in an earlier sample)."""
    group = host.groups[policy_id]
    first, last = rows[0], rows[-1]
    if not group.valid[last, b, a]:  # the failed slot's obs: zeros, as the sample has none
        rows = rows[:0]
    return AgentEpisode(
        **cut_steps(group, (rows, b, a), (last, b, a), group.next_obs),
        env_step=host.step[rows, b],
        terminated=bool(group.terminated[last, b, a]),
        truncated=faulty or bool(group.truncated[last, b, a]),
        faulty=faulty,
        agent_id=agent,
        policy_id=policy_id,
        env_id=int(host.env_id[first, b]),
        episode_id=int(host.episode_id[first, b]),
        start_step=int(group.agent_step[first, b, a]),
    )
