"""Episode callbacks: user hooks at episode start, every step and episode end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from jaxrunner.trajectory import Episode

if TYPE_CHECKING:
    from jaxrunner.sampling import EnvRunner


class LiveEpisode:
    """An episode being collected, as the callbacks see it.

    ``obs`` holds one more item than ``action``/``reward``/``extras`` (the first
    observation, then the one after each step; at the end, the final one).
    ``user_data`` is yours: keep per-episode custom metrics there.
    """

    def __init__(self, env_id: int, episode_id: int, first_obs: Any) -> None:
        self.env_id = env_id
        self.episode_id = episode_id
        self.obs: list[Any] = [first_obs]
        self.action: list[Any] = []
        self.reward: list[float] = []
        self.extras: list[dict[str, Any]] = []
        self.infos: list[dict[str, Any]] = []
        self.terminated = False
        self.truncated = False
        self.faulty = False  # cut by a failure of its env (then truncated too)
        self.user_data: dict[str, Any] = {}

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
