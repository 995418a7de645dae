"""``EnvRunner.from_env(..., backend="auto")``: the layout chosen with the user's policy
timed on each candidate. See docs/backends/index.md."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium
import numpy as np

from jaxrunner._src.arg_checks import check_dict, check_int
from jaxrunner._src.backends.auto import LayoutChoice, envpool_only, envpool_task
from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.factories import EnvSpec
from jaxrunner._src.backends.make_vec import check_vec_options, choose_auto_layout, make_vec
from jaxrunner._src.backends.process import ProcessConfig
from jaxrunner._src.backends.ray import RayConfig
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.core.agent_groups import PolicyMappingFn
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.runner.env_runner_checks import takes_loop_options
from jaxrunner._src.runner.trial_layouts import (
    DROP_AFTER,
    ENVPOOL,
    ENVPOOL_KEYS,
    SHARE,
    TRIAL_ROUNDS,
    envpool_options,
    envpool_variants,
    in_the_running,
    kept_key,
    label,
    layout_of,
    pick_layout,
    share_layout,
    trial_rates,
    trial_workers,
    undecided,
    worth_timing,
)
from jaxrunner._src.samplers.callbacks import Callbacks
from jaxrunner.errors import InvalidArgumentError

TRIAL_SAMPLE_S = 0.1
"""The env work one timing aims at (from the probe's step time), in seconds."""
TRIAL_STEPS = (4, 128)
"""The fewest and most steps per env of a timing: whole samples of the user's
``rollout_length`` (at least one; at most the largest), since a sample's own costs,
and how far async mode's envs run ahead, depend on it."""
PAIRED = ("envpool_async",)
"""Keys timed on the second of two samples in a row: a ready-first sample's envs run
into the next one, so a sample right after other layouts' starts ahead."""
TRIAL_OPTIONS = ("num_splits", "connectors", "info_keys", "compact_next_obs")
"""The runner options that change the work of a step, which the trial runners share."""


def from_env(
    runner_cls: type,
    env: EnvSpec,
    num_envs: int,
    policy: Policy | Mapping[str, Policy],
    params: Params,
    rollout_length: int,
    seed: int,
    callbacks: Callbacks | None = None,
    *,
    backend: str = "auto",
    config: ProcessConfig | RayConfig | None = None,
    restart_policy: RestartPolicy | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    policy_mapping_fn: PolicyMappingFn | None = None,
    **options: Any,
) -> Any:
    """A runner on envs it builds and owns (``make_vec(env, num_envs, backend,
    config=..., restart_policy=..., policy_mapping_fn=..., **env_kwargs)``;
    :meth:`stop` closes them).

    With ``backend="auto"`` (the default) the layout is chosen with the policy
    timed (docs/backends/index.md): where ``make_vec``'s env-only rule would start
    workers (or the env work per step is near its line: :func:`worth_timing`), or
    EnvPool has the env id, a short trial runs this policy on each
    candidate and keeps the fastest (``get_metrics()["auto"]`` and
    ``runner.envs.layout_choice`` report the rates and why). The trajectories are
    exactly those of the chosen layout built by hand, with the same seed. A PettingZoo
    env factory takes ``policy`` and ``params`` as a multi-agent env does, its agents
    in the groups of ``policy_mapping_fn``.

    ``options`` are :class:`EnvRunner`'s keyword options (``metrics``,
    ``num_splits``, ``connectors``, ``info_keys``, ``compact_next_obs``).
    """
    runner_options = {"callbacks": callbacks, **options}
    # Checked before a trial: it would build envs and runners first.
    check_int("EnvRunner.from_env", "num_envs", num_envs)
    check_int("EnvRunner.from_env", "rollout_length", rollout_length)
    known = _keywords(runner_cls)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InvalidArgumentError(
            f"EnvRunner.from_env({unknown[0]}=...): not an option of {runner_cls.__name__}; "
            f"its options are {[k for k, p in known.items() if p.kind == p.KEYWORD_ONLY]}."
        )
    env_kwargs = dict(check_dict("EnvRunner.from_env", "env_kwargs", env_kwargs) or {})
    own = inspect.signature(make_vec).parameters
    taken = [k for k in env_kwargs if k in own and own[k].kind != inspect.Parameter.VAR_KEYWORD]
    if taken:  # make_vec would take them as its own (or refuse them twice)
        raise InvalidArgumentError(
            f"EnvRunner.from_env(env_kwargs={{{taken[0]!r}: ...}}): {taken} name make_vec's "
            "own arguments, so they would never reach the env. Pass an env factory instead, "
            f"e.g. env=lambda: gymnasium.make(env_id, {taken[0]}=...)."
        )

    def build(backend: str, config: Any, **pool: Any) -> Any:
        spec: Any = env  # an id or a factory: make_vec's overloads type them apart
        return make_vec(
            spec, num_envs, backend, config=config, restart_policy=restart_policy,
            policy_mapping_fn=policy_mapping_fn, **env_kwargs, **pool,
        )  # fmt: skip

    choice = None
    if backend == "auto":
        check_vec_options(backend, config, restart_policy)
        choice = envpool_only(env, num_envs, restart_policy)  # nothing to time it against
        if choice is None:
            caller = 'EnvRunner.from_env(backend="auto", its default)'
            choice, multi_agent = choose_auto_layout(
                env, env_kwargs, num_envs, seed, restart_policy, caller
            )
            envpool = not multi_agent and envpool_has(env, env_kwargs, restart_policy)
            choice = worth_timing(choice)
            if choice.backend == "process" or envpool:  # either kind of env: sync or workers
                choice = _trial(
                    runner_cls, choice, build, env, num_envs, policy, params,
                    rollout_length, seed, runner_options, envpool, multi_agent,
                )  # fmt: skip
        backend, config = choice.backend, choice.process_config()
    envs = build(backend, config, **dict(choice.envpool_options if choice else ()))
    if choice is not None:
        envs.layout_choice = choice
    try:
        return runner_cls(envs, policy, params, rollout_length, seed, **runner_options)
    except BaseException:
        envs.close()  # the runner never owned them
        raise


def _keywords(runner_cls: type) -> dict[str, inspect.Parameter]:
    """The parameters of ``runner_cls``'s constructor: the first in its MRO with no
    ``**kwargs`` (a deprecated alias passes them on)."""
    for cls in runner_cls.__mro__:
        params = inspect.signature(cls).parameters
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            return dict(params)
    return {}


def _trial(
    runner_cls: type,
    rule: LayoutChoice,
    build: Callable[[str, Any], Any],
    env: EnvSpec,
    num_envs: int,
    policy: Policy | Mapping[str, Policy],
    params: Params,
    rollout_length: int,
    seed: int,
    runner_options: dict[str, Any],
    envpool: bool = False,
    multi_agent: bool = False,
) -> LayoutChoice:
    """Times sync against the process layouts of :func:`trial_workers` and
    :func:`share_layout` (where the rule chose workers, or :func:`worth_timing` one)
    and, with ``envpool``, the
    ``"envpool"`` backend, with the policy;
    returns the fastest (:func:`pick_layout`). A layout other than sync that fails is
    dropped, with a warning; a failure of sync is the env's, and raises."""
    work_us = rule.env_step_us * num_envs
    steps = int(np.clip(np.nan_to_num(TRIAL_SAMPLE_S * 1e6 // work_us), *TRIAL_STEPS))  # NaN: 4
    length = min(rollout_length, TRIAL_STEPS[1])  # (longer: their costs are spread thin)
    samples = max(1, round(steps / length))  # per timing
    options = {k: v for k, v in runner_options.items() if k in TRIAL_OPTIONS}
    runners: dict[int | str, Any] = {}
    failed: dict[int | str, Exception] = {}
    keys: list[int | str] = [0]
    if rule.backend == "process":
        keys = [*trial_workers(rule, multi_agent), *([SHARE] if share_layout(rule) else [])]
    if envpool:
        ready_first = takes_loop_options(runner_options.get("callbacks"), options.get("num_splits"))
        pools = options.get("num_splits") in (None, 1, 2)  # a pool per split, or one split
        keys += [ENVPOOL, *envpool_variants(num_envs, rule.cpus, ready_first, pools)]

    def timed_sample(key: int | str) -> float:
        """Seconds per valid transition of ``samples`` samples of ``key``'s runner."""
        start = time.perf_counter()
        try:
            if key in PAIRED:  # its envs then start where they would in a run of samples
                runners[key].sample()
                start = time.perf_counter()
            valid = 0
            for _ in range(samples):
                valid += int(np.count_nonzero(runners[key].sample().valid))
            return (time.perf_counter() - start) / max(1, valid)
        except Exception as err:
            if key == 0:
                err.add_note(
                    'jaxrunner: EnvRunner.from_env(backend="auto") was timing the sync '
                    "layout (the one every failure falls back to) when this was raised."
                )
                raise
            failed[key] = err
            with contextlib.suppress(Exception):  # its workers may be dead already
                runners.pop(key).stop()
        return time.perf_counter() - start

    times: dict[int | str, list[float]] = {}
    try:
        for key in keys:
            envs: Any = None
            try:
                if key in ENVPOOL_KEYS:
                    pool = envpool_options(str(key), num_envs, rule.cpus)
                    envs = make_vec(env, num_envs, ENVPOOL, **pool)
                    if not _same_spaces(envs, runners[0].envs):  # the policy's: sync's
                        envs.close()
                        continue
                else:
                    layout = layout_of(rule, key)
                    envs = build(layout.backend, layout.process_config())
                runners[key] = runner_cls(envs, policy, params, length, seed, **options)
            except BaseException as err:
                if envs is not None:  # the runner never owned them
                    envs.close()
                if key == 0 or not isinstance(err, Exception):
                    raise
                failed[key] = err
                continue
            timed_sample(key)  # warm-up: compiles, first resets, worker start
        times = {key: [] for key in runners}
        timed = list(runners)
        for round_index in range(2 * TRIAL_ROUNDS):
            if round_index >= DROP_AFTER:
                timed = [key for key in in_the_running(times) if key in timed]
                for key in set(runners).difference(timed, [0]):  # (sync's is read below)
                    with contextlib.suppress(Exception):  # out of the running either way
                        runners.pop(key).stop()
            alone = round_index > 0 and len(timed) == 1
            if alone or (round_index == TRIAL_ROUNDS and not undecided(times)):
                break
            for key in list(timed):
                took = timed_sample(key)
                if key in runners:
                    times[key].append(took)
                else:  # it failed: out of the trial
                    del times[key]
                    timed.remove(key)
        inference_ms = runners[0].get_metrics()["perf"]["inference_ms"]
    finally:
        for runner in runners.values():
            runner.stop()
    rates = trial_rates(times)
    choice = pick_layout(rule, rates, policy_step_us=1e3 * inference_ms)
    if failed:
        dropped = "; ".join(
            f"{label(key)} failed ({err!r})" for key, err in sorted(failed.items(), key=str)
        )
        warnings.warn(
            f'EnvRunner.from_env(backend="auto"): in the trial of layouts, {dropped}; '
            f"dropped, and {label(kept_key(choice))} kept.",
            RuntimeWarning,
            stacklevel=4,
        )
        choice = dataclasses.replace(choice, reason=f"{choice.reason}; {dropped}")
    return choice


def envpool_has(env: Any, env_kwargs: Mapping[str, Any], restart_policy: Any) -> bool:
    """Whether the ``"envpool"`` backend is a candidate: EnvPool has the task ``env``
    (an id), and there are no env kwargs and no restart policy."""
    return not env_kwargs and restart_policy is None and envpool_task(env)


def _same_spaces(envs: VectorEnv, sync: VectorEnv) -> bool:
    """Whether ``envs`` take and give what the sync envs do (space types and shapes; the
    observations' dtype, and an action dtype the policy's actions cast to safely:
    EnvPool's MuJoCo tasks take float64 where gymnasium's take float32, and its Atari
    tasks preprocess their frames)."""
    obs, sync_obs = envs.single_observation_space, sync.single_observation_space
    act, sync_act = envs.single_action_space, sync.single_action_space
    casts = (
        act.dtype is not None and sync_act.dtype is not None
        and np.can_cast(sync_act.dtype, act.dtype, "safe")
    )  # fmt: skip
    return (
        _alike(obs, sync_obs) and obs.dtype == sync_obs.dtype
        and _alike(act, sync_act) and (act.dtype == sync_act.dtype or casts)
    )  # fmt: skip


def _alike(a: gymnasium.Space, b: gymnasium.Space) -> bool:
    """The same space type and shape (and ``Discrete`` range)."""
    if type(a) is not type(b) or a.shape != b.shape:
        return False
    if isinstance(a, gymnasium.spaces.Discrete) and isinstance(b, gymnasium.spaces.Discrete):
        return (a.n, a.start) == (b.n, b.start)
    return True
