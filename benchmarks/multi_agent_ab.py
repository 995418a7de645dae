"""The multi-agent host benchmark's ``jaxrunner_process`` system (MPE simple_spread,
``backend="process"`` at its defaults) of another checkout against this one.

Each tree's system runs in its own persistent child (``benchmarks/multi_agent.py
--child`` of that tree, with that tree on ``PYTHONPATH``); rounds interleave, and the
figure per width is the median of the per-round ratios (this tree / the other). For
a change measured on a machine shared with other work, where separate runs drift by
tens of percent.

Usage::

    python benchmarks/multi_agent_ab.py --base-tree /work/main \
        --out benchmarks/results/multi_agent_process_ab_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
from typing import Any

from jaxrunner._src import bench

HERE = pathlib.Path(__file__).resolve().parent.parent


def start(tree: pathlib.Path, system: str, width: int, rollout: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(tree))
    env.pop("JAX_CPU_ENABLE_ASYNC_DISPATCH", None)  # jaxrunner's own default
    command = [sys.executable, str(tree / "benchmarks" / "multi_agent.py"), "--child", system]
    command += ["--part", "host", "--widths", str(width), "--rollout", str(rollout)]
    proc = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=tree
    )
    ready = proc.stdout.readline()  # type: ignore[union-attr]
    if not ready:
        raise RuntimeError(f"benchmark child {command} exited ({proc.wait()})")
    return proc


def measure(proc: subprocess.Popen, seconds: float) -> float:
    proc.stdin.write(f"{seconds}\n")  # type: ignore[union-attr]
    proc.stdin.flush()  # type: ignore[union-attr]
    return float(json.loads(proc.stdout.readline())["rate"])  # type: ignore[union-attr]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-tree", type=pathlib.Path, required=True)
    parser.add_argument("--system", default="jaxrunner_process")
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rollout", type=int, default=64)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()
    base = args.base_tree.resolve()
    args.base_tree = str(base)
    load_at_start = os.getloadavg()
    revisions = {
        name: subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        for name, tree in (("base", base), ("this", HERE))
    }
    results: list[dict[str, Any]] = []
    for width in args.widths:
        kids = {name: start(tree, args.system, width, args.rollout) for name, tree in
                (("base", base), ("this", HERE))}  # fmt: skip
        rates: dict[str, list[float]] = {name: [] for name in kids}
        try:
            for _ in range(args.rounds):
                for name, proc in kids.items():
                    rates[name].append(measure(proc, args.seconds))
        finally:
            for proc in kids.values():
                proc.stdin.close()  # type: ignore[union-attr]
                proc.wait()
        ratios = [b / a for a, b in zip(rates["base"], rates["this"])]
        results.append(
            {
                "num_envs": width,
                "env_steps_per_s": {k: statistics.median(v) for k, v in rates.items()},
                "this_over_base": statistics.median(ratios),
                "this_over_base_per_round": ratios,
            }
        )
        print(results[-1], flush=True)
    machine = {**bench.machine_info(), "loadavg_at_start": load_at_start, "revisions": revisions}
    bench.write_report("multi_agent_ab", args, results, machine)


if __name__ == "__main__":
    main()
