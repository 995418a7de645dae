"""Does ``backend="auto"`` choose well? ``EnvRunner.sample()`` on the sync backend, the
process backend at its defaults and ``EnvRunner.from_env(..., backend="auto")`` (the
layout tried with the policy where the env-only rule would start workers), side by
side.

Where EnvPool is installed, the ``"envpool"`` backend at its defaults runs beside them
(auto's trial then tries it too). Per workload and width (the workloads of ``jaxrunner
bench --workload``: CartPole-v1 with the 64-64 MLP at 1, 8, 64 and 256 envs;
HalfCheetah-v5 with the 256-256 Gaussian MLP at 8 and 32; Pong with NatureCNN at 8 and
32, where installed), the runners are built once in one child process, auto first (its
trial then runs with no other runner's envs or workers alive, as a user's does;
``--auto-last``: auto last, for the other build order), and timed in interleaved rounds
(the order rotates every round). The row keeps every round, each variant's median
steps/s, what auto chose and why, and ``auto / best``: auto's median over the best of
the other variants' medians (the per-round ratios' spread beside it). Where auto's
layout is the same as another variant's (the same backend, workers and splits), its
figure differs from that one's by noise only, so the row also says whether auto picked
the fastest of them. The machine's load average is recorded per round: on a shared machine
the figures drift. ``build_s`` is each variant's time to build and warm up (for auto,
its trial included).

Usage::

    python benchmarks/auto_backend.py --seconds 1 --rounds 3 \\
        --out benchmarks/results/auto_backend_cpu.json
    python benchmarks/auto_backend.py --workloads cartpole --num-envs 64 256
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import pathlib
import statistics
import sys
import time
from typing import Any

from script_report import write_report

from jaxrunner._src import bench
from jaxrunner._src.bench.child import Child, ChildError
from jaxrunner._src.bench.report import format_choice
from jaxrunner._src.bench.systems import Spec

ENVPOOL = ("envpool",) if importlib.util.find_spec("envpool") else ()
VARIANTS = ("auto", "sync", "process", *ENVPOOL)
"""auto, then the layouts it chooses among (the child runs in this interpreter)."""
WIDTHS = {"cartpole": (1, 8, 64, 256), "halfcheetah": (8, 32), "pong": (8, 32)}


def measure(
    child: Child, workload: str, num_envs: int, rounds: int, seconds: float, auto_last: bool
) -> dict[str, Any]:
    """One width: the variants built in ``child`` (auto first, or last with
    ``auto_last``), timed in ``rounds`` rounds."""
    spec = bench.get_workload(workload)
    row: dict[str, Any] = {"workload": workload, "num_envs": num_envs, "errors": {}}
    built = []
    row["build_s"] = {}  # building and warming up (auto: its trial too)
    for variant in (*VARIANTS[1:], VARIANTS[0]) if auto_last else VARIANTS:
        system = Spec(
            system="jaxrunner",
            backend=variant,
            env=spec.env_id,
            num_envs=num_envs,
            rollout_length=spec.rollout_length(num_envs),
            workload=workload,
        )
        try:
            start = time.perf_counter()
            child.request("build", name=variant, spec=dataclasses.asdict(system))
            row["build_s"][variant] = time.perf_counter() - start
            built.append(variant)
        except ChildError as err:
            row["errors"][variant] = f"build: {err}"
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in built}
    row["loadavg_per_round"] = []
    for index in range(rounds):
        row["loadavg_per_round"].append(os.getloadavg())
        shift = index % len(built)
        for variant in built[shift:] + built[:shift]:
            results[variant].append(child.request("measure", name=variant, seconds=seconds))
    for variant in built:
        child.request("close", name=variant)
    rates = {v: [r["steps_per_s"] for r in results[v]] for v in built}
    row["steps_per_s"] = {
        v: {"median": statistics.median(r), "rounds": r} for v, r in rates.items()
    }
    row["layout"] = {
        v: {k: results[v][0].get(k) for k in ("num_workers", "num_splits")} for v in built
    }
    for v in built:  # EnvPool's layout has no workers, as sync's
        row["layout"][v]["backend"] = results[v][0]["auto"]["backend"] if v == "auto" else v
    if "auto" in built:
        row["auto_choice"] = results["auto"][0]["auto"]
    if set(built) == set(VARIANTS):
        # Where auto built the same layout as one of the others, its own figure differs
        # from that one's by noise only: also say whether it picked the fastest of them.
        others = VARIANTS[1:]
        same = [v for v in others if row["layout"][v] == row["layout"]["auto"]]
        fastest = max(others, key=lambda v: row["steps_per_s"][v]["median"])
        row["auto_same_layout_as"] = same[0] if same else None
        row["auto_picked_faster"] = same[0] == fastest if same else None
        best = max(row["steps_per_s"][v]["median"] for v in others)
        per_round = [a / max(rest) for a, *rest in zip(rates["auto"], *(rates[v] for v in others))]
        row["auto_over_best"] = {
            "median": row["steps_per_s"]["auto"]["median"] / best,
            "min": min(per_round),
            "max": max(per_round),
            "rounds": per_round,
        }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WIDTHS), choices=list(WIDTHS))
    parser.add_argument(
        "--num-envs", type=int, nargs="+", default=None, help="widths (default: each workload's)"
    )
    parser.add_argument("--seconds", type=float, default=1.0, help="seconds per variant per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--auto-last",
        action="store_true",
        help="build auto after sync and process (its trial then runs beside their idle "
        "envs and workers): two runners of one layout in one process differ by a few "
        "percent with their build order, so compare both orders",
    )
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()

    rows: list[dict[str, Any]] = []
    loadavg_before = list(os.getloadavg())
    with Child("jaxrunner", jax_defaults=False) as child:
        machine = child.request("info")["machine"]
        for workload in args.workloads:
            reason = bench.get_workload(workload).unavailable()
            if reason:
                rows.append({"workload": workload, "skipped": reason})
                print(f"{workload}: skipped: {reason}", file=sys.stderr, flush=True)
                continue
            for num_envs in args.num_envs or WIDTHS[workload]:
                row = measure(child, workload, num_envs, args.rounds, args.seconds, args.auto_last)
                rows.append(row)
                print(summary(row), file=sys.stderr, flush=True)
    machine["loadavg_before"], machine["loadavg_after"] = loadavg_before, list(os.getloadavg())
    machine["autogroup"] = bench.autogroup()
    write_report("auto_backend", args, rows, machine=machine)


def summary(row: dict[str, Any]) -> str:
    """One row in a line: medians, auto / best, and the choice."""
    rates = "  ".join(f"{v} {r['median']:,.0f}" for v, r in row["steps_per_s"].items())
    builds = ", ".join(f"{v} {s:.1f}" for v, s in row["build_s"].items())
    line = f"{row['workload']} x{row['num_envs']}: {rates} steps/s (built in s: {builds})"
    if "auto_over_best" in row:
        ratio = row["auto_over_best"]
        line += f"; auto/best {ratio['median']:.2f} [{ratio['min']:.2f}-{ratio['max']:.2f}]"
    if row.get("auto_same_layout_as"):
        picked = "the fastest" if row["auto_picked_faster"] else "not the fastest"
        line += f"; auto = {row['auto_same_layout_as']}'s layout, {picked}"
    if "auto_choice" in row:
        line += f"; auto chose {format_choice(row['auto_choice'])}"
    return line + "".join(f"; {v} failed: {e}" for v, e in row["errors"].items())


if __name__ == "__main__":
    main()
