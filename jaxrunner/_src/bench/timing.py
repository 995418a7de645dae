"""How the benchmark times things (wall-clock loops, a runner's split of a step, the
rollout length per width), and what a figure depends on: the machine and its load."""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import platform
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxrunner._src.core.metrics import PERF_KEYS
from jaxrunner._src.cpu_dispatch import inline_cpu_dispatch

STEPS_PER_ROLLOUT = 2048
"""About this many env steps per rollout, unless a workload says otherwise."""


def rollout_length(num_envs: int, steps_per_rollout: int = STEPS_PER_ROLLOUT) -> int:
    """T for ``num_envs`` envs, for jaxrunner and the hand loops alike: at least 8."""
    return max(8, steps_per_rollout // num_envs)


def timed(step: Callable[[], int], seconds: float) -> float:
    """Calls ``step`` (returning env steps done, or 1 to count calls) for ``seconds``;
    returns steps/s."""
    steps, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        steps += step()
    return steps / elapsed


def measure_runner(
    runner: Any, sample: Callable[[], int], num_envs: int, seconds: float
) -> dict[str, Any]:
    """Times ``sample`` (one ``runner.sample()``, returning env steps done) for
    ``seconds``: ``steps_per_s``, ``perf_us`` (the runner's perf timers, us per vector
    step) and ``split_us`` (env/policy/record, and ``other``: wall time less those; None
    without perf timers, as for a pure-JAX scan)."""
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


def machine_info() -> dict[str, Any]:
    """Hardware, library versions, this process's JAX CPU dispatch and the load
    averages (1, 5, 15 min)."""
    import flax
    import gymnasium

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": importlib.metadata.version("jaxlib"),
        "flax": flax.__version__,
        "gymnasium": gymnasium.__version__,
        "numpy": np.__version__,
        "jax_devices": [str(d) for d in jax.devices()],
        "jax_cpu_dispatch": "inline" if inline_cpu_dispatch() else "async",
        "loadavg": list(os.getloadavg()),
    }


def autogroup() -> str | None:
    """This session's Linux autogroup and its nice, which decide its CPU share on a
    machine shared with other sessions."""
    try:
        return pathlib.Path("/proc/self/autogroup").read_text().strip()
    except OSError:
        return None
