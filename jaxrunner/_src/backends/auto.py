"""``backend="auto"``: the layout chosen by measurement, on the user's env and machine.

``make_vec(..., backend="auto")`` times one sub-env in the main process
(:func:`measure_env_step_us`), reads the CPUs this process may use
(:func:`~jaxrunner._src.backends.process.launch.available_cpus`: affinity and cgroup
quota) and asks :func:`choose_layout`, a pure function of those measurements, for a
:class:`LayoutChoice`: ``"sync"``, or ``"process"`` with its number of workers. The
vector env it builds is then exactly the one
``backend="process", config=choice.process_config()`` (or ``backend="sync"``) builds,
so trajectories are the same for the same seed; the choice is kept on it
(``envs.layout_choice``) and reported by ``EnvRunner.get_metrics()["auto"]``.

What is not measured: the policy. ``make_vec`` does not know it, and a layout cannot
change under the runner once it holds the envs. The runner's own split rule already
weighs the policy (``default_num_splits``, from its FLOPs); here the model takes the
policy's worst case for the workers, a free one (see :func:`choose_layout`), so a
costly policy can only make the chosen process layout pay more.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import gymnasium

from jaxrunner._src.backends.process import ProcessConfig
from jaxrunner._src.backends.process.launch import available_cpus

PROCESS_OVERHEAD_US = 1000.0
"""What a process layout costs per vector step beyond the workers' share of the
stepping: a command and a reply per group (a sleeping process takes 70+ us to wake on
a virtual machine, twice per step and group), copies through shared memory, and the
workers contending with the policy's threads for the cores. Measured on 2 cores only
(one worker against sync, the extra time per step): 470-500 us on CartPole at 64 and
256 envs on a quiet day (``docs/performance.md``); 120-930 us on CartPole at 1-256
envs and HalfCheetah at 8 and 32 with the machine loaded (load average 3-4), and 3-8
ms on Pong, whose NatureCNN's threads then take the worker's core
(``benchmarks/results/auto_backend_first_rule_cpu.json``). With
:data:`MIN_WORST_CASE` at 1.0 it decides only from 3 CPUs up, where each process has
a core of its own and the cost is lower: 1,000 us errs towards sync there. Not
measured on such a machine."""

MIN_WORST_CASE = 1.0
"""The least a process layout may reach, as a fraction of sync's steps/s, with a free
policy (the worst case for it: the runner computes the policy of one group while the
workers step another, where sync pays the two in turn, so a costly policy can only
help the workers, in the model). 1.0: the workers must pay for themselves even then.
So one worker (2 cores), which gains only from that overlap, is never chosen: the
policy is not measured here. Measured with 0.9 instead, on the loaded 2-core VM (load
average 3-4, ``benchmarks/results/auto_backend_first_rule_cpu.json``): one worker for
Pong at 32 envs did 0.84x sync; on a quieter day (``peers_pong_cpu.json``) the
process backend did 1.28x sync there. Sync was as fast or faster at every other
width of CartPole, HalfCheetah and Pong on 2 cores."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayoutChoice:
    """What ``backend="auto"`` chose, from what it measured."""

    backend: str
    """``"sync"`` or ``"process"``."""
    num_workers: int
    """Worker processes (0 for sync)."""
    env_step_us: float
    """The measured median cost of one sub-env's step, in microseconds."""
    num_envs: int
    cpus: int
    """CPUs this process may use (affinity, bounded by the cgroup quota)."""
    reason: str
    """Why, in one line."""

    def process_config(self) -> ProcessConfig | None:
        """The ``ProcessConfig`` that builds this layout (None for sync): its workers,
        every sub-env in one (no main process share), spin at its adaptive default."""
        if self.backend != "process":
            return None
        return ProcessConfig(num_workers=self.num_workers, main_process_envs=0)

    def metrics(self) -> dict[str, int | float]:
        """The choice as numbers, for ``get_metrics()`` and metric loggers (which take
        no strings): ``process`` is 1 where the workers were chosen, else 0."""
        return {
            "process": int(self.backend == "process"),
            "num_workers": self.num_workers,
            "env_step_us": self.env_step_us,
            "cpus": self.cpus,
        }


def choose_layout(env_step_us: float, num_envs: int, cpus: int) -> LayoutChoice:
    """The layout for ``num_envs`` sub-envs whose step costs ``env_step_us`` on
    ``cpus`` CPUs: a pure function of the measurements.

    The model, per vector step, for a policy that costs ``P``: sync takes
    ``work + P``, ``work = env_step_us * num_envs``. A process layout keeps one CPU
    for the main process (the policy) and puts one worker on each other CPU, at most
    one per sub-env (``W`` workers); it takes about ``max(work / W, P) +``
    :data:`PROCESS_OVERHEAD_US`. ``P`` is not known here (see the module's
    docstring); its worst case for the workers is ``P = 0``, so the process layout is
    chosen where ``work / (work / W + overhead)`` is at least :data:`MIN_WORST_CASE`.

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
    workers = min(num_envs, cpus - 1)
    if workers < 1:
        return choice(
            backend="sync",
            num_workers=0,
            reason=f"{cpus} CPU: none left for a worker beside the main process",
        )
    worst = work_us / (work_us / workers + PROCESS_OVERHEAD_US)
    over = f"{work_us:,.0f} us of env work per step over {workers} worker"
    over += "s" if workers > 1 else ""
    if worst < MIN_WORST_CASE:
        return choice(
            backend="sync",
            num_workers=0,
            reason=(
                f"{over} predicts {worst:.2f}x sync with a free policy (< {MIN_WORST_CASE}x): "
                + (
                    "one worker gains only from overlapping the policy, not measured"
                    if workers == 1
                    else "too little to pay the workers"
                )
            ),
        )
    return choice(
        backend="process",
        num_workers=workers,
        reason=f"{over} predicts {worst:.2f}x sync with a free policy, more with a costly one",
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
    "MIN_WORST_CASE",
    "PROCESS_OVERHEAD_US",
    "LayoutChoice",
    "choose_for",
    "choose_layout",
    "measure_env_step_us",
]
