"""Per step or per sample: where does a revision's sampling time go?

Two ``EnvRunner``s on the sync backend, CartPole-v1 and the benchmark MLP, one with short
rollouts (``--short``, 16 steps) and one with long ones (``--long``, 1024), built once
and timed in interleaved rounds. The long one's time per step is what every step costs;
what the short one pays above it, times its length, is what every ``sample()`` costs
(allocating, closing the episodes, the metrics, the trajectory view). Run it on two
revisions (``PYTHONPATH=<other checkout>``) to tell which of the two grew: it imports
nothing of ``benchmarks/`` and only public jaxrunner names, so it runs on old ones.

Usage::

    python benchmarks/sample_overhead.py --num-envs 1 8
    PYTHONPATH=/tmp/base python benchmarks/sample_overhead.py --num-envs 1 8
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import sys
import time
from typing import Any

import jax

import jaxrunner as jr
from jaxrunner.models import mlp_policy


def measure(num_envs: int, short: int, long: int, rounds: int) -> dict[str, Any]:
    runners = {}
    for length in (short, long):
        envs = jr.make_vec("CartPole-v1", num_envs, "sync")
        policy = mlp_policy(envs.single_action_space)
        params = policy.init(jax.random.key(0), envs.single_observation_space)
        runners[length] = jr.EnvRunner(envs, policy, params, length, 0)
    try:
        for runner in runners.values():
            runner.sample()  # warm-up: compiles, first resets
        us: dict[int, list[float]] = {length: [] for length in runners}
        for _ in range(rounds):
            for length, runner in runners.items():
                samples = max(1, 4096 // length)
                start = time.perf_counter()
                for _ in range(samples):
                    runner.sample()
                us[length].append(1e6 * (time.perf_counter() - start) / (samples * length))
    finally:
        for runner in runners.values():
            runner.stop()
    per_step = {length: statistics.median(v) for length, v in us.items()}
    return {
        "num_envs": num_envs,
        "us_per_step_median": {str(k): v for k, v in per_step.items()},
        "us_per_step": {str(k): v for k, v in us.items()},
        "per_sample_us": (per_step[short] - per_step[long]) * short,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--short", type=int, default=16)
    parser.add_argument("--long", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()
    rows = [measure(n, args.short, args.long, args.rounds) for n in args.num_envs]
    for row in rows:
        steps = row["us_per_step_median"]
        print(
            f"{row['num_envs']} envs: {steps[str(args.long)]:.1f} us a step, "
            f"{row['per_sample_us']:.0f} us a sample",
            flush=True,
        )
    report = {
        "benchmark": "sample_overhead",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "jaxrunner": jr.__file__,
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "jax": jax.__version__,
            "jax_devices": [str(d) for d in jax.devices()],
            "loadavg": os.getloadavg(),
        },
        "results": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
