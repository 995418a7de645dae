"""EnvRunnerGroup scaling: 1 vs 2 runners (Ray actors) on this machine.

Each runner samples CartPole-v1 with the benchmark MLP; every system (a local
EnvRunner without Ray, groups of 1 and 2 runners) is measured in turn, round after
round, and the medians are kept: the machine may be shared, so conditions drift.
Throughput counts the env steps returned to the driver per second of wall time
(gathering included).

    python3 benchmarks/ray_scaling.py --out benchmarks/results/ray_scaling_cpu.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import statistics
import time
from typing import Any

import jax

import jaxrunner as jr
from jaxrunner._src.bench import machine_info, mlp_policy


def measure(sample: Any, steps_per_call: int, seconds: float) -> float:
    """Env steps per second of repeated ``sample()`` calls for ``seconds``."""
    sample()  # warm-up
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        sample()
        calls += 1
    return calls * steps_per_call / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, default=16, help="envs per runner")
    parser.add_argument("--rollout-length", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/ray_scaling_cpu.json")
    args = parser.parse_args()

    import ray

    loadavg_start = os.getloadavg()
    ray.init(include_dashboard=False, log_to_driver=False)
    policy_factory = functools.partial(mlp_policy, hidden=(64, 64))
    envs = jr.make_vec(args.env, args.num_envs)
    params = policy_factory(envs.single_action_space).init(
        jax.random.key(0), envs.single_observation_space
    )
    local = jr.EnvRunner(
        envs, policy_factory(envs.single_action_space), params, args.rollout_length, 0
    )
    groups = {
        n: jr.EnvRunnerGroup(
            args.env,
            policy_factory,
            params,
            jr.EnvRunnerGroupConfig(
                num_runners=n,
                num_envs_per_runner=args.num_envs,
                rollout_length=args.rollout_length,
                # Both groups stay up (3 runners on 2 CPUs) but only one samples at a
                # time: half a logical CPU each lets Ray place them all.
                num_cpus_per_runner=0.5,
            ),
        )
        for n in (1, 2)
    }
    steps = args.num_envs * args.rollout_length
    systems = {
        "local_runner": (local.sample, steps),
        "group_1_runner": (groups[1].sample, steps),
        "group_2_runners": (groups[2].sample, 2 * steps),
    }
    rates: dict[str, list[float]] = {name: [] for name in systems}
    for r in range(args.rounds):
        for name, (sample, n) in systems.items():
            rates[name].append(measure(sample, n, args.seconds))
            print(f"round {r}: {name:16s} {rates[name][-1]:10,.0f} env steps/s", flush=True)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    result = {
        "benchmark": "ray_scaling",
        "command": "python3 benchmarks/ray_scaling.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        "config": vars(args),
        "machine": machine_info(),
        "ray": ray.__version__,
        "ray_cluster_cpus": ray.cluster_resources().get("CPU"),
        "env_steps_per_s": {name: values for name, values in rates.items()},
        "median_env_steps_per_s": medians,
        "ratio_2_vs_1_runner": medians["group_2_runners"] / medians["group_1_runner"],
        "ratio_1_runner_vs_local": medians["group_1_runner"] / medians["local_runner"],
        "loadavg_start": loadavg_start,
        "loadavg": os.getloadavg(),
    }
    for group in groups.values():
        group.stop()
    local.stop()
    ray.shutdown()
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "median_env_steps_per_s",
                    "ratio_2_vs_1_runner",
                    "ratio_1_runner_vs_local",
                    "loadavg",
                )
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
