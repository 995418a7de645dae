"""Small deterministic host envs for tests, gymnasium and PettingZoo (parallel and AEC):
where and when every value was made shows. Every factory here pickles (module-level
callables, or ``functools.partial`` of them), so it can be sent to worker processes."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from jaxrunner._src.arg_checks import check_int
from jaxrunner._src.testing.pettingzoo_bases import AECEnv, ParallelEnv

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
    """Counts ``step`` and ``reset`` calls in ``num_steps`` / ``num_resets`` (read them
    with ``vec.get_attr("num_steps")`` on any backend)."""

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


class _Episodes:
    """What the multi-agent test envs share: a seeded ``rng``, ``episode`` (episodes begun:
    the first reset makes it 0) and the step ``t``, which ``render()`` returns for the tests
    to read (outside PettingZoo's render types on purpose)."""

    def __init__(self) -> None:
        super().__init__()
        self.rng = np.random.default_rng(0)
        self.episode, self.t = -1, 0

    def _begin_episode(self, seed: int | None) -> None:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.episode, self.t = self.episode + 1, 0

    def render(self) -> int:
        return self.t


class ComingAndGoing(_Episodes, ParallelEnv):
    """Agents that appear and leave mid-episode.

    ``a0`` and ``a1`` start; ``a2`` appears after step 2 (with a reward before it ever
    acts); ``a0`` terminates at step 3, ``a1`` is truncated at step 5, ``a2`` terminates
    at step ``6 + episode % 2``; ``a3`` never appears. Observations are
    ``[t, agent index, uniform draw]`` (float32, shape ``(3,)``), actions
    ``Discrete(3)``. Rewards depend on the action, the agent and the seeded rng, so any
    misplaced reward shows. ``render()`` returns ``t``.
    """

    # The base class declares it per instance, so not a ClassVar.
    metadata: dict[str, Any] = {"name": "coming_and_going_v0"}  # noqa: RUF012

    def __init__(self) -> None:
        super().__init__()
        self.possible_agents = ["a0", "a1", "a2", "a3"]
        self._obs_space = spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self._act_space = spaces.Discrete(3)

    # One space object for every agent, as PettingZoo asks.
    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._act_space

    def _obs(self, agent: str) -> np.ndarray:
        k = self.possible_agents.index(agent)
        return np.array([self.t, k, self.rng.uniform()], np.float32)

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
        self._begin_episode(seed)
        self.agents = ["a0", "a1"]
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        if set(actions) != set(self.agents):
            raise ValueError(
                f"ComingAndGoing.step: actions for {sorted(actions)}, live agents "
                f"are {self.agents}."
            )
        self.t += 1
        rewards = {
            a: float(actions[a]) + 0.1 * self.possible_agents.index(a) + self.rng.uniform()
            for a in self.agents
        }
        terms = dict.fromkeys(self.agents, False)
        truncs = dict.fromkeys(self.agents, False)
        if self.t == 3:
            terms["a0"] = True
        if self.t == 5:
            truncs["a1"] = True
        if self.t == 6 + self.episode % 2:
            terms["a2"] = True
        obs = {a: self._obs(a) for a in self.agents}
        if self.t == 2:
            self.agents = [*self.agents, "a2"]
            obs["a2"] = self._obs("a2")
            rewards["a2"] = 0.5  # before a2 ever acts: carried onto its first action
            terms["a2"] = truncs["a2"] = False
        infos = {a: {"t": self.t} for a in obs}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos


class Relay(_Episodes, AECEnv):
    """A turn-based env where every step pays every live agent, so rewards reach agents
    between their turns.

    ``r0``, ``r1``, ``r2`` take turns; ``r1`` terminates after its second turn (and is
    removed by its dead step, which pays the others a seeded random reward); the episode
    ends after 8 turns (everyone left is truncated). Observations are
    ``[t, agent index]`` (float32, shape ``(2,)``), actions ``Discrete(4)``.
    """

    # The base class declares it per instance, so not a ClassVar.
    metadata: dict[str, Any] = {"name": "relay_v0", "is_parallelizable": False}  # noqa: RUF012

    def __init__(self) -> None:
        super().__init__()
        self.possible_agents = ["r0", "r1", "r2"]

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(4)

    def observe(self, agent: str) -> np.ndarray:
        return np.array([self.t, self.possible_agents.index(agent)], np.float32)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self._begin_episode(seed)
        self.turns = dict.fromkeys(self.possible_agents, 0)
        self.agents = self.possible_agents[:]
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        from pettingzoo.utils.agent_selector import AgentSelector

        self._selector = AgentSelector(self.agents)
        self.agent_selection = self._selector.reset()

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            for a in self.agents:  # the dead step pays the others too
                self.rewards[a] = float(self.rng.uniform())
            self._accumulate_rewards()
            return
        self._cumulative_rewards[agent] = 0.0
        self.t += 1
        self.turns[agent] += 1
        for a in self.agents:
            self.rewards[a] = float(action) * (1 + self.possible_agents.index(a)) + 0.01 * self.t
        if agent == "r1" and self.turns[agent] == 2:
            self.terminations["r1"] = True
        if self.t >= 8:
            for a in self.agents:
                self.truncations[a] = True
        self._accumulate_rewards()
        self.agent_selection = self._selector.next()
        while self.agent_selection not in self.agents and self.agents:  # skip removed agents
            self.agent_selection = self._selector.next()
        self._deads_step_first()


def coming_and_going() -> ComingAndGoing:
    """A new :class:`ComingAndGoing` (a picklable factory)."""
    return ComingAndGoing()


def relay() -> Relay:
    """A new :class:`Relay` (a picklable factory)."""
    return Relay()


def tictactoe() -> AECEnv:
    """PettingZoo's own ``classic.tictactoe_v3`` env (turn-based, dict observations with
    an action mask; a picklable factory)."""
    from pettingzoo.classic import tictactoe_v3

    return tictactoe_v3.env()
