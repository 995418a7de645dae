"""The runner state: what a runner holds between samples, outside its sampler, as one
typed object. See docs/design.md."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, Protocol, TypeVar

from jaxrunner._src.core.agent_groups import AgentGroup
from jaxrunner._src.core.policy import Params

Runner = Any
"""An ``EnvRunner``, as the layers below it (samplers, callbacks, checkpoints) type it."""


class EpisodePart(Protocol):
    """What :class:`EpisodeJoiner` reads of an episode (``Episode``, ``AgentEpisode``)."""

    @property
    def episode_id(self) -> int: ...
    @property
    def is_done(self) -> bool: ...
    @property
    def is_complete(self) -> bool: ...


E = TypeVar("E", bound=EpisodePart)


class EpisodeJoiner(Generic[E]):
    """Joins each sample's episode parts with their starts from earlier samples, and
    keeps the unfinished ones, one per stream (``key``: the env, or the agent in its
    env); ``order`` sorts what :meth:`complete` returns."""

    def __init__(
        self,
        key: Callable[[E], Hashable],
        concatenate: Callable[[E, E], E],
        order: Callable[[E], Any],
    ) -> None:
        self.key, self.concatenate, self.order = key, concatenate, order
        self.fragments: dict[Hashable, E] = {}
        """Stream -> its unfinished episode so far."""

    def complete(self, parts: Iterable[E]) -> list[E]:
        """The episodes that complete in ``parts`` (one sample's split episodes), joined
        with their earlier parts; unfinished ones are kept, those never seen from their
        start dropped."""
        done = []
        for part in parts:
            stream = self.key(part)
            head = self.fragments.pop(stream, None)
            if head is not None and head.episode_id == part.episode_id:
                part = self.concatenate(head, part)
            if not part.is_done:
                self.fragments[stream] = part
            elif part.is_complete:
                done.append(part)
        done.sort(key=self.order)
        return done

    def forget(self) -> None:
        """Drops the unfinished episodes: steps of theirs went elsewhere (a plain
        ``sample()``), so joining them to later parts would splice two pieces."""
        self.fragments = {}

    def set_fragments(self, fragments: Iterable[E]) -> None:
        """Replaces the unfinished episodes (a restored checkpoint's)."""
        self.fragments = {self.key(e): e for e in fragments}


@dataclasses.dataclass(eq=False)
class RunnerState(Generic[E]):
    """A runner's state between samples outside its sampler (which holds the per-step
    part: keys, carries, latest observations, connector state)."""

    params: dict[str, Params]
    """Policy id -> device params."""
    metrics: Any
    """The runner's ``RunnerMetrics``."""
    episodes: EpisodeJoiner[E]
    """The unfinished episodes ``sample_episodes`` is assembling."""
    callback_episodes: EpisodeJoiner[E]
    """The unfinished episodes ``on_agent_episode_end`` is assembling."""
    finished: list[E] = dataclasses.field(default_factory=list)
    """Complete episodes ``sample_episodes`` has not returned yet."""

    def take_finished(self, num_episodes: int) -> list[E]:
        """The first ``num_episodes`` finished episodes, removed from :attr:`finished`."""
        taken, self.finished = self.finished[:num_episodes], self.finished[num_episodes:]
        return taken


@dataclasses.dataclass(eq=False, kw_only=True)
class RunnerParts:
    """What a runner hands the services that save and restore it (checkpoints)."""

    runner: str
    """The runner's class name (``"EnvRunner"``), in messages."""
    file_format: str
    """The runner the checkpoints of this kind of env named before version 4
    (``"EnvRunner"`` or ``"MultiAgentRunner"``)."""
    state: RunnerState
    sampler: Any
    envs: Any
    groups: tuple[AgentGroup, ...]
    episode_type: type
    """``Episode`` or ``AgentEpisode``."""
    rollout_length: int
    seed: int
    """The runner's seed; a restore sets the checkpoint's, which the runner takes back."""
    restart_connectors: Callable[[], None]
    """Restarts the connectors' per-episode state after the envs were reset."""
