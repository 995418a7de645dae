"""``EnvRunner.from_env(..., backend="auto")``: the layout chosen with the user's policy
timed on each candidate. See docs/backends/index.md."""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
import warnings
from collections.abc import Mapping
from typing import Any

from jaxrunner._src.backends import EnvSpec, check_vec_options, choose_auto_layout, make_vec
from jaxrunner._src.backends.auto import LayoutChoice
from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.process.launch import default_num_workers
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.core.policy import Params, Policy

TRIAL_ROUNDS = 5
"""Timed samples per candidate, interleaved (after one warm-up sample each); the
median is kept."""
CLOSE = 1.10
"""Where the fastest process layout and sync are within this factor after :data:`TRIAL_ROUNDS`,
as many rounds again are timed before choosing: a layout's samples spread widely on a
shared machine (two workers at 256 CartPoles on 2 cores: 89k-169k env steps/s from
sample to sample), and only the undecided cases pay for more."""
TRIAL_SAMPLE_S = 0.1
"""The env work one timed sample aims at (from the probe's step time), in seconds:
about a second of trial in all where the env is cheap, a few where it is not."""
TRIAL_STEPS = (4, 128)
"""The fewest and most steps per env of a timed sample."""
SYNC_TIE = 1.05
"""Workers must beat sync by this factor to be chosen: on a near tie the simpler
layout, with no processes to start, wins (and among workers, the fewer). A trial is a
few short samples, and on 2 cores the ratio of the same two layouts moved by 5-15%
between trials (``benchmarks/results/auto_backend_policy_*quiet_cpu.json``); only a
clear win is worth the workers."""
TRIAL_OPTIONS = ("num_splits", "connectors", "info_keys", "compact_next_obs")
"""The runner options the trial runners share with the final one (they change the
work of a step). Callbacks and metrics are left out: the trial's samples are nobody's."""


def make_runner(
    runner_cls: type,
    env: EnvSpec,
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
) -> Any:
    """Builds the envs (``make_vec``; with ``backend="auto"`` on the layout a trial
    with the policy chose) and the runner that owns them (see
    :meth:`~jaxrunner.EnvRunner.from_env`)."""
    env_kwargs = dict(env_kwargs or {})
    choice = None
    if backend == "auto":
        check_vec_options(backend, config, restart_policy)
        caller = 'EnvRunner.from_env(backend="auto", its default)'
        choice, multi_agent = choose_auto_layout(
            env, env_kwargs, num_envs, seed, restart_policy, caller
        )
        if choice.backend == "process" and not multi_agent:  # (runner_cls refuses those)
            choice = _trial(
                runner_cls, choice, env, num_envs, policy, params, seed,
                restart_policy, env_kwargs, runner_options,
            )  # fmt: skip
        backend, config = choice.backend, choice.process_config()
    envs = make_vec(
        env, num_envs, backend, config=config, restart_policy=restart_policy, **env_kwargs
    )
    if choice is not None:
        envs.layout_choice = choice
    try:
        return runner_cls(envs, policy, params, rollout_length, seed, **runner_options)
    except BaseException:
        envs.close()  # the runner never owned them
        raise


