"""Spin, then sleep: what busy-waiting for the other side's message buys the process
backend (``ProcessConfig(spin_wait_us=...)``).

At each width, two runners of ``backend="process"`` with the default number of workers
are alive in this one process and take turns in interleaved rounds; figures are
medians, the ratio the median of per-round ratios:

* ``sleep``: ``spin_wait_us=0``, each side sleeps in ``poll``/``recv`` until the
  other's message wakes it;
* ``spin``: ``spin_wait_us=DEFAULT_SPIN_WAIT_US`` (or ``--spin-us``), each side
  busy-waits that long first (the default where the workers leave the main process a
  CPU: below 256 sub-envs on 2 cores; at 256 the default starts a worker per CPU and
  does not spin, and this row shows why).

CartPole-v1, the benchmark's 64-64 MLP, ``T = max(8, 2048 // num_envs)``.

Usage::

    python benchmarks/process_spin.py --out benchmarks/results/process_spin_cpu.json
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
from typing import Any

import jax

import jaxrunner as jr
from jaxrunner import bench
from jaxrunner.envs.process import config as process_config


def measure_width(num_envs: int, args: argparse.Namespace) -> dict[str, Any]:
    rollout = max(8, 2048 // num_envs)
    runners = {}
    try:
        for name, spin_us in (("sleep", 0.0), ("spin", args.spin_us)):
            config = jr.ProcessConfig(spin_wait_us=spin_us)
            envs = jr.make_vec(args.env, num_envs, backend="process", config=config)
            policy = bench.mlp_policy(envs.single_action_space)
            params = policy.init(jax.random.key(args.seed), envs.single_observation_space)
            runners[name] = jr.EnvRunner(envs, policy, params, rollout, args.seed)
            runners[name].sample()  # compiles, first resets

        steps = {name: lambda r=runner: r.sample().reward.size for name, runner in runners.items()}
        rates = bench.interleaved_rates(steps, args.rounds, args.seconds)
        per_round = [a / b for a, b in zip(rates["spin"], rates["sleep"])]
        return {
            "num_envs": num_envs,
            "rollout_length": rollout,
            "num_workers": runners["spin"].envs.num_workers,
            "spin_wait_us": args.spin_us,
            **{f"{name}_steps_per_s": statistics.median(r) for name, r in rates.items()},
            "spin_vs_sleep": statistics.median(per_round),
            "spin_vs_sleep_range": [min(per_round), max(per_round)],
            "all_rounds": rates,
        }
    finally:
        for runner in runners.values():
            runner.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--seconds", type=float, default=0.5, help="per variant per round")
    parser.add_argument("--rounds", type=int, default=16, help="interleaved rounds")
    parser.add_argument(
        "--spin-us",
        type=float,
        default=process_config.DEFAULT_SPIN_WAIT_US,
        help="the spin variant's spin_wait_us (default: the backend's default budget)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = bench.parse_args(parser)
    rows = []
    for num_envs in args.num_envs:
        row = measure_width(num_envs, args)
        rows.append(row)
        low, high = row["spin_vs_sleep_range"]
        print(
            f"x{num_envs} ({row['num_workers']} workers): sleep {row['sleep_steps_per_s']:,.0f}"
            f"  spin {row['spin_steps_per_s']:,.0f} steps/s  spin/sleep "
            f"{row['spin_vs_sleep']:.2f} [{low:.2f}-{high:.2f}]",
            flush=True,
        )
    bench.write_report(
        "process_spin", args, rows, {**bench.machine_info(), "autogroup": bench.autogroup()}
    )


if __name__ == "__main__":
    main()
