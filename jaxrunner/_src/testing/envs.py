"""Small deterministic envs for tests: where and when every value was made shows.

Every env factory built here is a ``functools.partial`` of module-level callables, so
it pickles and can be sent to worker processes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from jaxrunner._src.arg_checks import check_int

EnvFactory = Callable[[], gymnasium.Env]
"""A zero-argument callable returning a gymnasium env."""


class CountingEnv(gymnasium.Env[np.ndarray, np.int64]):
    """A deterministic env whose observations say where and when they were made.

    Observation (int64, shape (5,)): ``[env_id, seed, episode, t, noise]`` where ``seed`` is
    the last seed passed to ``reset`` (-1 before any), ``episode`` counts resets from 0, ``t``
    counts steps within the episode and ``noise`` is drawn from ``np_random`` (so seeding
    shows). The reward equals the action, so a trajectory's ``reward[t] == action[t]``
    checks alignment. The episode terminates after ``episode_length`` steps.

    Args:
        env_id: written into every observation.
        episode_length: steps until ``terminated`` (>= 1).
        num_actions: size of the ``Discrete`` action space.
        render_mode: ``None``, ``"ansi"`` or ``"rgb_array"``.
    """

    # The base class declares it per instance, so not a ClassVar.
    metadata: dict[str, Any] = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}  # noqa: RUF012
    ENV_ID, SEED, EPISODE, T, NOISE = range(5)  # observation columns

    def __init__(
        self,
        env_id: int = 0,
        episode_length: int = 5,
        num_actions: int = 3,
        render_mode: str | None = None,
    ) -> None:
        check_int("CountingEnv", "episode_length", episode_length)
        self.env_id, self.episode_length, self.render_mode = env_id, episode_length, render_mode
        self.observation_space = spaces.Box(-1, 2**40, shape=(5,), dtype=np.int64)
        self.action_space = spaces.Discrete(num_actions)
        self.last_seed, self.episode, self.t = -1, -1, 0
        self.is_closed = False

    def _obs(self) -> np.ndarray:
        noise = self.np_random.integers(0, 1000)
        return np.array([self.env_id, self.last_seed, self.episode, self.t, noise], dtype=np.int64)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None:
            self.last_seed = seed
        self.episode, self.t = self.episode + 1, 0
        return self._obs(), {"episode": self.episode}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Moves one step: the reward is the action; the episode ends after episode_length steps."""
        if not self.action_space.contains(action):
            raise ValueError(f"CountingEnv: invalid action {action!r} for {self.action_space}.")
        self.t += 1
        return self._obs(), float(action), self.t >= self.episode_length, False, {"t": self.t}

    def render(self) -> Any:
        if self.render_mode == "ansi":
            return f"env {self.env_id} episode {self.episode} t {self.t}"
        if self.render_mode == "rgb_array":
            return np.full((4, 4, 3), self.t % 256, dtype=np.uint8)
        return None

    def close(self) -> None:
        self.is_closed = True


def make_counting_env(max_episode_steps: int | None = None, **kwargs: Any) -> gymnasium.Env:
    """A :class:`CountingEnv`, wrapped in ``TimeLimit`` when ``max_episode_steps`` is set
    (so it truncates, and terminates and truncates at once when both limits coincide)."""
    env: gymnasium.Env = CountingEnv(**kwargs)
    if max_episode_steps is not None:
        env = gymnasium.wrappers.TimeLimit(env, max_episode_steps)
    return env


def counting_env_fns(
    num_envs: int, episode_length: int = 3, max_episode_steps: int | None = None, **kwargs: Any
) -> list[EnvFactory]:
    """Factories of CountingEnvs with ids ``0..num_envs-1`` and staggered episode lengths
    ``episode_length + i``, so episodes end at different steps in different sub-envs."""
    return [
        functools.partial(
            make_counting_env,
            max_episode_steps,
            env_id=i,
            episode_length=episode_length + i,
            **kwargs,
        )
        for i in range(num_envs)
    ]


class DictObsEnv(gymnasium.Env[dict, np.ndarray]):
    """A random walk with a nested ``Dict``/``Tuple`` observation and ``Box`` actions.

    ``pos`` starts uniform in [-0.5, 0.5]^2 and moves by ``0.25 * action`` (the action is
    clipped to [-1, 1]); the episode terminates when ``pos`` leaves [-1, 1]^2 and truncates
    after ``max_steps`` steps. The reward is ``sum(action)``. Step infos hold a nested dict
    with an array, which exercises gymnasium's info merging.
    """

    def __init__(self, max_steps: int = 20) -> None:
        self.max_steps = max_steps
        self.observation_space = spaces.Dict(
            {
                "pos": spaces.Box(-2.0, 2.0, shape=(2,), dtype=np.float32),
                "mask": spaces.MultiBinary(3),
                "nested": spaces.Tuple(
                    (spaces.Discrete(5), spaces.Box(0.0, 1.0, shape=(2, 2), dtype=np.float64))
                ),
            }
        )
        self.action_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.pos = np.zeros(2, dtype=np.float32)
        self.t = 0
        self.is_closed = False

    def _obs(self) -> dict[str, Any]:
        rng = self.np_random
        return {
            "pos": self.pos.copy(),
            "mask": rng.integers(0, 2, size=3).astype(np.int8),
            "nested": (int(self.t % 5), rng.random((2, 2))),
        }

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-0.5, 0.5, size=2).astype(np.float32)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Moves the point by a quarter of the clipped action; ends it when it leaves the box."""
        action = np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)
        self.pos = (self.pos + 0.25 * action).astype(np.float32)
        self.t += 1
        terminated = bool(np.any(np.abs(self.pos) > 1.0))
        info = {"stats": {"t": self.t, "pos": self.pos.copy()}}
        return self._obs(), float(action.sum()), terminated, self.t >= self.max_steps, info

    def close(self) -> None:
        self.is_closed = True


class StepCounter(gymnasium.Wrapper):
    """Counts ``step`` and ``reset`` calls in ``num_steps`` / ``num_resets``.

    The counts live in the wrapper, so read them with ``vec.get_attr("num_steps")``: that
    works for any backend (in-process or not) that implements ``get_attr``.
    """

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self.num_steps = 0
        self.num_resets = 0

    def reset(self, **kwargs: Any) -> Any:
        self.num_resets += 1
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> Any:
        self.num_steps += 1
        return self.env.step(action)

    @staticmethod
    def wrap_fns(env_fns: Sequence[EnvFactory]) -> list[EnvFactory]:
        """The same factories, each env wrapped in a StepCounter."""
        return [functools.partial(_counted, fn) for fn in env_fns]


def _counted(fn: EnvFactory) -> gymnasium.Env:
    return StepCounter(fn())
