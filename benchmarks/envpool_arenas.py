"""The last of several EnvPool runners built in one process, with glibc's malloc arena
limit raised (what the ``"envpool"`` backend does since stop 103) and at glibc's own
limit (8 per CPU): the limit under which a later pool's buffer thread shares the sampling
thread's arena, and both wait on its lock.

Per pair of child processes (the order alternating), each child builds ``--pools``
runners on the backend in async mode (``batch_size = num_envs // 2``, one thread),
closes all but the last, and times the last one's ``sample()``: env steps per second
(the median of 3 measures), and the process's voluntary context switches and system
time over them (the lock waits). The glibc child runs with ``MALLOC_ARENA_MAX`` set to
glibc's own limit, which the backend leaves as it is.

Usage (needs the ``envpool`` extra; Linux with glibc)::

    python benchmarks/envpool_arenas.py --out benchmarks/results/envpool_arenas_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
from typing import Any

from script_report import parse_args, write_report

from jaxrunner._src.bench import machine_info

SETTINGS = ("raised", "glibc")


def child(workload: str, num_envs: int, pools: int, seconds: float) -> dict[str, Any]:
    from jaxrunner._src.backends.malloc_arenas import allow_an_arena_per_thread
    from jaxrunner._src.bench.systems import Spec, build
    from jaxrunner._src.bench.workloads import get_workload

    spec = Spec(
        system="jaxrunner", backend="envpool", env=get_workload(workload).env_id,
        num_envs=num_envs, rollout_length=get_workload(workload).rollout_length(num_envs),
        workload=workload, env_kwargs={"batch_size": num_envs // 2, "num_threads": 1},
    )  # fmt: skip
    built = [build(spec) for _ in range(pools)]
    for system in built[:-1]:
        system.close()
    before = resource.getrusage(resource.RUSAGE_SELF)
    rates = [built[-1].measure(seconds)["steps_per_s"] for _ in range(3)]
    after = resource.getrusage(resource.RUSAGE_SELF)
    built[-1].close()
    return {
        "steps_per_s": statistics.median(rates),
        "voluntary_switches": after.ru_nvcsw - before.ru_nvcsw,
        "system_s": after.ru_stime - before.ru_stime,
        "arena_limit_raised": allow_an_arena_per_thread(),
    }


def run_child(args: argparse.Namespace, setting: str) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("MALLOC_ARENA_MAX", None)
    if setting == "glibc":
        env["MALLOC_ARENA_MAX"] = str(8 * (os.cpu_count() or 1))
    command = [sys.executable, __file__, "--child", "--workload", args.workload]
    command += ["--num-envs", str(args.num_envs), "--pools", str(args.pools)]
    command += ["--seconds", str(args.seconds)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the {setting} child failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--workload", default="cartpole", choices=("cartpole", "halfcheetah", "pong")
    )
    parser.add_argument("--num-envs", type=int, default=256)
    parser.add_argument("--pools", type=int, default=3, help="runners built per process")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=0.8, help="per measure")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=pathlib.Path, help="write the results here as JSON")
    args = parse_args(parser)
    if args.child:
        print(json.dumps(child(args.workload, args.num_envs, args.pools, args.seconds)))
        return
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SETTINGS}
    for pair in range(args.pairs):
        for setting in SETTINGS if pair % 2 == 0 else SETTINGS[::-1]:
            runs[setting].append(run_child(args, setting))
    medians = {s: statistics.median(r["steps_per_s"] for r in runs[s]) for s in SETTINGS}
    row = {
        "workload": args.workload,
        "num_envs": args.num_envs,
        "pools": args.pools,
        "runs": runs,
        "steps_per_s_median": medians,
        "raised_over_glibc": medians["raised"] / medians["glibc"],
        "voluntary_switches_median": {
            s: statistics.median(r["voluntary_switches"] for r in runs[s]) for s in SETTINGS
        },
    }
    print(f"raised over glibc's limit: {row['raised_over_glibc']:.2f}", file=sys.stderr)
    import envpool  # type: ignore[import-not-found]  # the benchmark's own venv

    write_report("envpool_arenas", args, [row], machine_info() | {"envpool": envpool.__version__})


if __name__ == "__main__":
    main()
