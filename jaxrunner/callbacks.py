"""Episode callbacks: user hooks at episode start, every step and episode end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from jaxrunner.trajectory import Episode, Trajectory

if TYPE_CHECKING:
    from jaxrunner.sampling import EnvRunner


class LiveEpisode:
    """An episode being collected, as the callbacks see it.

    ``obs`` holds one more item than ``action``/``reward``/``extras`` (the first
    observation, then the one after each step; at the end, the final one).
    ``user_data`` is yours: keep per-episode custom metrics there.

    ``obs``, ``action`` and ``extras`` are read from the samples' buffers when a hook
    asks for them, not copied at every step: hooks that do not read them cost next to
    nothing (a subclass overriding only ``on_episode_end`` cost 23% of HalfCheetah's
    steps/s when every step was copied). ``reward``, ``infos`` and the flags are kept
    as they come.
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
        self._steps: list[tuple[Trajectory, int]] = []
        """Each step's sample buffers and time index (the env's row is ``env_id``)."""

    def add_step(self, buf: Trajectory, t: int, reward: float, info: dict[str, Any]) -> None:
        """Step ``t`` of ``buf`` (a sample's buffers) continues the episode."""
        self._steps.append((buf, t))
        self.reward.append(reward)
        self.infos.append(info)

    @property
    def obs(self) -> list[Any]:
        env = self.env_id
        return [self._first_obs, *(_row(buf.next_obs, t, env) for buf, t in self._steps)]

    @property
    def action(self) -> list[Any]:
        return [_row(buf.action, t, self.env_id) for buf, t in self._steps]

    @property
    def extras(self) -> list[dict[str, Any]]:
        env = self.env_id
        return [_row(buf.extras, t, env) for buf, t in self._steps]

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
            extras=stack(self.extras) if self.extras else {},
            terminated=self.terminated,
            truncated=self.truncated,
            episode_id=self.episode_id,
            env_id=self.env_id,
            faulty=self.faulty,
        )


def _row(tree: Any, t: int, env: int) -> Any:
    """Step ``t`` of env ``env`` of a ``[T, B, ...]`` pytree, as copies (a hook that
    edits them leaves the trajectory alone)."""
    return jax.tree.map(lambda x: np.array(x[t, env]), tree)


class Callbacks:
    """Subclass and override the hooks you need; each receives the runner, the env
    index within the runner and the :class:`LiveEpisode` so far. Hooks run on the
    host, in the sampling loop: keep them cheap."""

    def on_episode_start(self, runner: EnvRunner, env_index: int, episode: LiveEpisode) -> None:
        """After the reset that starts ``episode`` (``episode.obs`` has its first obs)."""

    def on_episode_step(self, runner: EnvRunner, env_index: int, episode: LiveEpisode) -> None:
        """After each step of ``episode``, the last one included."""

    def on_episode_end(self, runner: EnvRunner, env_index: int, episode: LiveEpisode) -> None:
        """After the step that ended ``episode`` (terminated or truncated), or after
        its env failed and was restarted (``episode.faulty``)."""


def overrides(callbacks: Any, hook: str, base: type = Callbacks) -> bool:
    """Whether ``callbacks`` (an instance of a subclass of ``base``) overrides ``hook``:
    a hook it does not override is never called."""
    return getattr(type(callbacks), hook) is not getattr(base, hook)
