"""The process backend against the sync backend and raw single-process stepping.

Systems, all alive at once at each width and measured in interleaved rounds (median
kept), so that a noisy, shared machine hits each alike:

* ``process``: ``EnvRunner.sample()`` on ``backend="process"`` (default workers and
  groups unless ``--num-workers``/``--num-splits`` say otherwise), 64-64 tanh MLP.
* ``sync``: the same runner on ``backend="sync"``.
* ``raw``: the same sub-envs stepped with random actions in one process, no policy
  on ``backend="sync"``): the target's yardstick.
* ``raw_process``: the same random-action loop on ``backend="process"`` (what the
  workers can do without a policy in the way).

Usage::

    python benchmarks/process.py --out benchmarks/results/process_cpu.json
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax

from jaxrunner._src import bench
from jaxrunner._src.backends import ProcessConfig, make_vec
from jaxrunner._src.samplers import EnvRunner


def runner_step(runner: EnvRunner) -> Callable[[], int]:
    runner.sample()  # warm-up: compiles, first resets
    return lambda: runner.sample().reward.size


def raw_step(envs: Any, seed: int, rollout_length: int) -> Callable[[], int]:
    """``measure_raw``'s loop: ``envs.step`` with random actions drawn ahead of time."""
    envs.action_space.seed(seed)
    pool = [envs.action_space.sample() for _ in range(97)]
    cursor = 0

    def step() -> int:
        nonlocal cursor
        for _ in range(rollout_length):
            envs.step(pool[cursor])
            cursor = (cursor + 1) % len(pool)
        return rollout_length * envs.num_envs

    step()  # warm-up
    return step


def make_runner(env: str, num_envs: int, backend: str, args: argparse.Namespace) -> EnvRunner:
    config = None
    if backend == "process":
        config = ProcessConfig(num_workers=args.num_workers or None)
    envs = make_vec(env, num_envs, backend=backend, config=config)
    policy = bench.mlp_policy(envs.single_action_space)
    params = policy.init(jax.random.key(args.seed), envs.single_observation_space)
    groups = args.num_splits if backend == "process" else None
    return EnvRunner(envs, policy, params, args.rollout_length, args.seed, num_splits=groups)


def measure_width(num_envs: int, args: argparse.Namespace) -> dict[str, Any]:
    runners = {b: make_runner(args.env, num_envs, b, args) for b in ("process", "sync")}
    config = ProcessConfig(num_workers=args.num_workers or None)
    raw_envs = {
        "raw": make_vec(args.env, num_envs, backend="sync", seed=args.seed),
        "raw_process": make_vec(args.env, num_envs, "process", args.seed, config=config),
    }
    try:
        steps = {name: runner_step(r) for name, r in runners.items()}
        for name, envs in raw_envs.items():
            steps[name] = raw_step(envs, args.seed, args.rollout_length)
        rates: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(args.rounds):
            for name, step in steps.items():
                rates[name].append(bench.timed(step, args.seconds))
        row: dict[str, Any] = {"num_envs": num_envs}
        row.update({f"{name}_steps_per_s": statistics.median(r) for name, r in rates.items()})
        row["all_rounds"] = rates
        row["ratio_process_vs_raw"] = row["process_steps_per_s"] / row["raw_steps_per_s"]
        row["ratio_process_vs_sync"] = row["process_steps_per_s"] / row["sync_steps_per_s"]
        process_envs = runners["process"].envs
        row["process_config"] = {
            "num_workers": process_envs.num_workers,  # type: ignore[attr-defined]
            "num_splits": len(runners["process"].sampler.splits),
        }
        row["process_perf_ms"] = runners["process"].get_metrics()["perf"]
        row["sync_perf_ms"] = runners["sync"].get_metrics()["perf"]
        return row
    finally:
        for runner in runners.values():
            runner.stop()
        for envs in raw_envs.values():
            envs.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--num-workers", type=int, default=None, help="default: CPU count")
    parser.add_argument("--num-splits", type=int, default=None, help="default: the backend's")
    parser.add_argument("--rollout-length", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved repeats; median kept")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()

    load_before = os.getloadavg()
    started = time.time()
    rows = []
    for num_envs in args.num_envs:
        row = measure_width(num_envs, args)
        rows.append(row)
        print(
            f"x{num_envs}: process {row['process_steps_per_s']:,.0f}  sync "
            f"{row['sync_steps_per_s']:,.0f}  raw {row['raw_steps_per_s']:,.0f}  raw_process "
            f"{row['raw_process_steps_per_s']:,.0f}  process/raw "
            f"{row['ratio_process_vs_raw']:.2f}  ({row['process_config']})",
            flush=True,
        )
    bench.write_report(
        "process",
        args,
        rows,
        {
            **bench.machine_info(),
            "autogroup": bench.autogroup(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "wall_s": time.time() - started,
        },
    )


if __name__ == "__main__":
    main()
