"""Live episodes of the external envs, their agents' records and ids (the env holds its lock
around every call)."""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from typing import Any

import numpy as np
from gymnasium import spaces

from jaxrunner._src import space_arrays
from jaxrunner._src.core.episode import AgentEpisode, Episode, as_agent_episode
from jaxrunner._src.services.external.memory import (
    TRIM_EVERY_BYTES,
    release_freed_memory,
    step_nbytes,
    tree_nbytes,
)
from jaxrunner.errors import (
    EpisodeConflictError,
    EpisodeNotFoundError,
    InvalidArgumentError,
    TooManyEpisodesError,
)

MAX_EPISODE_ID = 2**63 - 1
ENDED_IDS_KEPT = 100_000  # ended ids remembered, to refuse their reuse (and answer 410)
CLIENT_IDS_KEPT = 65_536  # client names numbered as env_ids; later new ones get env_id -1


@dataclasses.dataclass
class AgentRecord:
    """One agent's steps in a live episode: ``obs[t]`` got ``actions[t]``; its reward adds
    up in ``pending_reward`` until the next observation closes it into ``rewards[t]``."""

    episode_id: int
    env_id: int
    training_enabled: bool
    carry: Any
    agent_id: str = ""
    policy_id: str = ""
    index: int = 0  # in possible_agents (for its action keys)
    obs: list[Any] = dataclasses.field(default_factory=list)
    actions: list[Any] = dataclasses.field(default_factory=list)
    extras: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)
    rewards: list[float] = dataclasses.field(default_factory=list)
    env_steps: list[int] = dataclasses.field(default_factory=list)  # action call of each
    pending_reward: float = 0.0
    unassigned_reward: float = 0.0  # logged rewards no step could take (see _with_pending)
    done: bool = False  # the agent (or its episode) has ended: no call may name it
    nbytes: int = 0  # what the recorded steps cost (see external.memory)
    _undo: Any = None  # (ticket, previous carry, whether record closed a reward, bytes)

    @property
    def num_actions(self) -> int:
        return len(self.actions)

    def reward_plus(self, reward: float, call: str, whose: str) -> float:
        """``pending_reward + reward``, refused where two finite rewards sum to an infinite
        one (``whose``: the action's, for the message)."""
        total = self.pending_reward + reward
        if not math.isfinite(total):
            raise InvalidArgumentError(
                f"{call}: reward={reward!r} added to the {self.pending_reward!r} already logged "
                f"for {whose} latest action overflows to {total}; nothing was added. Scale the "
                "rewards down."
            )
        return total

    @property
    def ends_as_episode(self) -> bool:
        """Whether ending it gives an episode: only after an action (an episode without a
        transition is none, as the runners never give one)."""
        return self.num_actions > 0

    def record(
        self,
        obs: Any,
        action: Any,
        extras: dict[str, np.ndarray],
        carry: Any,
        env_step: int,
        ticket: object = None,
    ) -> None:
        """Appends one step; ``ticket`` names it for :meth:`undo`."""
        closed = self.num_actions > 0
        size = step_nbytes(obs, action, extras)
        self.nbytes += size
        self._undo = (ticket, self.carry, closed, size) if ticket is not None else None
        if closed:
            self.rewards.append(self.pending_reward)
            self.pending_reward = 0.0
        self.obs.append(obs)
        self.actions.append(action)
        self.extras.append(extras)
        self.env_steps.append(env_step)
        self.carry = carry

    def can_undo(self, ticket: object) -> bool:
        """Whether the latest step is the one recorded with ``ticket``."""
        return self._undo is not None and self._undo[0] is ticket

    def undo(self) -> None:
        """Removes the latest step (its action never reached the agent); rewards logged
        since go back to the step before (see :meth:`_with_pending`)."""
        _, self.carry, closed, size = self._undo
        self._undo = None
        self.nbytes -= size
        self.obs.pop()
        self.actions.pop()
        self.extras.pop()
        self.env_steps.pop()
        if closed:
            self.pending_reward = self._with_pending(self.rewards.pop())

    def close_at(self, final_obs: Any) -> None:
        """Appends the final observation, closing the last step's reward."""
        if self.num_actions:
            self.rewards.append(self.pending_reward)
        self.obs.append(final_obs)

    def abandon(self) -> int:
        """Closes the record at its last observation; returns the steps dropped (the last
        action's, whose outcome never came). Rewards logged since go to the step before,
        as in :meth:`undo` (none left: they stay pending, for the caller)."""
        if not self.num_actions:
            return 0
        self.actions.pop()
        self.extras.pop()
        self.env_steps.pop()
        if self.rewards:  # the episode's return keeps them
            self.rewards[-1] = self._with_pending(self.rewards[-1])
        return 1

    def _with_pending(self, reward: float) -> float:
        """``reward`` plus the pending rewards, which it takes. Where that sum overflows,
        ``reward`` alone: a step's reward stays finite (``log_returns`` refuses such a
        sum) and the pending rewards count in ``unassigned_reward``. No warning: this
        runs under the env's lock, mid-reap, where a warning may be an error."""
        total = reward + self.pending_reward
        if not math.isfinite(total):
            self.unassigned_reward += self.pending_reward
            total = reward
        self.pending_reward = 0.0
        return total

    def to_episode(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        *,
        terminated: bool,
        truncated: bool,
    ) -> Episode:
        """The closed record (at least one step) as an Episode, consuming it row by row
        (call it without the env's lock: it is the slow part of ending one)."""
        return Episode(
            obs=_stack_releasing(observation_space, self.obs),
            action=_stack_releasing(action_space, self.actions),
            reward=np.asarray(self.rewards, np.float64),
            extras={k: np.stack([e[k] for e in self.extras]) for k in self.extras[0]},
            terminated=terminated,
            truncated=truncated,
            episode_id=self.episode_id,
            env_id=self.env_id,
        )

    def to_agent_episode(self, episode: Episode) -> AgentEpisode:
        """``episode`` (from :meth:`to_episode`) as this agent's AgentEpisode."""
        agent_episode = as_agent_episode(episode, self.agent_id, self.policy_id)
        return agent_episode.replace(env_step=np.asarray(self.env_steps, np.int64))


