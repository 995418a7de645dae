"""How the benchmark times things: wall-clock loops and the rollout length per width."""

from __future__ import annotations

import time
from collections.abc import Callable


def rollout_length(num_envs: int) -> int:
    """T for ``num_envs`` envs, for jaxrunner and the hand loops alike: about 2048
    env steps per rollout, at least 8 steps."""
    return max(8, 2048 // num_envs)


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
