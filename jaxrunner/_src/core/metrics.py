"""Sampler metrics: per-step perf timers (mean or EMA), recent-episode statistics, and
for multi-agent runners agent steps and episode statistics per policy and per agent."""

from __future__ import annotations

import collections
import dataclasses
import warnings
from typing import Any

import numpy as np

from jaxrunner._src.arg_checks import check_int, check_number

PERF_KEYS: tuple[str, ...] = (
    "env_wait_ms",
    "inference_ms",
    "obs_processing_ms",
    "action_processing_ms",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MetricsConfig:
    """How the runner summarises what it measured."""

    episode_window: int = 100
    """Episode return/length means are over this many most recent episodes."""
    perf_ema: float | None = None
    """None: perf timers are the mean over every step so far. A float in (0, 1]:
    an exponential moving average with this weight per step (as RLlib's sampler)."""

    def __post_init__(self) -> None:
        check_int("MetricsConfig", "episode_window", self.episode_window)
        check_number(
            "MetricsConfig", "perf_ema", self.perf_ema, low_open=True, high=1.0,
            hint="the weight of each step", none="for the mean over every step",
        )  # fmt: skip


class PerfTimers:
    """Milliseconds per env step spent in each phase of the sampling loop."""

    def __init__(self, ema: float | None) -> None:
        self._ema = ema
        self._value = dict.fromkeys(PERF_KEYS, 0.0)  # seconds per step
        self._steps = 0

    def record(self, totals_s: dict[str, float], num_steps: int) -> None:
        """Adds ``num_steps`` steps whose phases took ``totals_s`` seconds in all."""
        if num_steps <= 0:
            return
        for key in PERF_KEYS:
            mean = totals_s[key] / num_steps
            if self._ema is None or self._steps == 0:
                # Running mean (and the EMA's first value).
                weight = num_steps / (self._steps + num_steps)
            else:
                # num_steps EMA updates by the same per-step value, in closed form.
                weight = 1.0 - (1.0 - self._ema) ** num_steps
            self._value[key] += weight * (mean - self._value[key])
        self._steps += num_steps

    def summary(self) -> dict[str, float]:
        return {key: 1000.0 * value for key, value in self._value.items()}


class EpisodeStats:
    """Counts of finished episodes and their returns/lengths over a recent window."""

    def __init__(self, window: int) -> None:
        self.num_episodes = 0
        self.num_agent_steps = 0  # counted by a multi-agent runner's per-policy/agent stats
        self.window = window
        self._returns: collections.deque[float] = collections.deque(maxlen=window)
        self._lengths: collections.deque[int] = collections.deque(maxlen=window)

    def add(
        self, returns: np.ndarray, lengths: np.ndarray, num_episodes: int | None = None
    ) -> None:
        """Counts ``num_episodes`` ended episodes (default ``len(returns)``), of which
        ``returns`` and ``lengths`` are the latest. One whose return is not finite is
        counted but kept out of the window (it would make every statistic inf or NaN)."""
        self.num_episodes += len(returns) if num_episodes is None else num_episodes
        finite = np.isfinite(returns)
        if not finite.all():
            warnings.warn(
                f"jaxrunner metrics: {int(np.count_nonzero(~finite))} episode(s) ended with "
                "a return that overflows float64 (rewards finite one by one, their sum not). "
                "They count in num_episodes but not in the episode_return_* and "
                "episode_length_mean statistics; scale the rewards down to keep them.",
                RuntimeWarning,
                stacklevel=2,
            )
            returns, lengths = returns[finite], lengths[finite]
        # Only the latest ``window`` stay: converting the rest costs ~5 us per 1k episodes.
        self._returns.extend(returns[-self.window :].tolist())
        self._lengths.extend(lengths[-self.window :].tolist())

    def get_window(self) -> dict[str, np.ndarray]:
        """The recent window as arrays (for checkpoints): ``returns``, ``lengths``."""
        return {
            "returns": np.array(self._returns, np.float64),
            "lengths": np.array(self._lengths, np.int64),
        }

    def set_window(self, num_episodes: int, window: dict[str, np.ndarray]) -> None:
        """Takes a count and a :meth:`get_window` as its own (the window keeps its size)."""
        self.num_episodes = num_episodes
        for values, key in ((self._returns, "returns"), (self._lengths, "lengths")):
            values.clear()
            values.extend(window[key].tolist())

    def summary(self) -> dict[str, Any]:
        def stat(values: collections.deque, fn: Any) -> float:
            return float(fn(values)) if values else float("nan")

        return {
            "num_episodes": self.num_episodes,
            "episode_return_mean": stat(self._returns, finite_mean),
            "episode_return_min": stat(self._returns, np.min),
            "episode_return_max": stat(self._returns, np.max),
            "episode_length_mean": stat(self._lengths, np.mean),
        }


def finite_mean(values: collections.deque) -> float:
    """The mean of finite values, also where their sum overflows (returns near float64's
    max: ``np.mean`` gives inf and warns)."""
    with np.errstate(over="ignore"):
        mean = np.mean(values)
    return float(mean if np.isfinite(mean) else np.sum(np.asarray(values) / len(values)))


class RunnerMetrics:
    """Everything a runner counts (``summary``: its ``get_metrics()``); with ``agents``
    (policy id -> agent ids) also agent steps and agent-episode statistics per policy
    and agent."""

    def __init__(self, config: MetricsConfig, agents: dict[str, tuple[str, ...]] | None = None):
        self.num_env_steps = 0  # valid transitions only
        self.num_faulty_episodes = 0
        self.num_dropped_steps = 0
        self.sample_time_s = 0.0
        self.episodes = EpisodeStats(config.episode_window)
        self.perf = PerfTimers(config.perf_ema)
        self.num_agent_steps = 0
        self.num_dropped_agent_steps = 0
        """Agent actions no transition carries: their env's step failed (restarted)."""
        self.unassigned_reward = 0.0
        self._agents = agents
        window, groups = config.episode_window, agents or {}
        self._by_policy = {pid: EpisodeStats(window) for pid in groups}
        self._by_agent = {a: EpisodeStats(window) for ids in groups.values() for a in ids}

    def add(self, counts: Any) -> None:
        """Adds a :class:`~jaxrunner._src.samplers.episode_ids.SampleCounts`."""
        self.num_env_steps += counts.num_env_steps
        self.num_faulty_episodes += counts.num_faulty_episodes
        self.num_dropped_steps += counts.num_faulty_episodes  # (one per failed slot)
        self.episodes.add(counts.returns, counts.lengths, counts.num_episodes)

    def add_group_counts(
        self,
        policy_id: str,
        steps: np.ndarray,
        ended: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> None:
        """Adds a group's agent steps per slot (``steps``, ``[A_g]``) and the agent
        episodes that ended (arrays ``(slot, return, length)``)."""
        self.num_agent_steps += int(steps.sum())
        self._by_policy[policy_id].num_agent_steps += int(steps.sum())
        slots, returns, lengths = ended
        self._by_policy[policy_id].add(returns, lengths)
        for a, agent in enumerate(self._agents[policy_id] if self._agents else ()):
            self._by_agent[agent].num_agent_steps += int(steps[a])
            mine = slots == a
            if mine.any():
                self._by_agent[agent].add(returns[mine], lengths[mine])

    def get_state(self) -> dict[str, Any]:
        """Counters, episode windows and perf timers as arrays (for checkpoints); with
        agents, also ``agents``: their counters and windows, per policy and agent."""
        state: dict[str, Any] = {
            "counters": np.array(
                [
                    self.num_env_steps,
                    self.num_faulty_episodes,
                    self.num_dropped_steps,
                    self.episodes.num_episodes,
                    self.perf._steps,
                ],
                np.int64,
            ),
            "sample_time_s": np.asarray(self.sample_time_s, np.float64),
            **self.episodes.get_window(),
            "perf": np.array([self.perf._value[key] for key in PERF_KEYS], np.float64),
        }
        if self._agents is None:
            return state

        def stats(s: EpisodeStats) -> dict[str, np.ndarray]:
            counters = np.array([s.num_episodes, s.num_agent_steps], np.int64)
            return {"counters": counters, **s.get_window()}

        state["agents"] = {
            "counters": np.array([self.num_agent_steps, self.num_dropped_agent_steps], np.int64),
            "unassigned_reward": np.asarray(self.unassigned_reward, np.float64),
            "policies": {pid: stats(s) for pid, s in self._by_policy.items()},
            "agents": {a: stats(s) for a, s in self._by_agent.items()},
        }
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Takes a :meth:`get_state` as its own (the windows keep this runner's size)."""
        counters = [int(c) for c in state["counters"]]
        self.num_env_steps, self.num_faulty_episodes, self.num_dropped_steps = counters[:3]
        self.episodes.set_window(counters[3], state)
        self.perf._steps = counters[4]
        self.sample_time_s = float(state["sample_time_s"])
        self.perf._value = dict(zip(PERF_KEYS, state["perf"].tolist()))
        if self._agents is None:
            return
        agents = state["agents"]
        self.num_agent_steps, self.num_dropped_agent_steps = map(int, agents["counters"])
        self.unassigned_reward = float(agents["unassigned_reward"])
        for by, key in ((self._by_policy, "policies"), (self._by_agent, "agents")):
            for name, stats in by.items():
                saved = agents[key][name]
                num_episodes, stats.num_agent_steps = map(int, saved["counters"])
                stats.set_window(num_episodes, saved)

    def summary(self) -> dict[str, Any]:
        out = {
            "num_env_steps": self.num_env_steps,
            **self.episodes.summary(),
            "env_steps_per_s": self.num_env_steps / self.sample_time_s
            if self.sample_time_s
            else 0.0,
            "num_faulty_episodes": self.num_faulty_episodes,
            "num_dropped_steps": self.num_dropped_steps,
            "perf": self.perf.summary(),
        }
        if self._agents is None:
            return out
        out["num_agent_steps"] = self.num_agent_steps
        out["num_dropped_agent_steps"] = self.num_dropped_agent_steps
        out["unassigned_reward"] = self.unassigned_reward

        def per(by: dict[str, EpisodeStats]) -> dict[str, Any]:
            return {k: {"num_agent_steps": s.num_agent_steps, **s.summary()} for k, s in by.items()}

        out["policies"] = per(self._by_policy)
        out["agents"] = per(self._by_agent)
        return out