@dataclasses.dataclass
class EpisodeRecord:
    """A live episode: its call state and its agents' records."""

    episode_id: int
    client: str
    env_id: int
    training_enabled: bool
    last_seen: float
    busy: bool = False  # a call is in flight
    reserved: int = 0  # bytes reserved for the call in flight (see external.memory)
    nbytes: int = 0  # what its agents' records cost beside their steps, until it ends
    agents: dict[str, AgentRecord] = dataclasses.field(default_factory=dict)
    num_calls: int = 0  # its env steps (action calls)


def _stack_releasing(space: spaces.Space, rows: list[Any]) -> Any:
    """``rows`` stacked along a new first axis, each row dropped once copied."""
    stacked = space_arrays.allocate(space, (len(rows),))
    freed = 0
    for t in range(len(rows)):
        space_arrays.copy_into(space, stacked, rows[t], t)
        freed += tree_nbytes(rows[t])
        rows[t] = None  # its memory goes back now, not after the whole copy
        if freed >= TRIM_EVERY_BYTES:
            freed = 0
            release_freed_memory()
    rows.clear()
    return stacked


class EpisodeTable:
    """Live episodes by id, within their caps, and the ids recently ended."""

    def __init__(self, max_concurrent: int, max_per_client: int | None) -> None:
        self._max_concurrent = max_concurrent
        self._max_per_client = max_per_client
        self._live: dict[int, EpisodeRecord] = {}
        self._per_client: collections.Counter[str] = collections.Counter()
        self._client_ids: dict[str, int] = {}
        self._ended_ids: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._next_auto_id = 0

    def __len__(self) -> int:
        return len(self._live)

    def open(self, episode_id: int | None, client: str, training_enabled: bool) -> EpisodeRecord:
        """Adds a live episode (``episode_id`` type-checked; None: a fresh id)."""
        cap = self._max_concurrent
        if len(self._live) >= cap:
            raise TooManyEpisodesError(
                f"start_episode(): {cap} episodes are live, the max_concurrent cap; end some "
                "episodes first (or raise ExternalEnvConfig.max_concurrent)."
            )
        per_client = self._max_per_client
        if per_client is not None and self._per_client[client] >= per_client:
            raise TooManyEpisodesError(
                f"start_episode(): client {client!r} has {per_client} live episodes, the "
                "max_episodes_per_client cap; end some of them first."
            )
        if episode_id is None:
            while self._is_taken(self._next_auto_id):
                self._next_auto_id += 1
            episode_id = self._next_auto_id
            self._next_auto_id += 1
        elif self._is_taken(episode_id):
            state = "live" if episode_id in self._live else "recently ended"
            raise EpisodeConflictError(
                f"start_episode(episode_id={episode_id}): an episode with this id is {state}; "
                "episode ids must be unique. Pass another id, or None for a fresh one."
            )
        episode_id = int(episode_id)
        if client not in self._client_ids and len(self._client_ids) < CLIENT_IDS_KEPT:
            self._client_ids[client] = len(self._client_ids)
        env_id = self._client_ids.get(client, -1)
        live = EpisodeRecord(episode_id, client, env_id, bool(training_enabled), time.monotonic())
        self._live[episode_id] = live
        self._per_client[client] += 1
        return live

    def get_idle(self, episode_id: Any, what: str) -> EpisodeRecord:
        """The live episode ``episode_id`` with no call in flight."""
        # A bool is no id (start_episode refuses them): True named episode 1.
        is_int = isinstance(episode_id, (int, np.integer)) and not isinstance(
            episode_id, (bool, np.bool_)
        )
        live = self._live.get(int(episode_id)) if is_int else None
        if live is None:
            if is_int and episode_id in self._ended_ids:
                raise EpisodeNotFoundError(
                    f"{what}(episode_id={episode_id}): the episode has ended; start a new one.",
                    ended=True,
                )
            raise EpisodeNotFoundError(
                f"{what}(episode_id={episode_id!r}): no live episode has this id; start one "
                "with start_episode() and use the id it returns."
            )
        if live.busy:
            raise EpisodeConflictError(
                f"{what}(episode_id={episode_id}): another call for this episode is still in "
                "flight; an episode's calls must come one after another."
            )
        return live

    def idle_since(self, since: float) -> list[EpisodeRecord]:
        """Live episodes with no call in flight, last seen before ``since``."""
        return [ep for ep in self._live.values() if not ep.busy and ep.last_seen < since]

    def remove(self, live: EpisodeRecord) -> None:
        """Moves ``live`` from the live episodes to the recently ended ids."""
        del self._live[live.episode_id]
        self._per_client[live.client] -= 1
        if self._per_client[live.client] <= 0:
            del self._per_client[live.client]
        self._ended_ids[live.episode_id] = None
        while len(self._ended_ids) > ENDED_IDS_KEPT:
            self._ended_ids.popitem(last=False)

    def forget_ended(self, episode_id: int) -> None:
        """Lets ``episode_id`` be used again though it ended recently."""
        self._ended_ids.pop(episode_id, None)

    def _is_taken(self, episode_id: int) -> bool:
        return episode_id in self._live or episode_id in self._ended_ids
