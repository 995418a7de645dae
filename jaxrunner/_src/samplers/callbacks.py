"""Episode callbacks: user hooks at episode start, every step and episode end."""

from __future__ import annotations

from typing import Any, Protocol

import jax
import numpy as np

from jaxrunner._src.core.episode import Episode, join_extras
from jaxrunner._src.core.runner_state import Runner


class StepRows(Protocol):
    """What a live episode reads its rows from: a sample's buffers (a ``Trajectory``, or
    a ``MultiAgentTrajectory``, whose rows are dicts by policy id)."""

    def env_rows(self, name: str, steps: slice, env: int) -> Any: ...


class LiveEpisode:
    """An episode being collected, as the callbacks see it.

    ``obs`` holds one more item than ``action``/``reward``/``extras`` (the first
    observation, then the one after each step; at the end, the final one).
    ``user_data`` is yours: keep per-episode custom metrics there.

    ``obs``, ``action`` and ``extras`` are read from the sample's buffers when a hook
    asks for them (hooks that do not read them cost next to nothing), and copied out
    when the episode or the sample ends, so a live episode never keeps a whole trajectory
    alive. ``reward``, ``infos`` and the flags are kept as they come.
    """

    def __init__(self, env_id: int, episode_id: int, first_obs: Any) -> None:
        self.env_id = env_id
        self.episode_id = episode_id
        self.reward: list[float] = []
        self.infos: list[dict[str, Any]] = []
        self.terminated = False
        self.truncated = False
        self.faulty = False  # cut by a failure of its env (then truncated too)
        self.user_data: dict[str, Any] = {}
        self._first_obs = first_obs
        self._spans: list[_Span] = []

    def add_step(self, buf: StepRows, t: int, reward: float, info: dict[str, Any]) -> None:
        """Step ``t`` of ``buf`` (a sample's buffers) continues the episode."""
        last = self._spans[-1] if self._spans else None
        if last is not None and last.buf is buf and last.stop == t:
            last.stop += 1
        else:
            self._spans.append(_Span(buf, t, t + 1, self.env_id))
        self.reward.append(reward)
        self.infos.append(info)

    def detach(self, buf: StepRows | None = None) -> None:
        """Copies the episode's rows out of ``buf`` (None: of every buffer), which it no
        longer references."""
        for span in self._spans:
            if span.buf is not None and (buf is None or span.buf is buf):
                span.detach()

    @property
    def obs(self) -> list[Any]:
        return [self._first_obs, *self._rows("next_obs")]

    @property
    def action(self) -> list[Any]:
        return self._rows("action")

    @property
    def extras(self) -> list[dict[str, Any]]:
        return self._rows("extras")

    def _rows(self, field: str) -> list[Any]:
        """One copy per step of ``field`` (``next_obs``, ``action`` or ``extras``)."""
        return [row for span in self._spans for row in span.rows(field)]

    @property
    def length(self) -> int:
        return len(self.reward)

    @property
    def total_return(self) -> float:
        return float(sum(self.reward))

    def to_episode(self) -> Episode:
        """The episode so far as an :class:`~jaxrunner.Episode` of stacked arrays."""

        def stack(items: list[Any]) -> Any:
            return jax.tree.map(lambda *xs: np.stack(xs), *items)

        return Episode(
            obs=stack(self.obs),
            action=stack(self.action) if self.action else np.empty((0,)),
            reward=np.asarray(self.reward, dtype=np.float64),
            extras=self._extras(),
            terminated=self.terminated,
            truncated=self.truncated,
            episode_id=self.episode_id,
            env_id=self.env_id,
            faulty=self.faulty,
        )

    def _extras(self) -> Any:
        """The steps' extras, span by span (an info entry may first appear in a later
        sample's span: ``join_extras``)."""
        extras, steps = {}, 0
        for span in self._spans:
            rows = jax.tree.map(np.array, span.tree("extras"))  # copies, out of the buffers
            n = span.stop - span.start
            extras = rows if not steps else join_extras(extras, rows, steps, n)
            steps += n
        return extras


class _Span:
    """Steps ``[start, stop)`` of env ``env`` in a sample's buffers ``buf``; once
    detached (``buf`` None), copies of those rows alone."""

    FIELDS = ("next_obs", "action", "extras")

    def __init__(self, buf: StepRows, start: int, stop: int, env: int) -> None:
        self.buf: StepRows | None = buf
        self.start, self.stop, self.env = start, stop, env
        self.trees: dict[str, Any] = {}

    def detach(self) -> None:
        self.trees = {name: self.tree(name) for name in self.FIELDS}
        self.buf = None

    def tree(self, field: str) -> Any:
        """``field``'s rows of the span, ``[stop - start, ...]``."""
        if self.buf is None:  # detached: the rows alone
            return self.trees[field]
        return self.buf.env_rows(field, slice(self.start, self.stop), self.env)

    def rows(self, field: str) -> list[Any]:
        tree = self.tree(field)
        return [jax.tree.map(lambda x, i=i: x[i], tree) for i in range(self.stop - self.start)]


class Callbacks:
    """Subclass and override the hooks you need; each receives the runner, the env
    index within the runner and the :class:`LiveEpisode` so far. Hooks run on the
    host, in the sampling loop: keep them cheap."""

    def on_episode_start(self, runner: Runner, env_index: int, episode: LiveEpisode) -> None:
        """After the reset that starts ``episode`` (``episode.obs`` has its first obs)."""

    def on_episode_step(self, runner: Runner, env_index: int, episode: LiveEpisode) -> None:
        """After each step of ``episode``, the last one included."""

    def on_episode_end(self, runner: Runner, env_index: int, episode: LiveEpisode) -> None:
        """After the step that ended ``episode`` (terminated or truncated), or after
        its env failed and was restarted (``episode.faulty``)."""
