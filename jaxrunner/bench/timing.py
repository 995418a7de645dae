"""How the benchmark times things: wall-clock loops and the rollout length per width."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping


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


def interleaved_rates(
    steps: Mapping[str, Callable[[], int]], rounds: int, seconds: float
) -> dict[str, list[float]]:
    """Steps/s of each system (``step`` returning env steps done) in ``rounds`` rounds
    of ``seconds`` each: every round runs every system once, in an order reversed
    every other round, so a shared machine's drift hits each alike."""
    rates: dict[str, list[float]] = {name: [] for name in steps}
    for round_index in range(rounds):
        order = list(steps) if round_index % 2 == 0 else list(steps)[::-1]
        for name in order:
            rates[name].append(timed(steps[name], seconds))
    return rates


def us_per_call(call: Callable[[], object], seconds: float) -> float:
    """Calls ``call`` for ``seconds``; returns microseconds per call."""
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        call()
        calls += 1
    return 1e6 * elapsed / calls
