"""Episodes: one env's (:class:`Episode`) or one agent's (:class:`AgentEpisode`), or the
part of it a trajectory holds, and the cuts and joins that build them from time-major
arrays."""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import numpy as np

from jaxrunner.errors import InvalidArgumentError


class EpisodeSpan:
    """What :class:`Episode` and ``AgentEpisode`` say about their steps."""

    reward: np.ndarray
    terminated: bool
    truncated: bool
    start_step: int

    @property
    def length(self) -> int:
        return int(self.reward.shape[0])

    @property
    def total_return(self) -> float:
        """The sum of the rewards, undiscounted (also an ``AgentEpisode``'s ``total_reward``)."""
        return float(np.sum(self.reward))

    @property
    def is_done(self) -> bool:
        """The episode ended (terminated or truncated)."""
        return bool(self.terminated or self.truncated)

    @property
    def is_complete(self) -> bool:
        """Seen whole: from its first step to its end."""
        return self.is_done and self.start_step == 0


class Episode(EpisodeSpan, flax.struct.PyTreeNode):
    """One env's episode, or the part of it a trajectory holds.

    Attributes:
        obs: ``[L+1, ...]``, the first observation to the last (the final
            observation if the episode ended).
        action, reward, extras: ``[L, ...]``.
        terminated, truncated: how it ended (both False while it still runs).
        episode_id, env_id: as in :class:`Trajectory`.
        start_step: episode step index of ``action[0]`` (0 unless this is the tail
            of an episode that began before the trajectory did).
        faulty: the episode was cut by a failure of its env (then ``truncated`` is
            True too: bootstrap from its last observation).
    """

    obs: Any
    action: Any
    reward: np.ndarray
    extras: dict[str, Any]
    terminated: bool = flax.struct.field(pytree_node=False)
    truncated: bool = flax.struct.field(pytree_node=False)
    episode_id: int = flax.struct.field(pytree_node=False)
    env_id: int = flax.struct.field(pytree_node=False)
    start_step: int = flax.struct.field(pytree_node=False, default=0)
    faulty: bool = flax.struct.field(pytree_node=False, default=False)


def cut_steps(traj: Any, steps: Any, last: Any, final: Any) -> dict[str, Any]:
    """The step fields of one episode, copied out of ``traj`` (a Trajectory or a group)
    at the slots ``steps``: ``obs`` ``[L + 1]`` ending with ``final[last]``, and
    ``action``, ``reward``, ``extras`` ``[L]``."""

    def cut(x: np.ndarray) -> np.ndarray:
        return np.array(x[steps])  # a copy: the trajectory's buffers may be reused

    return {
        "obs": jax.tree.map(
            lambda o, n: np.concatenate([o[steps], n[last][None]]), traj.obs, final
        ),
        "action": jax.tree.map(cut, traj.action),
        "reward": cut(traj.reward),
        "extras": jax.tree.map(cut, traj.extras),
    }


def join_steps(head: Any, tail: Any) -> dict[str, Any]:
    """The step fields of two consecutive pieces of one episode, joined (``head``'s last
    obs is ``tail``'s first). A zero-length ``tail`` (a fault at a sample's first step)
    adds no obs: a multi-agent one holds none."""

    def cat(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.concatenate([x, y])

    empty = len(tail.reward) == 0
    return {
        "obs": jax.tree.map(lambda x, y: x if empty else cat(x[:-1], y), head.obs, tail.obs),
        "action": jax.tree.map(cat, head.action, tail.action),
        "reward": cat(head.reward, tail.reward),
        "extras": join_extras(head.extras, tail.extras, len(head.reward), len(tail.reward)),
    }


def join_extras(head: Any, tail: Any, head_steps: int, tail_steps: int) -> Any:
    """The extras of two consecutive pieces of an episode, joined; a dict entry only one
    piece has is zeros in the other: an info entry (``info_keys="all"``) first reported
    in a later sample, or empty info dicts a checkpoint could not hold, is not present
    there."""
    return jax.tree.map(
        lambda x, y: np.concatenate([x, y]),
        _with_entries(head, tail, head_steps),
        _with_entries(tail, head, tail_steps),
    )


def _with_entries(extras: Any, other: Any, length: int) -> Any:
    """A piece's ``extras`` with the dict entries only ``other`` has, as ``length`` zeros."""
    if not (isinstance(extras, dict) and isinstance(other, dict)):
        return extras
    filled = {k: _with_entries(v, other.get(k), length) for k, v in extras.items()}
    for key in other.keys() - extras.keys():
        filled[key] = jax.tree.map(lambda x: np.zeros((length, *x.shape[1:]), x.dtype), other[key])
    return filled


def concatenate_episodes(head: Episode, tail: Episode) -> Episode:
    """Joins two consecutive pieces of one episode (``head`` unfinished)."""
    if head.is_done or head.episode_id != tail.episode_id or head.env_id != tail.env_id:
        raise InvalidArgumentError(
            f"concatenate_episodes(): episode {tail.episode_id} of env {tail.env_id} does not "
            f"continue episode {head.episode_id} of env {head.env_id} (done={head.is_done})."
        )
    return head.replace(
        **join_steps(head, tail),
        terminated=tail.terminated,
        truncated=tail.truncated,
        faulty=tail.faulty,
    )


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

    total_reward = EpisodeSpan.total_return


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


def as_agent_episode(episode: Episode, agent_id: str, policy_id: str) -> AgentEpisode:
    """``episode`` as the :class:`AgentEpisode` of its env's one agent ``agent_id``."""
    fields = {f.name: getattr(episode, f.name) for f in dataclasses.fields(episode)}
    begin = episode.start_step
    env_step = np.arange(begin, begin + episode.length, dtype=np.int64)
    return AgentEpisode(**fields, env_step=env_step, agent_id=agent_id, policy_id=policy_id)
