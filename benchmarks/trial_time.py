"""How long ``EnvRunner.from_env``'s trial takes, with and without its drop of the layouts
far behind (``trial_layouts.in_the_running``: after ``DROP_AFTER`` rounds, a layout
``DROP_BEHIND`` times slower than the fastest is timed no more), and which layout each
build keeps.

Per case, ``from_env`` is built ``--rounds`` times each way in this process, the two
alternating (the order reversed every other round); a build is timed whole (the probe,
the trial and the runner kept), then the runner is stopped. Cases: ``cartpole:N`` and
``halfcheetah:N``, the workloads of ``jaxrunner bench --workload`` (their env ids, so
EnvPool is tried where it is installed; their policies and rollout lengths), and
``mpe:N``, MPE ``simple_spread`` (3 agents, ``mpe2``) with the benchmark MLP shared by
the agents and ``T = 64``, as ``benchmarks/multi_agent.py`` builds it. Each row keeps
every build's seconds and kept layout, and the medians' ratio (with the drop / without).

Usage::

    python benchmarks/trial_time.py --cases cartpole:64 halfcheetah:8 mpe:8 mpe:64 \\
        --out benchmarks/results/trial_time_cpu.json
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time
from typing import Any

import jax
from script_report import parse_args, write_report

import jaxrunner as jr
from jaxrunner._src.bench.workloads import get_workload
from jaxrunner._src.runner import auto_layout
from jaxrunner._src.runner.trial_layouts import DROP_AFTER, TRIAL_ROUNDS, kept_key, label

MPE_ROLLOUT = 64


def _case(case: str) -> tuple[Any, int, Any, Any, int]:
    """``(env, num_envs, policy, params, rollout_length)`` of a case."""
    name, _, width = case.partition(":")
    num_envs = int(width)
    if name == "mpe":
        from multi_agent import _policy, make_env

        return (make_env, num_envs, *_policy(), MPE_ROLLOUT)
    work = get_workload(name)
    probe = jr.make_vec(work.env_id, 1)
    policy = work.policy(probe.single_observation_space, probe.single_action_space)
    params = policy.init(jax.random.key(0), probe.single_observation_space)
    probe.close()
    return work.env_id, num_envs, policy, params, work.rollout_length(num_envs)


def _build(case: tuple[Any, int, Any, Any, int], drop: bool) -> tuple[float, str]:
    """Seconds to build ``from_env``, the drop on or off, and the layout it kept."""
    env, num_envs, policy, params, length = case
    auto_layout.DROP_AFTER = DROP_AFTER if drop else 2 * TRIAL_ROUNDS  # off: never reached
    start = time.perf_counter()
    runner = jr.EnvRunner.from_env(env, num_envs, policy, params, length, seed=0)
    took = time.perf_counter() - start
    choice = runner.envs.layout_choice
    runner.stop()
    return took, label(kept_key(choice)) if choice is not None else "no trial"


def measure(name: str, rounds: int) -> dict[str, Any]:
    case = _case(name)
    _build(case, True)  # warm-up: imports, compiles, EnvPool's first pool
    seconds: dict[str, list[float]] = {"drop": [], "no_drop": []}
    kept: dict[str, list[str]] = {"drop": [], "no_drop": []}
    for index in range(rounds):
        order = ("drop", "no_drop") if index % 2 == 0 else ("no_drop", "drop")
        for mode in order:
            took, layout = _build(case, mode == "drop")
            seconds[mode].append(took)
            kept[mode].append(layout)
    medians = {mode: statistics.median(s) for mode, s in seconds.items()}
    return {
        "case": name,
        "build_s": seconds,
        "kept": kept,
        "median_build_s": medians,
        "drop_over_no_drop": medians["drop"] / medians["no_drop"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cases", nargs="+", default=["cartpole:64", "mpe:8", "mpe:64"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=pathlib.Path, help="write the results here as JSON")
    args = parse_args(parser)
    results = []
    for name in args.cases:
        row = measure(name, args.rounds)
        results.append(row)
        medians = ", ".join(f"{k} {v:.1f} s" for k, v in row["median_build_s"].items())
        print(f"{name}: {medians}; kept {row['kept']}", flush=True)
    write_report("trial_time", args, results)


if __name__ == "__main__":
    main()
