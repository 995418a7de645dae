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
  does not spin, and this row shows why);
* ``spin_{B}us`` for each ``--also-us B``: the same with budget ``B``, reported
  against ``sleep`` and against ``spin`` (``spin_vs_spin_{B}us``: the default's
  per-round ratio to it).

With ``--hogs N``, N busy-looping processes run beside the measurement: a shared
machine, where the spin must back off (``wire.Spin``) and never do worse than sleeping.

CartPole-v1 (or ``--env``), the benchmark's 64-64 MLP, ``T = max(8, 2048 // num_envs)``; the
comparison itself is ``process_layouts.compare_configs``.

Usage::

    python benchmarks/process_spin.py --out benchmarks/results/process_spin_cpu.json
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
from typing import Any

from process_layouts import compare_configs, options, run  # a script beside this one

import jaxrunner as jr
from jaxrunner._src import bench
from jaxrunner._src.backends.process import config as process_config


def measure_width(num_envs: int, args: argparse.Namespace) -> dict[str, Any]:
    configs = {
        "sleep": jr.ProcessConfig(spin_wait_us=0.0),
        "spin": jr.ProcessConfig(spin_wait_us=args.spin_us),
    }
    for budget in args.also_us:
        configs[f"spin_{budget:g}us"] = jr.ProcessConfig(spin_wait_us=budget)
    row = compare_configs(num_envs, configs, "sleep", args)
    rates = row["all_rounds"]
    for name in list(configs)[2:]:
        per_round = [a / b for a, b in zip(rates["spin"], rates[name])]
        row[f"spin_vs_{name}"] = statistics.median(per_round)
        row[f"spin_vs_{name}_range"] = [min(per_round), max(per_round)]
    return {**row, "num_workers": row["spin_num_workers"], "spin_wait_us": args.spin_us}


def describe(row: dict[str, Any]) -> str:
    low, high = row["spin_vs_sleep_range"]
    others = ""
    for key in [k for k in row if k.startswith("spin_vs_spin_") and not k.endswith("_range")]:
        a, b = row[f"{key}_range"]
        others += f"  spin/{key[8:]} {row[key]:.2f} [{a:.2f}-{b:.2f}]"
    return (
        f"({row['num_workers']} workers) sleep {row['sleep_steps_per_s']:,.0f}  spin "
        f"{row['spin_steps_per_s']:,.0f} steps/s  spin/sleep {row['spin_vs_sleep']:.2f} "
        f"[{low:.2f}-{high:.2f}]{others}"
    )


def main() -> None:
    parser = options(__doc__, [8, 64, 256], 0.5, 16)
    parser.add_argument(
        "--spin-us",
        type=float,
        default=process_config.DEFAULT_SPIN_WAIT_US,
        help="the spin variant's spin_wait_us (default: the backend's default budget)",
    )
    parser.add_argument(
        "--also-us",
        type=float,
        nargs="*",
        default=[],
        help="further budgets to measure alongside, e.g. an earlier default",
    )
    parser.add_argument(
        "--hogs", type=int, default=0, help="busy-looping processes beside the measurement"
    )
    args = bench.parse_args(parser)
    context = multiprocessing.get_context("spawn")
    hogs = [context.Process(target=_hog, daemon=True) for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    try:
        run("process_spin", args, measure_width, describe)
    finally:
        for hog in hogs:
            hog.kill()


def _hog() -> None:
    """Another tenant of the machine: takes a CPU whenever it gets one."""
    while True:
        pass


if __name__ == "__main__":
    main()
