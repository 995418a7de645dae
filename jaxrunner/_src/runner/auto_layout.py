"""``EnvRunner.from_env(..., backend="auto")``: the layout chosen with the policy timed.

``make_vec(..., backend="auto")`` chooses from the env alone (:mod:`..backends.auto`):
it cannot know the policy, and a runner cannot change the layout of envs it was handed.
A runner that builds its own envs can do both. :func:`make_runner` asks the env-only
rule first. Where the rule keeps the sub-envs in the main process (too little env work
for a worker's round trip to pay), that is the layout: no trial. Where it would take
workers, the policy decides whether they pay, so both candidates are tried with the
user's policy: a short runner on each, warmed up (compiled), then timed in interleaved
rounds, and the faster builds the final runner.

Why a trial, not a model: the policy's cost moves the answer both ways. A worker takes
the env stepping off the main process, which pipelining then overlaps with the policy;
but a convolution on XLA's CPU backend uses every core, and then the worker's core is
taken from the policy (on 2 cores, one worker did 0.91-0.98x sync with a NatureCNN on
Pong at 8 envs, 1.34-1.39x at 32: ``benchmarks/results/auto_backend_quiet_cpu.json``).
Timing both also weighs what else the machine is running at that moment.

The final runner is built afresh on the chosen layout, so its trajectories are exactly
those of ``EnvRunner(make_vec(env, n, backend=choice.backend,
config=choice.process_config()), ...)`` with the same seed; the trial's samples are
dropped.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import gymnasium

from jaxrunner._src.backends import check_vec_options, choose_auto_layout, make_vec
from jaxrunner._src.backends.auto import LayoutChoice
from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.runner.policy import Params, Policy

if TYPE_CHECKING:
    from jaxrunner._src.runner.env_runner import EnvRunner

TRIAL_ROUNDS = 5
"""Timed samples per candidate, interleaved (after one warm-up sample each); the
median is kept."""
TRIAL_SAMPLE_S = 0.1
"""The env work one timed sample aims at (from the probe's step time), in seconds:
about a second of trial in all where the env is cheap, a few where it is not."""
TRIAL_STEPS = (4, 128)
"""The fewest and most steps per env of a timed sample."""
SYNC_TIE = 1.02
"""The workers must beat sync by this factor to be chosen: on a tie the simpler
layout, with no processes to start, wins."""
TRIAL_OPTIONS = ("num_splits", "connectors", "info_keys", "compact_next_obs")
"""The runner options the trial runners share with the final one (they change the
work of a step). Callbacks and metrics are left out: the trial's samples are nobody's."""


def make_runner(
    env: str | Callable[[], gymnasium.Env],
    num_envs: int,
    policy: Policy,
    params: Params,
    rollout_length: int,
    seed: int,
    *,
    backend: str,
    config: Any,
    restart_policy: RestartPolicy | None,
    env_kwargs: Mapping[str, Any] | None,
    runner_options: dict[str, Any],
) -> EnvRunner:
    """Builds the envs (``make_vec``; with ``backend="auto"`` on the layout a trial
    with the policy chose) and the runner that owns them (see
    :meth:`~jaxrunner.EnvRunner.from_env`)."""
    from jaxrunner._src.runner.env_runner import EnvRunner

    env_kwargs = dict(env_kwargs or {})
    choice = None
    if backend == "auto":
        check_vec_options(backend, config, restart_policy)
        choice = choose_auto_layout(env, env_kwargs, num_envs, seed)
        if choice.backend == "process":
            choice = _trial(
                choice, env, num_envs, policy, params, seed,
                restart_policy, env_kwargs, runner_options,
            )  # fmt: skip
        backend, config = choice.backend, choice.process_config()
    envs = make_vec(
        env, num_envs, backend, config=config, restart_policy=restart_policy, **env_kwargs
    )
    if choice is not None:
        envs.layout_choice = choice
    try:
        return EnvRunner(envs, policy, params, rollout_length, seed, **runner_options)
    except BaseException:
        envs.close()  # the runner never owned them
        raise


def _trial(
    rule: LayoutChoice,
    env: str | Callable[[], gymnasium.Env],
    num_envs: int,
    policy: Policy,
    params: Params,
    seed: int,
    restart_policy: RestartPolicy | None,
    env_kwargs: dict[str, Any],
    runner_options: dict[str, Any],
) -> LayoutChoice:
    """Times sync against the rule's workers with the policy; returns the faster as a
    :class:`LayoutChoice` that records both rates and the policy's time per step."""
    from jaxrunner._src.runner.env_runner import EnvRunner

    work_us = rule.env_step_us * num_envs
    length = int(min(max(TRIAL_SAMPLE_S * 1e6 // work_us, TRIAL_STEPS[0]), TRIAL_STEPS[1]))
    options = {k: v for k, v in runner_options.items() if k in TRIAL_OPTIONS}
    candidates = {"sync": None, "process": rule.process_config()}
    runners: dict[str, EnvRunner] = {}
    try:
        for name, config in candidates.items():
            envs: VectorEnv = make_vec(
                env, num_envs, name, config=config, restart_policy=restart_policy, **env_kwargs
            )
            try:
                runners[name] = EnvRunner(envs, policy, params, length, seed, **options)
            except BaseException:
                envs.close()
                raise
            runners[name].sample()  # warm-up: compiles, first resets, worker start
        times: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(TRIAL_ROUNDS):
            for name, runner in runners.items():
                start = time.perf_counter()
                runner.sample()
                times[name].append(time.perf_counter() - start)
        inference_ms = runners["sync"].get_metrics()["perf"]["inference_ms"]
    finally:
        for runner in runners.values():
            runner.stop()
    rates = {name: length * num_envs / statistics.median(t) for name, t in times.items()}
    return pick_layout(rule, rates, policy_step_us=1e3 * inference_ms)


def pick_layout(
    rule: LayoutChoice, rates: Mapping[str, float], *, policy_step_us: float
) -> LayoutChoice:
    """The rule's workers if their env steps/s in the trial (``rates["process"]``)
    beat sync's by :data:`SYNC_TIE`, else sync; the choice records both rates."""
    workers = rule.num_workers
    plural = "s" if workers > 1 else ""
    tried = (
        f"tried with the policy: sync {rates['sync']:,.0f}, {workers} worker{plural} "
        f"{rates['process']:,.0f} env steps/s"
    )
    common = {"tried": tuple(rates.items()), "policy_step_us": policy_step_us}
    if rates["process"] > SYNC_TIE * rates["sync"]:
        return dataclasses.replace(rule, reason=f"{rule.reason}; {tried}", **common)
    return dataclasses.replace(
        rule, backend="sync", num_workers=0, reason=f"{tried}: sync is as fast", **common
    )


__all__ = ["SYNC_TIE", "make_runner", "pick_layout"]
