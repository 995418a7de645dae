"""What the contract compares a backend with: envs stepped by hand (gymnasium envs as the
one-agent case, PettingZoo parallel envs by their API, AEC envs by PettingZoo's own
``last()`` loop), and gymnasium's own SyncVectorEnv."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Literal

import gymnasium
from gymnasium.vector import AutoresetMode

EnvKind = Literal["gymnasium", "parallel", "aec"]
"""A kind of host env: gymnasium, PettingZoo parallel, PettingZoo AEC (turn-based)."""
ONE_AGENT = "agent"
"""The agent id of a gymnasium env, the one-agent case."""


class ContractParts:
    """What the contract's mixins take from
    :class:`~jaxrunner._src.testing.contract.VectorEnvContract`: its settings and helpers."""

    num_envs: int
    seed: int
    num_steps: int
    kind: Any
    _make: Callable[..., Any]
    _fns: Callable[..., Any]
    _basic: Callable[..., Any]
    _seeds: Callable[[int], list[int | None]]
    _reset: Callable[..., Any]
    env_cases: Callable[[], dict[str, Any]]


def gymnasium_reference(env_fns: Sequence[Callable[[], Any]]) -> gymnasium.vector.SyncVectorEnv:
    """gymnasium's SyncVectorEnv with SAME_STEP autoreset: what every backend must equal."""
    return gymnasium.vector.SyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)


@dataclasses.dataclass
class ExpectedRow:
    """What one sub-env's row of a step must hold."""

    completed: dict[str, tuple[Any, float, bool, bool]]
    """Per agent whose transition completed: (next_obs, reward, terminated, truncated)."""
    done: bool
    env_reward: float
    infos: Any
    reset_info: Any = None
    """The info of the SAME_STEP autoreset where ``done`` (gymnasium envs; None else)."""
    unassigned_reward: float = 0.0
    """Where ``done``: the rewards no transition carries (an agent's that never acted, or
    that came after its final transition), as ``MultiAgentStep.unassigned_reward``."""


class GymnasiumByHand:
    """A gymnasium env stepped by hand, one agent: its transition completes in the step,
    and an ended episode is reset in the same step (unseeded), as SAME_STEP autoreset."""

    reward_atol = 0.0  # one agent: rewards are the env's own, never sums

    def __init__(self, env: gymnasium.Env) -> None:
        self.env = env
        self.acting: dict[str, Any] = {}
        self.started: set[str] = set()

    def reset(self, seed: int | None, options: dict[str, Any] | None = None) -> Any:
        obs, info = self.env.reset(seed=seed, options=options)
        self.acting, self.started = {ONE_AGENT: obs}, set()
        return info

    def step(self, act: Callable[[str], Any]) -> ExpectedRow:
        obs, reward, terminated, truncated, info = self.env.step(act(ONE_AGENT))
        self.started.add(ONE_AGENT)
        done = bool(terminated or truncated)
        completed = {ONE_AGENT: (obs, float(reward), bool(terminated), bool(truncated))}
        self.acting = {ONE_AGENT: obs}
        reset_info = self.reset(None) if done else None  # SAME_STEP autoreset, unseeded
        return ExpectedRow(completed, done, float(reward), info, reset_info)


