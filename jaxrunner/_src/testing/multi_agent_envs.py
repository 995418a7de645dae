"""Small deterministic PettingZoo envs for testing multi-agent backends (:class:`ComingAndGoing`,
:class:`Relay`) and picklable factories of them and of PettingZoo's tictactoe. It imports
PettingZoo (optional), so ``jaxrunner.testing`` loads it only on first use."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils import agent_selector


class ComingAndGoing(ParallelEnv):
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
        self.possible_agents = ["a0", "a1", "a2", "a3"]
        self._obs_space = spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self._act_space = spaces.Discrete(3)
        self.rng = np.random.default_rng(0)
        self.episode = -1
        """Episodes begun (the first reset makes it 0)."""
        self.t = 0

    # One space object for every agent, as PettingZoo asks.
    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._act_space

    # ``t`` for the tests to read, outside PettingZoo's render types on purpose.
    def render(self) -> int:  # type: ignore[override]
        return self.t

    def _obs(self, agent: str) -> np.ndarray:
        k = self.possible_agents.index(agent)
        return np.array([self.t, k, self.rng.uniform()], np.float32)

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.episode += 1
        self.t = 0
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


class Relay(AECEnv):
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
        self.rng = np.random.default_rng(0)
        self.t = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(4)

    def observe(self, agent: str) -> np.ndarray:
        return np.array([self.t, self.possible_agents.index(agent)], np.float32)

    # ``t`` for the tests to read, outside PettingZoo's render types on purpose.
    def render(self) -> int:  # type: ignore[override]
        return self.t

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
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