def _trial(
    runner_cls: type,
    rule: LayoutChoice,
    env: EnvSpec,
    num_envs: int,
    policy: Policy,
    params: Params,
    seed: int,
    restart_policy: RestartPolicy | None,
    env_kwargs: dict[str, Any],
    runner_options: dict[str, Any],
) -> LayoutChoice:
    """Times sync against the process layouts of :func:`trial_workers` with the
    policy (more rounds where they are close: :data:`CLOSE`); returns the fastest
    (:func:`pick_layout`). A process layout that fails (its workers die, say) is
    dropped, with a warning; a failure of sync is the env's, and raises."""
    work_us = rule.env_step_us * num_envs
    length = int(min(max(TRIAL_SAMPLE_S * 1e6 // work_us, TRIAL_STEPS[0]), TRIAL_STEPS[1]))
    options = {k: v for k, v in runner_options.items() if k in TRIAL_OPTIONS}
    runners: dict[int, Any] = {}
    failed: dict[int, Exception] = {}

    def timed_sample(workers: int) -> float:
        """One sample of ``workers``' runner; a failure drops a process layout."""
        start = time.perf_counter()
        try:
            runners[workers].sample()
        except Exception as err:
            if not workers:
                err.add_note(
                    'jaxrunner: EnvRunner.from_env(backend="auto") was timing the sync '
                    "layout (the one every failure falls back to) when this was raised."
                )
                raise
            failed[workers] = err
            with contextlib.suppress(Exception):  # its workers may be dead already
                runners.pop(workers).stop()
        return time.perf_counter() - start

    times: dict[int, list[float]] = {}
    try:
        for workers in trial_workers(rule):
            layout = dataclasses.replace(
                rule, backend="process" if workers else "sync", num_workers=workers
            )
            try:
                envs: VectorEnv = make_vec(
                    env, num_envs, layout.backend, config=layout.process_config(),
                    restart_policy=restart_policy, **env_kwargs,
                )  # fmt: skip
            except Exception as err:
                if not workers:
                    raise
                failed[workers] = err
                continue
            try:
                runners[workers] = runner_cls(envs, policy, params, length, seed, **options)
            except BaseException as err:
                envs.close()
                if not workers or not isinstance(err, Exception):
                    raise
                failed[workers] = err
                continue
            timed_sample(workers)  # warm-up: compiles, first resets, worker start
        times = {workers: [] for workers in runners}
        for round_index in range(2 * TRIAL_ROUNDS):
            only_sync = round_index > 0 and len(runners) == 1
            if only_sync or (round_index == TRIAL_ROUNDS and not undecided(times)):
                break
            for workers in list(runners):
                took = timed_sample(workers)
                if workers in runners:
                    times[workers].append(took)
                else:
                    del times[workers]
        inference_ms = runners[0].get_metrics()["perf"]["inference_ms"]
    finally:
        for runner in runners.values():
            runner.stop()
    rates = {workers: length * num_envs / statistics.median(t) for workers, t in times.items()}
    choice = pick_layout(rule, rates, policy_step_us=1e3 * inference_ms)
    if failed:
        dropped = "; ".join(f"{_label(w)} failed ({err!r})" for w, err in sorted(failed.items()))
        warnings.warn(
            f'EnvRunner.from_env(backend="auto"): in the trial of layouts, {dropped}; '
            f"dropped, and {_label(choice.num_workers)} kept.",
            RuntimeWarning,
            stacklevel=4,
        )
        choice = dataclasses.replace(choice, reason=f"{choice.reason}; {dropped}")
    return choice


def undecided(times: Mapping[int, list[float]]) -> bool:
    """Whether sync's median sample time and the fastest process layout's are within
    :data:`CLOSE` of each other, either way."""
    sync = statistics.median(times[0])
    workers = min(statistics.median(t) for w, t in times.items() if w)
    return max(sync, workers) <= CLOSE * min(sync, workers)


def trial_workers(rule: LayoutChoice) -> list[int]:
    """The layouts a trial times, as worker counts (0: sync): sync, the rule's workers,
    and the process backend's default count where it differs (it takes every CPU from
    256 sub-envs, and one per CPU but one below)."""
    return sorted({0, rule.num_workers, default_num_workers(rule.num_envs, cpus=rule.cpus)})


def pick_layout(
    rule: LayoutChoice, rates: Mapping[int, float], *, policy_step_us: float
) -> LayoutChoice:
    """The layout with the most env steps/s in the trial (``rates``, by worker count;
    0 is sync), where it beats sync's by :data:`SYNC_TIE`, else sync; the choice
    records every rate and why."""
    best = max(rates, key=lambda workers: (rates[workers], -workers))
    if rates[best] <= SYNC_TIE * rates[0]:
        best = 0
    tried = ", ".join(f"{_label(w)} {rate:,.0f}" for w, rate in sorted(rates.items()))
    return dataclasses.replace(
        rule,
        backend="process" if best else "sync",
        num_workers=best,
        reason=f"{rule.reason}; tried with the policy (env steps/s): {tried}; kept {_label(best)}",
        tried=tuple(sorted(rates.items())),
        policy_step_us=policy_step_us,
    )


def _label(workers: int) -> str:
    return "sync" if workers == 0 else f"{workers} worker{'s' if workers > 1 else ''}"
