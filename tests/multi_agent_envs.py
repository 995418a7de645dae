"""Small PettingZoo envs for the multi-agent tests (module-level: picklable factories)."""

from __future__ import annotations

import functools
from typing import ClassVar

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


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