class ParallelByHand:
    """A ``ParallelEnv`` stepped by hand: every acting agent's transition completes in
    the step; a reward before an agent's first action goes onto its first transition."""

    # Sums of the env's rewards, maybe added in another order: equal to rounding.
    reward_atol = 1e-12

    def __init__(self, env: Any) -> None:
        self.env = env
        self.acting: dict[str, Any] = {}
        self.started: set[str] = set()
        self.pending: dict[str, float] = {}

    def reset(self, seed: int | None, options: dict[str, Any] | None = None) -> Any:
        obs, infos = self.env.reset(seed=seed, options=options)
        self.acting, self.started, self.pending = dict(obs), set(), {}
        return infos

    def step(self, act: Callable[[str], Any]) -> ExpectedRow:
        actions = {agent: act(agent) for agent in self.acting}
        obs, rewards, terms, truncs, infos = self.env.step(actions)
        self.started |= set(actions)
        for agent, r in rewards.items():
            self.pending[agent] = self.pending.get(agent, 0.0) + r
        completed = {
            agent: (
                obs[agent],
                self.pending.pop(agent, 0.0),
                terms.get(agent, False),
                truncs.get(agent, False),
            )
            for agent in actions
        }
        ended = {agent for agent in obs if terms.get(agent, False) or truncs.get(agent, False)}
        self.acting = {agent: o for agent, o in obs.items() if agent not in ended}
        done = not self.acting
        unassigned = sum(self.pending.values(), 0.0) if done else 0.0  # (reset forgets them)
        if done:
            self.reset(None)  # SAME_STEP autoreset, unseeded
        return ExpectedRow(completed, done, sum(rewards.values(), 0.0), infos, None, unassigned)


class AECByHand:
    """An ``AECEnv`` stepped by hand with PettingZoo's own loop (``last()`` at each
    turn): an action's transition completes at the agent's next turn with ``last()``'s
    reward (what it received since it acted), flags and observation; what it received
    before its first action is added to its first transition."""

    reward_atol = ParallelByHand.reward_atol

    def __init__(self, env: Any) -> None:
        self.env = env
        self.acting: dict[str, Any] = {}
        self.started: set[str] = set()
        self.waiting: set[str] = set()
        self.before_first: dict[str, float] = {}
        self.final_infos: dict[str, Any] = {}  # last()'s info at a completing dead step

    def reset(self, seed: int | None, options: dict[str, Any] | None = None) -> Any:
        self.env.reset(seed=seed, options=options)
        self.started, self.waiting, self.before_first = set(), set(), {}
        self._settle({})
        return dict(self.env.infos)

    def _settle(self, completed: dict[str, tuple[Any, float, bool, bool]]) -> float:
        """Turns until a live agent is to act (dead agents step with None)."""
        env, reward = self.env, 0.0
        self.acting = {}
        while env.agents:
            agent = env.agent_selection
            obs, r, term, trunc, info = env.last()
            if agent in self.waiting:
                self.waiting.discard(agent)
                completed[agent] = (obs, r + self.before_first.pop(agent, 0.0), term, trunc)
                if term or trunc:  # its dead step removes it with its infos
                    self.final_infos[agent] = info
            elif agent not in self.started:
                self.before_first[agent] = r
            if not (term or trunc):
                self.acting = {agent: obs}
                break
            env.step(None)
            reward += sum(env.rewards.values())
        return reward

    def step(self, act: Callable[[str], Any]) -> ExpectedRow:
        env = self.env
        (agent,) = self.acting
        self.started.add(agent)
        self.waiting.add(agent)
        env.step(act(agent))
        completed: dict[str, tuple[Any, float, bool, bool]] = {}
        self.final_infos = {}
        env_reward = sum(env.rewards.values())
        env_reward += self._settle(completed)
        infos = {**self.final_infos, **env.infos}
        done = not env.agents
        unassigned = 0.0
        if done:
            if self.waiting:  # not in the contract envs: no reference for it
                raise AssertionError(
                    f"the reference cannot step an env that removes agents {self.waiting} "
                    "without their dead step"
                )
            # What agents that never acted received: no transition of theirs carries it.
            unassigned = sum(self.before_first.values(), 0.0)
            self.reset(None)
        return ExpectedRow(completed, done, env_reward, infos, None, unassigned)


ByHand = GymnasiumByHand | ParallelByHand | AECByHand


def by_hand(factory: Callable[[], Any]) -> ByHand:
    """A new env from ``factory``, to be stepped by hand (reset it first)."""
    env = factory()
    if isinstance(env, gymnasium.Env):
        return GymnasiumByHand(env)
    from pettingzoo import AECEnv  # optional: only multi-agent envs need it

    return AECByHand(env) if isinstance(env, AECEnv) else ParallelByHand(env)
