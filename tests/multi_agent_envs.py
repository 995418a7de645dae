"""Small PettingZoo envs for the multi-agent tests (module-level: picklable factories)."""

from __future__ import annotations

import functools
from typing import ClassVar

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils import agent_selector


class ComingAndGoing(ParallelEnv):
    """Agents that appear and leave mid-episode.

    ``a0`` and ``a1`` start; ``a2`` appears after step 2 (with a reward before it ever
    acts); ``a0`` terminates at step 3, ``a1`` is truncated at step 5, ``a2`` terminates
    at step ``6 + episode % 2``; ``a3`` never appears. Rewards depend on the action,
    the agent and the seeded rng, so any misplaced reward shows.
    """

    metadata: ClassVar[dict] = {"name": "coming_and_going_v0"}

    def __init__(self) -> None:
        self.possible_agents = ["a0", "a1", "a2", "a3"]
        self._obs_space = spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self._act_space = spaces.Discrete(3)
        self.rng = np.random.default_rng(0)
        self.episode = -1

    @functools.cache  # noqa: B019
    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_space

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> spaces.Space:
        return self._act_space

    def render(self) -> int:
        return self.t

    def _obs(self, agent: str) -> np.ndarray:
        k = self.possible_agents.index(agent)
        return np.array([self.t, k, self.rng.uniform()], np.float32)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.episode += 1
        self.t = 0
        self.agents = ["a0", "a1"]
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (actions, self.agents)
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


def coming_and_going() -> ComingAndGoing:
    return ComingAndGoing()


def simple_spread():
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=3, max_cycles=10)


def simple_adversary():
    from mpe2 import simple_adversary_v3

    return simple_adversary_v3.parallel_env(N=2, max_cycles=8)


def tictactoe():
    from pettingzoo.classic import tictactoe_v3

    return tictactoe_v3.env()


def connect_four():
    from pettingzoo.classic import connect_four_v3

    return connect_four_v3.env()


class Relay(AECEnv):
    """A turn-based env where every step pays every live agent, so rewards reach agents
    between their turns. ``r0``, ``r1``, ``r2`` take turns; ``r1`` terminates after its
    second turn (and is removed by its dead step, while the others' rewards go on);
    the episode ends after 8 steps (everyone left is truncated)."""

    metadata: ClassVar[dict] = {"name": "relay_v0", "is_parallelizable": False}

    def __init__(self) -> None:
        super().__init__()
        self.possible_agents = ["r0", "r1", "r2"]
        self.rng = np.random.default_rng(0)

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(4)

    def observe(self, agent: str) -> np.ndarray:
        return np.array([self.t, self.possible_agents.index(agent)], np.float32)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.turns = dict.fromkeys(self.possible_agents, 0)
        self.agents = self.possible_agents[:]
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self._selector = agent_selector.AgentSelector(self.agents)
        self.agent_selection = self._selector.reset()

    def step(self, action):
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


def relay() -> Relay:
    return Relay()


class FaultyComingAndGoing(ComingAndGoing):
    """:class:`ComingAndGoing` that misbehaves at step ``at_step`` of the episodes reset
    with seed ``trigger_seed`` (so only the sub-env that gets that seed faults):
    ``"raise"``, ``"hang"``, ``"exit"`` (the process ends), ``"bad_obs"`` (agent
    ``a1``'s observation in float64)."""

    def __init__(self, kind: str, trigger_seed: int, at_step: int) -> None:
        super().__init__()
        self.kind, self.trigger_seed, self.at_step = kind, trigger_seed, at_step
        self.armed = False

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.armed = seed == self.trigger_seed
        return super().reset(seed, options)

    def step(self, actions):
        if not (self.armed and self.t + 1 == self.at_step):
            return super().step(actions)
        if self.kind == "raise":
            raise ValueError("boom")
        if self.kind == "hang":
            import time

            time.sleep(600)
        if self.kind == "exit":
            import os

            os._exit(3)
        obs, rewards, terms, truncs, infos = super().step(actions)
        obs["a1"] = obs["a1"].astype(np.float64)  # "bad_obs"
        return obs, rewards, terms, truncs, infos


def faulty_coming_and_going(kind: str, trigger_seed: int, at_step: int = 2):
    """A factory of :class:`FaultyComingAndGoing` (picklable)."""
    return functools.partial(FaultyComingAndGoing, kind, trigger_seed, at_step)


class FaultyRelay(Relay):
    """:class:`Relay` whose step raises at turn ``at_step`` of the episodes reset with
    seed ``trigger_seed``."""

    def __init__(self, trigger_seed: int, at_step: int) -> None:
        super().__init__()
        self.trigger_seed, self.at_step, self.armed = trigger_seed, at_step, False

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.armed = seed == self.trigger_seed
        return super().reset(seed, options)

    def step(self, action):
        if self.armed and self.t + 1 == self.at_step:
            raise ValueError("boom")
        return super().step(action)
