"""The ``"envpool"`` backend in each mode ``EnvRunner.from_env``'s trial can choose,
against EnvPool driven by hand in sync and async mode, with the workload's policy.

Per workload and width, in one process, every system built once and timed in
interleaved rounds (the order reversed every other round), env steps per second:

* ``hand_sync``, ``hand_async``: EnvPool by hand, the recording hand loop of
  ``jaxrunner bench`` in sync mode, CleanRL's async loop (``batch_size = num_envs // 2``)
  at EnvPool's own thread count;
* ``sync``, ``sync_one_thread``: ``EnvRunner.sample()`` on the backend at its defaults
  and on one thread (``num_threads=1``);
* ``async``, ``async_fewer_threads``: in async mode (``batch_size = num_envs // 2``) at
  EnvPool's own thread count, and on a thread fewer than the CPUs (the async variant
  of ``from_env``'s trial: ``trial_layouts.envpool_options("envpool_async", ...)``);
* ``two_pools``, ``two_pools_one_thread``: two sync pools (``num_pools=2``), a pipelining
  split each, at EnvPool's own thread count and on one thread each.

Each row keeps every round, each system's median and its median per-round ratio to the
faster of the two hand loops (``over_best_hand``).

Usage (needs the ``envpool`` extra; the workloads of ``jaxrunner bench --workload``)::

    python benchmarks/envpool_modes.py --workload cartpole --num-envs 64 256 1024 \\
        --out benchmarks/results/envpool_modes_cartpole_cpu.json
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
from typing import Any

from peer_loops import EnvPoolAsyncLoop
from script_report import parse_args, write_report

from jaxrunner._src.bench import machine_info
from jaxrunner._src.bench.hand_loop import env_makers
from jaxrunner._src.bench.systems import RolloutSystem, Spec, build, spec_policy
from jaxrunner._src.bench.workloads import get_workload
from jaxrunner._src.runner.trial_layouts import envpool_options


def systems(workload: str, num_envs: int, cpus: int) -> dict[str, Any]:
    """The systems of one row, built (warmed up by their first measure)."""
    env_id = get_workload(workload).env_id
    length = get_workload(workload).rollout_length(num_envs)
    common = {"backend": "envpool", "env": env_id, "num_envs": num_envs}
    common |= {"rollout_length": length, "workload": workload}
    hand = Spec(system="hand", reference="envpool", **common)
    fewer = envpool_options("envpool_async", num_envs, cpus)
    variants = {
        "sync": {},
        "sync_one_thread": {"num_threads": 1},
        "async": {"batch_size": fewer["batch_size"]},
        "async_fewer_threads": fewer,
        "two_pools": {"num_pools": 2},
        "two_pools_one_thread": {"num_pools": 2, "num_threads": 1},
    }
    built = {"hand_sync": build(hand)}
    for name, options in variants.items():
        built[name] = build(Spec(system="jaxrunner", env_kwargs=options, **common))
    _, envpool_id, envpool_kwargs = env_makers(env_id, workload)
    loop = EnvPoolAsyncLoop(
        envpool_id, envpool_kwargs, num_envs, length, 0, lambda o, a: spec_policy(hand, o, a)
    )
    built["hand_async"] = RolloutSystem(loop.rollout, loop.close)
    return built


def measure(workload: str, num_envs: int, rounds: int, seconds: float) -> dict[str, Any]:
    cpus = len(os.sched_getaffinity(0))
    built = systems(workload, num_envs, cpus)
    try:
        for system in built.values():
            system.measure(min(seconds, 0.3))
        rates: dict[str, list[float]] = {name: [] for name in built}
        loads = []
        for index in range(rounds):
            loads.append(os.getloadavg())
            names = list(built) if index % 2 == 0 else list(built)[::-1]
            for name in names:
                rates[name].append(built[name].measure(seconds)["steps_per_s"])
    finally:
        for system in built.values():
            system.close()
    best_hand = [max(s, a) for s, a in zip(rates["hand_sync"], rates["hand_async"])]
    return {
        "workload": workload,
        "num_envs": num_envs,
        "cpus": cpus,
        "async_fewer_threads_options": envpool_options("envpool_async", num_envs, cpus),
        "loadavg_per_round": loads,
        "steps_per_s": {
            name: {"median": statistics.median(r), "rounds": r} for name, r in rates.items()
        },
        "over_best_hand": {
            name: statistics.median(x / b for x, b in zip(r, best_hand))
            for name, r in rates.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--workload", default="cartpole", choices=("cartpole", "halfcheetah", "pong")
    )
    parser.add_argument("--num-envs", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.6, help="per system per round")
    parser.add_argument("--out", type=pathlib.Path, help="write the results here as JSON")
    args = parse_args(parser)
    results = []
    for num_envs in args.num_envs:
        row = measure(args.workload, num_envs, args.rounds, args.seconds)
        results.append(row)
        ratios = ", ".join(f"{k} {v:.2f}" for k, v in row["over_best_hand"].items())
        print(f"{args.workload} x{num_envs}, over the best hand loop: {ratios}", file=sys.stderr)
    import envpool  # type: ignore[import-not-found]  # the benchmark's own venv

    write_report("envpool_modes", args, results, machine_info() | {"envpool": envpool.__version__})


if __name__ == "__main__":
    main()
