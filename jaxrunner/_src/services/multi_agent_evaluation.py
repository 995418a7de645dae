"""Evaluation of multi-agent policies: returns over N complete env episodes on envs
kept for it (``jaxrunner.evaluate`` dispatches here for a multi-agent vector env).

As for single-agent envs, a fresh runner samples the evaluation envs (a training
runner's envs, episodes and metrics are never touched), every env is reset from the
seed first, and env ``i`` contributes its first episodes, a fixed share per env, so
short episodes are not favoured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxrunner._src.connectors.per_group import GroupConnectors
from jaxrunner._src.connectors.pipeline import ConnectorsState
from jaxrunner._src.core.multi_agent_trajectory import MultiAgentTrajectory
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.runner.multi_agent_runner import MultiAgentRunner
from jaxrunner._src.services.frozen_connectors import frozen_state
from jaxrunner.errors import InvalidArgumentError


@dataclasses.dataclass(frozen=True)
class MultiAgentEvaluationResult:
    """What :func:`jaxrunner.evaluate` returns for a multi-agent vector env.

    Attributes:
        env_ids: each env episode's env, ``[N]``, ordered by env, then by start.
        returns: each env episode's total reward over its agents' transitions, ``[N]``.
        lengths: each env episode's env steps, ``[N]``.
        agent_returns: agent id -> its total reward in each of those episodes, ``[N]``
            (0 where it never acted).
    """

    env_ids: np.ndarray
    returns: np.ndarray
    lengths: np.ndarray
    agent_returns: dict[str, np.ndarray]

    @property
    def num_episodes(self) -> int:
        return len(self.returns)

    @property
    def return_mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def length_mean(self) -> float:
        return float(np.mean(self.lengths))

    def summary(self) -> dict[str, float]:
        """Flat statistics for a logger: ``return_mean``, ``return_std``,
        ``length_mean``, ``num_episodes`` and ``return_mean/<agent>`` per agent."""
        out = {
            "return_mean": self.return_mean,
            "return_std": float(np.std(self.returns)),
            "length_mean": self.length_mean,
            "num_episodes": float(self.num_episodes),
        }
        for agent, returns in self.agent_returns.items():
            out[f"return_mean/{agent}"] = float(np.mean(returns))
        return out


def evaluate_multi_agent(
    envs: Any,
    policies: Policy | Mapping[str, Policy],
    params: Params,
    num_episodes: int,
    *,
    deterministic: bool,
    seed: int,
    rollout_length: int,
    connectors: GroupConnectors | None = None,
    connector_state: Any = None,
) -> MultiAgentEvaluationResult:
    """See :func:`jaxrunner.evaluate` (``policies``, ``params`` and ``connectors`` as
    for :class:`~jaxrunner.MultiAgentRunner`; ``connector_state`` by policy id, as its
    ``get_connector_state()`` returns it)."""
    if isinstance(policies, Policy):
        acting: Policy | dict[str, Policy] = policies.deterministic() if deterministic else policies
    else:
        acting = {
            pid: p.deterministic() if deterministic else p for pid, p in dict(policies).items()
        }
    runner = MultiAgentRunner(envs, acting, params, rollout_length, seed, connectors=connectors)
    try:
        if runner.connectors:
            runner.set_connector_state(_frozen_states(runner, connector_state))
        return _collect(runner, envs.num_envs, num_episodes)
    finally:  # the caller's envs stay open, free for the next evaluation
        runner.stop(close_envs=False)


def _frozen_states(runner: MultiAgentRunner, given: Any) -> dict[str, ConnectorsState]:
    """Each group's connector state for evaluation: ``given[policy_id]`` (the training
    runner's) loaded and frozen, as for a single-agent env."""
    fresh = runner.get_connector_state()
    if given is not None and (not isinstance(given, Mapping) or not set(given) <= set(fresh)):
        got = sorted(given, key=str) if isinstance(given, Mapping) else type(given).__name__
        raise InvalidArgumentError(
            "evaluate(envs=<multi-agent>, connector_state=...): expected a dict keyed by the "
            f"policy ids with connectors ({list(fresh)}), got {got}. Pass the training "
            "runner's get_connector_state()."
        )
    return {
        pid: frozen_state(state, runner.connectors[pid], (given or {}).get(pid))
        for pid, state in fresh.items()
    }


class _EnvEpisodes:
    """Each env's episodes, summed from the samples' slots until they end."""

    def __init__(self, num_envs: int, num_episodes: int, agents: list[str]) -> None:
        self.share = [
            num_episodes // num_envs + (i < num_episodes % num_envs) for i in range(num_envs)
        ]
        self.agents = agents
        self.running = [self._new() for _ in range(num_envs)]
        self.done: list[list[tuple[float, int, dict[str, float]]]] = [[] for _ in range(num_envs)]

    def _new(self) -> tuple[list[float], list[int], dict[str, float]]:
        return [0.0], [0], dict.fromkeys(self.agents, 0.0)

    @property
    def missing(self) -> int:
        return sum(want - len(got) for want, got in zip(self.share, self.done))

    def add(self, traj: MultiAgentTrajectory) -> None:
        # Per [t, b]: the rewards of the transitions completed there, per agent. A
        # transition never crosses its env episode (every one completes by its end).
        per_agent = {}
        for pid, group in traj.groups.items():
            rewards = np.where(group.valid, group.reward, 0.0)
            for a, agent in enumerate(traj.agents[pid]):
                per_agent[agent] = rewards[:, :, a]
        for b in range(traj.num_envs):
            for t in range(traj.num_steps):
                total, length, agents = self.running[b]
                for agent, rewards in per_agent.items():
                    agents[agent] += float(rewards[t, b])
                    total[0] += float(rewards[t, b])
                length[0] += 1
                if traj.env_done[t, b]:
                    if len(self.done[b]) < self.share[b]:
                        self.done[b].append((total[0], length[0], dict(agents)))
                    self.running[b] = self._new()

    def result(self) -> MultiAgentEvaluationResult:
        rows = [(b, *ep) for b, eps in enumerate(self.done) for ep in eps]
        return MultiAgentEvaluationResult(
            env_ids=np.array([r[0] for r in rows], np.int64),
            returns=np.array([r[1] for r in rows], np.float64),
            lengths=np.array([r[2] for r in rows], np.int64),
            agent_returns={
                agent: np.array([r[3][agent] for r in rows], np.float64) for agent in self.agents
            },
        )


def _collect(
    runner: MultiAgentRunner, num_envs: int, num_episodes: int
) -> MultiAgentEvaluationResult:
    episodes = _EnvEpisodes(num_envs, num_episodes, list(runner.envs.possible_agents))
    while episodes.missing:
        episodes.add(runner.sample())
    return episodes.result()
