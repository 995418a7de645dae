"""``backend="auto"``: the layout (sync, or process with its workers) chosen by timing
one sub-env on the user's machine. See docs/backends/index.md."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import math
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import gymnasium
import numpy as np
from gymnasium.spaces import Discrete

from jaxrunner._src.backends.env_api import check_env, is_multi_agent_env
from jaxrunner._src.backends.process.config import ProcessConfig
from jaxrunner._src.backends.process.launch import ALL_CPUS_FROM_ENVS, available_cpus
from jaxrunner._src.backends.restarts import RestartPolicy, close_quietly, recreation_failed, retry

T = TypeVar("T")

MIN_WORK_US = 300.0
"""The env work per vector step (one sub-env's step time x the sub-envs) from which a
worker pays for itself; each worker gets at least this much. Calibrated on 2 cores:
docs/backends/index.md, "How the rule was calibrated"."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayoutChoice:
    """What ``backend="auto"`` chose, from what it measured."""

    backend: str
    """``"sync"``, ``"process"`` or ``"envpool"`` (chosen by ``EnvRunner.from_env``'s
    trial, or for a task id only EnvPool has)."""
    num_workers: int
    """Worker processes (0 for sync)."""
    env_step_us: float
    """The measured median cost of one sub-env's step, in microseconds (NaN where
    nothing was measured)."""
    num_envs: int
    cpus: int
    """CPUs this process may use (affinity, bounded by the cgroup quota)."""
    reason: str
    """Why, in one line."""
    tried: tuple[tuple[int, float], ...] = ()
    """Env steps/s of each layout tried with the policy (``EnvRunner.from_env``), as
    ``(num_workers, rate)`` pairs, 0 workers being sync; empty where the choice came
    from the env alone."""
    tried_envpool: float | None = None
    """Env steps/s of the ``"envpool"`` backend in that trial; None where it was not
    tried (EnvPool not installed, the id not EnvPool's, or its spaces not the env's)."""
    policy_step_us: float | None = None
    """The policy's time per vector step in that trial (sync), in microseconds."""
    envpool_options: tuple[tuple[str, int], ...] = ()
    """The ``make_vec`` options of the ``"envpool"`` backend that the trial chose beyond
    its defaults: ``(("num_threads", 1),)`` (one thread), or ``batch_size`` and
    ``num_threads`` (async mode); empty: its defaults."""
    tried_envpool_variants: tuple[tuple[str, float], ...] = ()
    """Env steps/s of the other ``"envpool"`` variants in that trial, as ``(name, rate)``
    (``"one_thread"``, ``"async"``); empty where none was tried."""
    main_process_envs: int = 0
    """Sub-envs the main process steps beside the workers (``ProcessConfig``'s own
    option), where the trial chose that layout; 0: every sub-env in a worker."""
    tried_share: float | None = None
    """Env steps/s of the workers with the main process's share in that trial; None
    where it was not tried."""

    def process_config(self) -> ProcessConfig | None:
        """The ``ProcessConfig`` that builds this layout (None for sync): its workers,
        the main process's share, spin at its adaptive default."""
        if self.backend != "process":
            return None
        return ProcessConfig(num_workers=self.num_workers, main_process_envs=self.main_process_envs)

    def metrics(self) -> dict[str, int | float]:
        """The choice as numbers, for ``get_metrics()`` and metric loggers (which take
        no strings): ``process`` is 1 where the workers were chosen, else 0 (where the
        share was tried, ``main_process_envs`` its sub-envs if chosen, else 0; where
        EnvPool was tried, ``envpool`` 1 where it was chosen)."""
        metrics: dict[str, int | float] = {
            "process": int(self.backend == "process"),
            "num_workers": self.num_workers,
            "env_step_us": self.env_step_us,
            "cpus": self.cpus,
        }
        if self.policy_step_us is not None:
            metrics["policy_step_us"] = self.policy_step_us
        for workers, rate in self.tried:
            metrics[f"tried_{workers}_workers_steps_per_s"] = rate
        if self.tried_share is not None:
            metrics["main_process_envs"] = self.main_process_envs
            metrics["tried_share_steps_per_s"] = self.tried_share
        if self.tried_envpool is not None:
            metrics["envpool"] = int(self.backend == "envpool")
            metrics["tried_envpool_steps_per_s"] = self.tried_envpool
        if self.tried_envpool_variants:
            options = dict(self.envpool_options)
            metrics["envpool_threads"] = options.get("num_threads", 0)  # 0: EnvPool's own
            metrics["envpool_batch_size"] = options.get("batch_size", 0)  # 0: sync mode
            metrics["envpool_pools"] = options.get("num_pools", 1)
            for name, rate in self.tried_envpool_variants:
                metrics[f"tried_envpool_{name}_steps_per_s"] = rate
        return metrics


def choose_layout(env_step_us: float, num_envs: int, cpus: int) -> LayoutChoice:
    """The layout for ``num_envs`` sub-envs of step cost ``env_step_us`` on ``cpus``
    CPUs: one worker per :data:`MIN_WORK_US` of work per vector step, never the main
    process's share (whether it pays depends on the policy, which only
    ``EnvRunner.from_env``'s trial times: docs/backends/index.md)."""
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
PROBE_DEADLINE_S = 10.0
"""How long the probe may take in all (its reset, its steps and, after a failure, the
recreation a restart policy would try) before it is abandoned and the choice falls back
to sync, with a warning: a hung env must not hang ``make_vec``."""


def measure_env_step_us(
    env: Any,
    seed: int | None,
    *,
    max_steps: int = PROBE_MAX_STEPS,
    where: list[str] | None = None,
) -> float:
    """The median time in microseconds of one seeded random step of the probe sub-env
    ``env`` (closed on return), the first step (lazy initialisation) not counted.
    ``where[0]`` names the call under way, for errors."""
    where = [""] if where is None else where
    try:
        where[0] = "reset"
        act, step = _probe_calls(env, 0 if seed is None else int(seed))
        times: list[float] = []
        deadline = time.perf_counter() + PROBE_BUDGET_S
        for i in range(max_steps + 1):
            action = act()
            where[0] = f"step {i + 1}"
            start = time.perf_counter()
            step(action)
            end = time.perf_counter()
            times.append(end - start)
            if end > deadline:
                break
        return 1e6 * statistics.median(times[1:] or times)
    finally:
        close_quietly(env)


def _probe_calls(env: Any, seed: int) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    """Resets ``env``; returns ``(act, step)``: a random action for the env's next step
    (drawn outside the timing), and the step itself, with the reset where it ends."""
    if not is_multi_agent_env(env):
        env.reset(seed=seed)
        env.action_space.seed(seed)

        def step(action: Any) -> None:
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                env.reset()

        return env.action_space.sample, step
    from pettingzoo.utils.env import AECEnv

    for k, agent in enumerate(env.possible_agents):
        env.action_space(agent).seed(seed + k)
    if isinstance(env, AECEnv):  # one agent's turn per step, as the vector env steps it
        env.reset(seed=seed)

        def act() -> Any:
            agent = env.agent_selection
            if env.terminations[agent] or env.truncations[agent]:
                return None
            return _sample(env.action_space(agent), env.observe(agent))

        def turn(action: Any) -> None:
            env.step(action)
            if not env.agents:
                env.reset()

        return act, turn
    obs = [env.reset(seed=seed)[0]]

    def acts() -> dict[str, Any]:
        return {a: _sample(env.action_space(a), obs[0].get(a)) for a in env.agents}

    def parallel_step(actions: dict[str, Any]) -> None:
        obs[0] = env.step(actions)[0]
        if not env.agents:
            obs[0] = env.reset()[0]

    return acts, parallel_step


def _sample(space: gymnasium.Space, obs: Any) -> Any:
    """A random action, within the observation's ``action_mask`` where it has one."""
    if isinstance(obs, dict) and "action_mask" in obs and isinstance(space, Discrete):
        return space.sample(mask=np.asarray(obs["action_mask"], np.int8))
    return space.sample()


def choose_for(
    probe: Any,
    factory: Callable[[], Any],
    num_envs: int,
    seed: int | None,
    restart_policy: RestartPolicy | None,
) -> LayoutChoice:
    """Times ``probe`` (sub-env 0; closed here) on a thread of its own and chooses
    (:func:`choose_layout`). A probe past :data:`PROBE_DEADLINE_S`, or one that raises
    but that ``restart_policy`` recreates, gives ``"sync"`` with a warning."""
    cpus = available_cpus()
    where = [""]

    def run() -> float | tuple[BaseException, str]:
        try:
            return measure_env_step_us(probe, seed, where=where)
        except Exception as err:
            if restart_policy is None:
                raise
            failed_at = where[0]
            where[0] = f"recreation after its {failed_at} raised {err!r}"
            _recreate(factory, seed, restart_policy, err)
            return err, failed_at

    try:
        result = on_own_thread(run, PROBE_DEADLINE_S)
    except Overran:
        return _fall_back(
            f"the probe sub-env's {where[0]} did not return within {PROBE_DEADLINE_S:g} s "
            "(abandoned; it is closed if that call returns)",
            num_envs,
            cpus,
        )
    except Exception as err:
        err.add_note(
            f'jaxrunner: backend="auto" was probing the env (sub-env 0 reset with the seed '
            f"and stepped with random actions, to time it) when its {where[0]} raised this. "
            "The sync backend, with this restart_policy, would raise it too: fix the env, "
            "or pass restart_policy=jaxrunner.RestartPolicy() to recreate failed sub-envs."
        )
        raise
    if isinstance(result, tuple):
        err, failed_at = result
        return _fall_back(
            f"the probe sub-env's {failed_at} raised {err!r}, which the restart_policy "
            "recovers from (a new env was made and reset)",
            num_envs,
            cpus,
        )
    return choose_layout(result, num_envs, cpus)


def _recreate(
    factory: Callable[[], Any], seed: int | None, policy: RestartPolicy, cause: BaseException
) -> None:
    """Makes and resets a new probe as ``policy`` would after ``cause``, then closes it;
    raises the policy's error where every attempt fails."""

    def attempt() -> None:
        env = check_env(factory(), 0)
        try:
            env.reset(seed=seed)
        finally:
            close_quietly(env)

    retry(attempt, policy, cause, lambda last: recreation_failed(0, cause, policy, last))


def _fall_back(cause: str, num_envs: int, cpus: int) -> LayoutChoice:
    warnings.warn(
        f'backend="auto": {cause}; the layout falls back to "sync", unmeasured. Pass '
        'backend="sync" or "process" to choose it yourself.',
        RuntimeWarning,
        stacklevel=4,
    )
    return LayoutChoice(
        backend="sync",
        num_workers=0,
        env_step_us=math.nan,
        num_envs=num_envs,
        cpus=cpus,
        reason=f"no measurement: {cause}",
    )


def envpool_task(env: Any) -> bool:
    """Whether ``env`` is a task id of EnvPool, where it is installed."""
    if not isinstance(env, str) or importlib.util.find_spec("envpool") is None:
        return False
    return env in importlib.import_module("envpool").list_all_envs()  # the optional extra


def envpool_only(
    env: Any, num_envs: int, restart_policy: RestartPolicy | None
) -> LayoutChoice | None:
    """The ``"envpool"`` backend for a task id EnvPool has and gymnasium does not (say
    ``"Pong-v5"``): the one backend that builds it, so nothing is timed. None for any
    other env, or with a restart policy (which EnvPool's pool cannot follow)."""
    if not isinstance(env, str) or restart_policy is not None or env in gymnasium.registry:
        return None  # (the registry first: importing EnvPool costs more)
    if not envpool_task(env):
        return None
    return LayoutChoice(
        backend="envpool",
        num_workers=0,
        env_step_us=math.nan,
        num_envs=num_envs,
        cpus=available_cpus(),
        reason=f"{env!r} is an EnvPool task id that gymnasium does not know",
    )


class Overran(Exception):
    """The probe is still running at its deadline."""


def on_own_thread(fn: Callable[[], T], timeout_s: float) -> T:
    """``fn()`` on a daemon thread, abandoned after ``timeout_s`` (:class:`Overran`): a
    Python thread cannot be stopped, but the caller need not wait for it."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # handed to the caller's thread
            box["error"] = err

    thread = threading.Thread(target=target, name="jaxrunner-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise Overran
    if "error" in box:
        raise box["error"]
    return box["value"]
