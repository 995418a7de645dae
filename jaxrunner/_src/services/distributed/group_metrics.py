"""A group's metrics from its runners' own: counters and rates summed, episode statistics and
perf timers averaged."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def aggregate_metrics(per_runner: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Group metrics from runners' ``get_metrics()``: counters and rates summed, episode
    statistics and perf timers averaged; ``policies`` and ``agents`` entries alike."""
    runs = list(per_runner.values())
    if not runs:
        return {}
    out = _aggregate(runs)
    out["env_steps_per_s"] = float(sum(m.get("env_steps_per_s", 0.0) for m in runs))
    perf_keys = set().union(*(m.get("perf", {}) for m in runs))
    out["perf"] = {
        k: float(np.mean([m["perf"][k] for m in runs if k in m.get("perf", {})]))
        for k in sorted(perf_keys)
    }
    for part in ("policies", "agents"):
        if part in runs[0]:
            out[part] = {
                key: _aggregate([m[part][key] for m in runs if key in m.get(part, {})])
                for key in runs[0][part]
            }
    return out


def _aggregate(runs: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The counters (those ``runs[0]`` has) summed, the episode statistics averaged."""
    counters = ("num_env_steps", "num_episodes", "num_faulty_episodes", "num_dropped_steps")
    counters += ("num_agent_steps", "num_dropped_agent_steps")
    out: dict[str, Any] = {
        key: sum(int(m.get(key, 0)) for m in runs) for key in counters if key in runs[0]
    }
    if "unassigned_reward" in runs[0]:
        out["unassigned_reward"] = float(sum(m.get("unassigned_reward", 0.0) for m in runs))
    with np.errstate(all="ignore"):
        for key, fn in (
            ("episode_return_mean", np.nanmean),
            ("episode_length_mean", np.nanmean),
            ("episode_return_min", np.nanmin),
            ("episode_return_max", np.nanmax),
        ):
            values = [m.get(key, float("nan")) for m in runs]
            out[key] = float(fn(values)) if not np.all(np.isnan(values)) else float("nan")
    return out
