"""``backend="auto"``: the layout chosen by measurement, on the user's env and machine.

``make_vec(..., backend="auto")`` times one sub-env in the main process
(:func:`measure_env_step_us`), reads the CPUs this process may use
(:func:`~jaxrunner._src.backends.process.launch.available_cpus`: affinity and cgroup
quota) and asks :func:`choose_layout`, a pure function of those measurements, for a
:class:`LayoutChoice`: ``"sync"``, or ``"process"`` with its workers and the main
process's share. The vector env it builds is then exactly the one
``backend="process", config=choice.process_config()`` (or ``backend="sync"``) builds,
so trajectories are the same for the same seed; the choice is kept on it
(``envs.layout_choice``) and reported by ``EnvRunner.get_metrics()["auto"]``.

What is not measured: the policy. ``make_vec`` does not know it, and a layout cannot
change under the runner once it holds the envs. The runner's own split rule already
weighs the policy (``default_num_splits``, from its FLOPs); here the model counts only
the env's work, which makes it conservative where a costly policy would also overlap
with the workers' stepping (see :data:`PROCESS_OVERHEAD_US`).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import gymnasium

from jaxrunner._src.backends.process import ProcessConfig
from jaxrunner._src.backends.process.launch import available_cpus

PROCESS_OVERHEAD_US = 500.0
"""What a process layout costs per vector step beyond its share of the stepping: the
command and reply of each group (a sleeping process takes 70+ us to wake on a virtual
machine, twice per step and group), the main process stepping its share beside the
policy, and processes contending for shared cores. Fitted on 2 cores to CartPole-v1
with the 64-64 MLP (``docs/performance.md``: sync's env step 509 us at 64 envs and
2,032 us at 256; one worker with the main process stepping half the envs did 0.74x
and 1.37x sync there): both widths give 470-500 us. Where every process has a core of
its own (16 cores) the real cost is lower, so the rule errs towards sync there."""

MIN_SPEEDUP = 1.2
"""The predicted speed-up over sync a process layout must reach to be chosen: the
model is coarse, and workers cost start-up time and (for the main process's share)
the isolation of those sub-envs."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayoutChoice:
    """What ``backend="auto"`` chose, from what it measured."""

    backend: str
    """``"sync"`` or ``"process"``."""
    num_workers: int
    """Worker processes (0 for sync)."""
    main_process_envs: int
    """Sub-envs stepped in the main process beside the workers (0: none, or sync)."""
    env_step_us: float
    """The measured median cost of one sub-env's step, in microseconds."""
    num_envs: int
    cpus: int
    """CPUs this process may use (affinity, bounded by the cgroup quota)."""
    reason: str
    """Why, in one line."""

    def process_config(self) -> ProcessConfig | None:
        """The ``ProcessConfig`` that builds this layout (None for sync); spin and
        everything else stay at their defaults."""
        if self.backend != "process":
            return None
        return ProcessConfig(num_workers=self.num_workers, main_process_envs=self.main_process_envs)

    def metrics(self) -> dict[str, int | float]:
        """The choice as numbers, for ``get_metrics()`` and metric loggers (which take
        no strings): ``process`` is 1 where the workers were chosen, else 0."""
        return {
            "process": int(self.backend == "process"),
            "num_workers": self.num_workers,
            "main_process_envs": self.main_process_envs,
            "env_step_us": self.env_step_us,
            "cpus": self.cpus,
        }


def choose_layout(env_step_us: float, num_envs: int, cpus: int) -> LayoutChoice:
    """The layout for ``num_envs`` sub-envs whose step costs ``env_step_us`` on
    ``cpus`` CPUs: a pure function of the measurements.

    The model, per vector step: sync takes ``W = env_step_us * num_envs``. A process
    layout gives one CPU to the main process (it computes the policy) and one worker
    to each other CPU, at most one per sub-env; on 2 cores, where that is one worker
    and stepping would not be parallel at all, the main process steps half the
    sub-envs itself (``main_process_envs``). It takes ``W / P +``
    :data:`PROCESS_OVERHEAD_US`, ``P`` the processes that step. The process layout is
    chosen where that is at least :data:`MIN_SPEEDUP` times faster than sync.
    """
    work_us = env_step_us * num_envs
    measured = dict(env_step_us=env_step_us, num_envs=num_envs, cpus=cpus)
    workers = min(num_envs, cpus - 1)
    if workers < 1:
        return LayoutChoice(
            backend="sync",
            num_workers=0,
            main_process_envs=0,
            reason=f"{cpus} CPU: none left for a worker beside the main process",
            **measured,
        )
    # One worker alone steps no faster than the main process: share the stepping.
    share = num_envs // 2 if workers == 1 and num_envs >= 2 else 0
    stepping = workers + (1 if share else 0)
    process_us = work_us / stepping + PROCESS_OVERHEAD_US
    speedup = work_us / process_us
    if speedup < MIN_SPEEDUP:
        return LayoutChoice(
            backend="sync",
            num_workers=0,
            main_process_envs=0,
            reason=(
                f"{work_us:,.0f} us of env work per step over {stepping} processes predicts "
                f"{speedup:.2f}x sync (< {MIN_SPEEDUP}x): too little to pay the workers"
            ),
            **measured,
        )
    return LayoutChoice(
        backend="process",
        num_workers=workers,
        main_process_envs=share,
        reason=(
            f"{work_us:,.0f} us of env work per step over {stepping} processes predicts "
            f"{speedup:.2f}x sync"
        ),
        **measured,
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


__all__ = [
    "MIN_SPEEDUP",
    "PROCESS_OVERHEAD_US",
    "LayoutChoice",
    "choose_for",
    "choose_layout",
    "measure_env_step_us",
]
