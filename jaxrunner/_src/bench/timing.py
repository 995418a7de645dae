"""How the benchmark times things: wall-clock loops, a runner and where its time goes,
and the rollout length per width."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from jaxrunner._src.core.metrics import PERF_KEYS

STEPS_PER_ROLLOUT = 2048
"""About this many env steps per rollout, unless a workload says otherwise."""


def rollout_length(num_envs: int, steps_per_rollout: int = STEPS_PER_ROLLOUT) -> int:
    """T for ``num_envs`` envs, for jaxrunner and the hand loops alike: about
    ``steps_per_rollout`` env steps per rollout, at least 8 steps."""
    return max(8, steps_per_rollout // num_envs)


def timed(step: Callable[[], int], seconds: float) -> float:
    """Calls ``step`` (returning env steps done) for ``seconds``; returns steps/s."""
    steps, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        steps += step()
    return steps / elapsed


def us_per_call(call: Callable[[], object], seconds: float) -> float:
    """Calls ``call`` for ``seconds``; returns microseconds per call."""
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        call()
        calls += 1
    return 1e6 * elapsed / calls


def measure_runner(
    runner: Any, sample: Callable[[], int], num_envs: int, seconds: float
) -> dict[str, Any]:
    """Times ``sample`` (one ``runner.sample()``, returning env steps done) for
    ``seconds``: ``steps_per_s``, ``perf_us`` (the runner's perf timers, us per vector
    step) and ``split_us`` (those as ``env``/``policy``/``record`` and ``other``: wall
    time less the timed phases; None for a runner without perf timers, a pure-JAX scan).
    """
    before = runner.get_metrics()
    steps_per_s = timed(sample, seconds)
    after = runner.get_metrics()
    # The timers are running means (ms per vector step): take earlier steps out.
    n0, n1 = (m["num_env_steps"] / num_envs for m in (before, after))
    perf_us = {
        key.replace("_ms", "_us"): 1000.0
        * (after["perf"][key] * n1 - before["perf"][key] * n0)
        / (n1 - n0)
        for key in PERF_KEYS
    }
    total_us = 1e6 * num_envs / steps_per_s
    split = None
    if any(perf_us.values()):
        split = {
            "env_us": perf_us["env_wait_us"],
            "policy_us": perf_us["inference_us"],
            "record_us": perf_us["obs_processing_us"] + perf_us["action_processing_us"],
        }
        split["other_us"] = total_us - sum(split.values())
        split["total_us"] = total_us
    return {"steps_per_s": steps_per_s, "perf_us": perf_us, "split_us": split}
