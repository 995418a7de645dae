"""Multi-agent metrics: env steps and agent steps counted apart (as RLlib does), and
episode statistics per policy and per agent."""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxrunner._src.core.metrics import EpisodeStats, MetricsConfig, RunnerMetrics


class MultiAgentMetrics(RunnerMetrics):
    """A runner's env-level metrics (episode returns summed over agents) plus agent
    steps and per-agent episode statistics, per policy and per agent."""

    def __init__(self, config: MetricsConfig, agents: dict[str, tuple[str, ...]]) -> None:
        super().__init__(config)
        self.num_agent_steps = 0
        self.num_dropped_agent_steps = 0
        """Agent actions no transition carries: their env's step failed (restarted)."""
        self.unassigned_reward = 0.0
        self._agents = agents
        window = config.episode_window
        self._by_policy = {pid: EpisodeStats(window) for pid in agents}
        self._by_agent = {a: EpisodeStats(window) for ids in agents.values() for a in ids}
        self._steps_by_policy = dict.fromkeys(agents, 0)
        self._steps_by_agent = {a: 0 for ids in agents.values() for a in ids}

    def add_group_counts(
        self,
        policy_id: str,
        steps: np.ndarray,
        ended: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> None:
        """Adds a group's agent steps per slot (``steps``, ``[A_g]``) and the agent
        episodes that ended (arrays ``(slot, return, length)``, in the order they
        ended)."""
        self.num_agent_steps += int(steps.sum())
        self._steps_by_policy[policy_id] += int(steps.sum())
        slots, returns, lengths = ended
        self._by_policy[policy_id].add(returns, lengths)
        for a, agent in enumerate(self._agents[policy_id]):
            self._steps_by_agent[agent] += int(steps[a])
            mine = slots == a
            if mine.any():
                self._by_agent[agent].add(returns[mine], lengths[mine])

    def get_state(self) -> dict[str, Any]:
        """:meth:`RunnerMetrics.get_state` plus ``agents``: the agent-step counters
        (``counters``: agent steps, dropped agent steps), ``unassigned_reward``, and
        per policy id and per agent id (``policies``, ``agents``) the agent-episode
        ``counters`` (episodes, agent steps) and recent ``returns`` and ``lengths``."""
        state: dict[str, Any] = dict(super().get_state())

        def stats(s: EpisodeStats, steps: int) -> dict[str, np.ndarray]:
            return {"counters": np.array([s.num_episodes, steps], np.int64), **s.get_window()}

        state["agents"] = {
            "counters": np.array([self.num_agent_steps, self.num_dropped_agent_steps], np.int64),
            "unassigned_reward": np.asarray(self.unassigned_reward, np.float64),
            "policies": {
                pid: stats(s, self._steps_by_policy[pid]) for pid, s in self._by_policy.items()
            },
            "agents": {a: stats(s, self._steps_by_agent[a]) for a, s in self._by_agent.items()},
        }
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Takes a :meth:`get_state` as its own (the windows keep this runner's size)."""
        super().set_state(state)
        agents = state["agents"]
        self.num_agent_steps, self.num_dropped_agent_steps = map(int, agents["counters"])
        self.unassigned_reward = float(agents["unassigned_reward"])
        for by, steps, key in (
            (self._by_policy, self._steps_by_policy, "policies"),
            (self._by_agent, self._steps_by_agent, "agents"),
        ):
            for name, stats in by.items():
                saved = agents[key][name]
                num_episodes, steps[name] = map(int, saved["counters"])
                stats.set_window(num_episodes, saved)

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out["num_agent_steps"] = self.num_agent_steps
        out["num_dropped_agent_steps"] = self.num_dropped_agent_steps
        out["unassigned_reward"] = self.unassigned_reward
        out["policies"] = {
            pid: {"num_agent_steps": self._steps_by_policy[pid], **stats.summary()}
            for pid, stats in self._by_policy.items()
        }
        out["agents"] = {
            agent: {"num_agent_steps": self._steps_by_agent[agent], **stats.summary()}
            for agent, stats in self._by_agent.items()
        }
        return out
