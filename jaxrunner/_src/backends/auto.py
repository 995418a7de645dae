"""``backend="auto"``: the layout (sync, or process with its workers) chosen by timing
one sub-env on the user's machine. See docs/backends/index.md."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import gymnasium

from jaxrunner._src.backends.layout_choice import LayoutChoice
from jaxrunner._src.backends.process.launch import ALL_CPUS_FROM_ENVS, available_cpus

MIN_WORK_US = 300.0
"""The env work per vector step (one sub-env's step time x the sub-envs) from which a
worker pays for itself; each worker gets at least this much. Calibrated on 2 cores,
quiet (load 1.1-1.5), one worker against sync, 3 interleaved rounds
(``benchmarks/results/auto_backend_quiet_first_rule_cpu.json``): 0.82x and 0.71x at 6
and 49 us (CartPole at 1 and 8 envs); 1.09x at 350 us (HalfCheetah at 8); 1.18x at
390 us (CartPole at 64); 1.28x and 1.34x at 1.6 and 12.8 ms (CartPole at 256, Pong at
32); level at 1.4 and 3.2 ms (HalfCheetah at 32: 1.01x; Pong at 8: 0.98x). Checked
with this rule in a second quiet run (``auto_backend_quiet_cpu.json``): auto did
0.91-1.03x the faster of sync and one worker at every width. The worker steps the
envs on the second core while the main process computes the policy and keeps the
books. Beyond 2 cores the same floor per worker sets their number; that is not
measured (no such machine was at hand)."""


def choose_layout(env_step_us: float, num_envs: int, cpus: int) -> LayoutChoice:
    """The layout for ``num_envs`` sub-envs whose step costs ``env_step_us`` on
    ``cpus`` CPUs: a pure function of the measurements.

    ``work = env_step_us * num_envs`` is the env work per vector step. Below
    :data:`MIN_WORK_US` the sub-envs stay in the main process (sync): a worker's round
    trip costs more than it takes off. From there, ``"process"`` with one worker per
    :data:`MIN_WORK_US` of work, at most one per sub-env and one per CPU but one (the
    main process keeps one for the policy), or one per CPU from
    ``ALL_CPUS_FROM_ENVS`` (256) sub-envs, where the process backend's own default
    takes them all too (on 2 cores, CartPole at 256 envs: 2 workers did 1.22-1.25x
    one worker, ``benchmarks/results/auto_backend_policy_two_candidates_quiet_cpu.json``).

    The main process's share (``ProcessConfig.main_process_envs``) is never chosen:
    its stepping adds to the policy on the main process's path, so whether it pays
    depends on the policy (one worker with half the envs in the main process did 0.76x
    the best layout with NatureCNN on Pong at 8 envs and 0.86x on CartPole at 256, on
    2 cores, load average 1.5-2.7: a first run of ``benchmarks/auto_backend.py``,
    commit 9758e9c, whose JSON was not kept), and it costs those sub-envs their
    isolation.
    """
    work_us = env_step_us * num_envs
    choice = functools.partial(LayoutChoice, env_step_us=env_step_us, num_envs=num_envs, cpus=cpus)
    if cpus < 2:
        return choice(
            backend="sync",
            num_workers=0,
            reason=f"{cpus} CPU: none left for a worker beside the main process",
        )
    if work_us < MIN_WORK_US:
        return choice(
            backend="sync",
            num_workers=0,
            reason=(
                f"{work_us:,.0f} us of env work per step: under the {MIN_WORK_US:,.0f} us "
                "from which a worker pays for its round trip"
            ),
        )
    spare = cpus if num_envs >= ALL_CPUS_FROM_ENVS else cpus - 1
    workers = min(spare, num_envs, max(1, int(work_us // MIN_WORK_US)))
    plural = "s" if workers > 1 else ""
    return choice(
        backend="process",
        num_workers=workers,
        reason=(
            f"{work_us:,.0f} us of env work per step: {workers} worker{plural} "
            f"(one per {MIN_WORK_US:,.0f} us of work, at most {spare} of {cpus} CPUs)"
        ),
    )


PROBE_BUDGET_S = 0.3
PROBE_MAX_STEPS = 200


def measure_env_step_us(
    make_env: Callable[[], gymnasium.Env],
    seed: int | None,
    *,
    budget_s: float = PROBE_BUDGET_S,
    max_steps: int = PROBE_MAX_STEPS,
) -> float:
    """The median time of one step of a probe sub-env, in microseconds.

    The probe is built in the main process from the vector env's own factory, reset
    with ``seed`` (0 where None) and stepped with seeded random actions for at most
    ``max_steps`` steps or ``budget_s`` seconds, reset where an episode ends (as the
    vector env does in the same step); then closed. The median keeps a loaded
    machine's outliers and the rarer resets out. The first step is not counted
    (lazy initialisation).
    """
    env = make_env()
    try:
        seed = 0 if seed is None else int(seed)
        env.reset(seed=seed)
        env.action_space.seed(seed)
        times: list[float] = []
        deadline = time.perf_counter() + budget_s
        for _ in range(max_steps + 1):
            action: Any = env.action_space.sample()
            start = time.perf_counter()
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                env.reset()
            end = time.perf_counter()
            times.append(end - start)
            if end > deadline:
                break
        return 1e6 * statistics.median(times[1:] or times)
    finally:
        env.close()


def choose_for(
    make_env: Callable[[], gymnasium.Env], num_envs: int, seed: int | None
) -> LayoutChoice:
    """Measures ``make_env``'s step here and chooses (:func:`choose_layout`)."""
    return choose_layout(measure_env_step_us(make_env, seed), num_envs, available_cpus())
