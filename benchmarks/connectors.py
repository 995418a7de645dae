"""What observation normalization costs in sampling: runners with and without it, side
by side in one process (interleaved blocks, as ``ab_revision.py`` does).

Per width (CartPole-v1, the benchmark MLP, the same seed): microseconds per vector step
of ``sample()`` without connectors and with ``Connectors(obs=[NormalizeObservation()])``
(median and minimum over blocks), and the median of the per-pair overheads (time with /
time without - 1). The target of issue 18 is at most 5% more time. The machine's load
average is recorded beside the figures: on a shared machine they drift.

Usage::

    python benchmarks/connectors.py --out benchmarks/results/connectors_cpu.json
    python benchmarks/connectors.py --num-envs 64 --blocks 60
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
from typing import Any

import jax
import numpy as np

import jaxrunner as jr
from jaxrunner import connectors as C
from jaxrunner._src import bench

# Sibling benchmark scripts (this directory is on sys.path when run as a script).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from ab_revision import time_block
from script_report import parse_args, write_report


def make_runner(env: str, num_envs: int, rollout_length: int, normalize: bool) -> jr.EnvRunner:
    envs = jr.make_vec(env, num_envs, backend="sync")
    policy = bench.mlp_policy(envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    connectors = C.Connectors(obs=[C.NormalizeObservation()]) if normalize else None
    runner = jr.EnvRunner(envs, policy, params, rollout_length, 0, connectors=connectors)
    runner.sample()  # warm-up (compiles the per-sample part too)
    return runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--rollout-length", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=30, help="timed blocks per variant")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parse_args(parser)

    rows: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    for num_envs in args.num_envs:
        runners = {
            name: make_runner(args.env, num_envs, args.rollout_length, name == "normalized")
            for name in ("plain", "normalized")
        }
        samples = max(1, 4096 // (args.rollout_length * num_envs))  # ~4k env steps a block
        times: dict[str, list[float]] = {name: [] for name in runners}
        for block in range(args.blocks):
            order = ("plain", "normalized") if block % 2 == 0 else ("normalized", "plain")
            for name in order:
                times[name].append(time_block(runners[name], samples, args.rollout_length))
        for runner in runners.values():
            runner.stop()
        overheads = np.array(times["normalized"]) / np.array(times["plain"]) - 1.0
        row = {
            "num_envs": num_envs,
            **{f"{k}_us_per_step_median": float(np.median(v)) for k, v in times.items()},
            **{f"{k}_us_per_step_min": float(np.min(v)) for k, v in times.items()},
            "overhead_median": float(np.median(overheads)),
            "overhead_of_minimums": float(
                np.min(times["normalized"]) / np.min(times["plain"]) - 1.0
            ),
            "load_average_1m": os.getloadavg()[0],
        }
        rows.append(row)
        print(
            f"{num_envs:>5} envs: plain {row['plain_us_per_step_median']:.1f} us/step, "
            f"normalized {row['normalized_us_per_step_median']:.1f} (medians); overhead "
            f"{100 * row['overhead_median']:+.1f}% (median of pairs), "
            f"{100 * row['overhead_of_minimums']:+.1f}% (of minimums); "
            f"load {row['load_average_1m']:.1f}",
            file=sys.stderr,
        )
    machine = {**bench.machine_info(), "load_average_before": list(load_before)}
    machine["load_average_after"] = list(os.getloadavg())
    write_report("connectors", args, rows, machine)


if __name__ == "__main__":
    main()
