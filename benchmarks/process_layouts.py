"""Process backend layouts side by side: how many workers, and whether the main process
steps a share of the sub-envs itself.

At each width, three runners of ``backend="process"`` are alive in this one process and
take turns in interleaved rounds (a shared machine's drift hits each alike); figures are
medians, ratios the median of per-round ratios to ``keep_one``:

* ``keep_one``: one worker per CPU but one (the default below
  ``launch.ALL_CPUS_FROM_ENVS`` sub-envs);
* ``all_cpus``: one worker per CPU (the default from there);
* ``main_share``: the main process steps ``num_envs // 2`` sub-envs itself, one worker
  per CPU but one steps the rest (``ProcessConfig(main_process_envs=...)``, opt-in).

CartPole-v1, the benchmark's 64-64 MLP, ``T = max(8, 2048 // num_envs)``.

Usage::

    python benchmarks/process_layouts.py --out benchmarks/results/process_layouts_cpu.json
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
from collections.abc import Callable
from typing import Any

import jax

import jaxrunner as jr
from jaxrunner._src import bench
from jaxrunner._src.backends.process import launch


def layouts(num_envs: int) -> dict[str, jr.ProcessConfig]:
    # The backend's own rules: "steps" keeps a CPU for the main process, "waits" does not.
    keep_one = launch.default_num_workers(num_envs, main_process="steps")
    return {
        "keep_one": jr.ProcessConfig(num_workers=keep_one),
        "all_cpus": jr.ProcessConfig(
            num_workers=launch.default_num_workers(num_envs, main_process="waits")
        ),
        "main_share": jr.ProcessConfig(num_workers=keep_one, main_process_envs=num_envs // 2),
    }


def compare_configs(
    num_envs: int, configs: dict[str, jr.ProcessConfig], baseline: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One runner per process config, all alive in this process, in interleaved rounds:
    each one's median steps/s and workers, and each other one's median per-round ratio
    to ``baseline`` (``{name}_vs_{baseline}``, with its range)."""
    rollout = max(8, 2048 // num_envs)
    runners = {}
    try:
        for name, config in configs.items():
            envs = jr.make_vec(args.env, num_envs, backend="process", config=config)
            policy = bench.mlp_policy(envs.single_action_space)
            params = policy.init(jax.random.key(args.seed), envs.single_observation_space)
            runners[name] = jr.EnvRunner(envs, policy, params, rollout, args.seed)
            runners[name].sample()  # compiles, first resets

        steps = {name: lambda r=runner: r.sample().reward.size for name, runner in runners.items()}
        rates = bench.interleaved_rates(steps, args.rounds, args.seconds)
        row: dict[str, Any] = {"num_envs": num_envs, "rollout_length": rollout}
        for name, runner in runners.items():
            row[f"{name}_steps_per_s"] = statistics.median(rates[name])
            row[f"{name}_num_workers"] = runner.envs.num_workers
        for name in configs:
            if name != baseline:
                per_round = [a / b for a, b in zip(rates[name], rates[baseline])]
                row[f"{name}_vs_{baseline}"] = statistics.median(per_round)
                row[f"{name}_vs_{baseline}_range"] = [min(per_round), max(per_round)]
        row["all_rounds"] = rates
        return row
    finally:
        for runner in runners.values():
            runner.stop()


def options(doc: str, widths: list[int], seconds: float, rounds: int) -> argparse.ArgumentParser:
    """The command-line options of a process-config comparison, with its defaults."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, nargs="+", default=widths)
    parser.add_argument("--seconds", type=float, default=seconds, help="per config per round")
    parser.add_argument("--rounds", type=int, default=rounds, help="interleaved rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    return parser


def run(
    benchmark: str,
    args: argparse.Namespace,
    measure: Callable[[int, argparse.Namespace], dict[str, Any]],
    describe: Callable[[dict[str, Any]], str],
) -> None:
    """Measures every width (printing ``describe(row)`` as it goes) and writes the
    report; machine_info's load averages are taken at the end of the run."""
    rows = []
    for num_envs in args.num_envs:
        rows.append(measure(num_envs, args))
        print(f"x{num_envs}: {describe(rows[-1])}", flush=True)
    bench.write_report(
        benchmark, args, rows, {**bench.machine_info(), "autogroup": bench.autogroup()}
    )


def measure_width(num_envs: int, args: argparse.Namespace) -> dict[str, Any]:
    return compare_configs(num_envs, layouts(num_envs), "keep_one", args)


def describe(row: dict[str, Any]) -> str:
    return (
        f"keep_one {row['keep_one_steps_per_s']:,.0f}  all_cpus "
        f"{row['all_cpus_vs_keep_one']:.2f}x  main_share {row['main_share_vs_keep_one']:.2f}x"
    )


def main() -> None:
    args = bench.parse_args(options(__doc__, [64, 128, 256, 512], 0.6, 12))
    run("process_layouts", args, measure_width, describe)


if __name__ == "__main__":
    main()
