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

CartPole-v1, the benchmark's 64-64 MLP, ``T = max(8, 2048 // num_envs)``; the
comparison itself is ``process_layouts.compare_configs``.

Usage::

    python benchmarks/process_spin.py --out benchmarks/results/process_spin_cpu.json
"""

from __future__ import annotations

import argparse
from typing import Any

from process_layouts import compare_configs, options, run  # a script beside this one

import jaxrunner as jr
from jaxrunner import bench
from jaxrunner.envs.process import config as process_config


def measure_width(num_envs: int, args: argparse.Namespace) -> dict[str, Any]:
    configs = {
        "sleep": jr.ProcessConfig(spin_wait_us=0.0),
        "spin": jr.ProcessConfig(spin_wait_us=args.spin_us),
    }
    row = compare_configs(num_envs, configs, "sleep", args)
    return {**row, "num_workers": row["spin_num_workers"], "spin_wait_us": args.spin_us}


def describe(row: dict[str, Any]) -> str:
    low, high = row["spin_vs_sleep_range"]
    return (
        f"({row['num_workers']} workers) sleep {row['sleep_steps_per_s']:,.0f}  spin "
        f"{row['spin_steps_per_s']:,.0f} steps/s  spin/sleep {row['spin_vs_sleep']:.2f} "
        f"[{low:.2f}-{high:.2f}]"
    )


def main() -> None:
    parser = options(__doc__, [8, 64, 256], 0.5, 16)
    parser.add_argument(
        "--spin-us",
        type=float,
        default=process_config.DEFAULT_SPIN_WAIT_US,
        help="the spin variant's spin_wait_us (default: the backend's default budget)",
    )
    run("process_spin", bench.parse_args(parser), measure_width, describe)


if __name__ == "__main__":
    main()
