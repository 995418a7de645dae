"""The process backend with and without the main process's share
(``ProcessConfig(main_process_envs=k)``), single- or multi-agent, in one process.

Per width, two runners of the same env, policy and seed, one at the backend's defaults and
one with the first ``k = num_envs // 2`` sub-envs stepped in the main process (worker 0),
each sampled in interleaved blocks of about ``--block-steps`` env steps (4k; the order
alternates each block). Reports the median env steps/s of each and the median of the
per-block ratios, and whether their trajectories are identical (they must be: the share
changes where sub-envs step, not what they do).

Usage::

    python benchmarks/main_process_share.py --env mpe2:simple_spread_v3 --num-envs 8 64
    python benchmarks/main_process_share.py --env CartPole-v1 --num-envs 64 256 \
        --out benchmarks/results/main_process_share_cartpole_cpu.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time
from typing import Any

import jax
import numpy as np

import jaxrunner as jr
from jaxrunner._src.bench import machine_info
from jaxrunner.models import mlp_policy


def make_runner(env: str, num_envs: int, share: int, rollout_length: int) -> jr.EnvRunner:
    config = jr.ProcessConfig(main_process_envs=share) if share else None
    if ":" in env:  # a PettingZoo parallel env, module:name
        module, name = env.split(":")
        factory = importlib.import_module(f"{module}.{name}").parallel_env
        envs = jr.make_vec(factory, num_envs, "process", config=config)
        policies = {g.policy_id: mlp_policy(g.action_space) for g in envs.groups}
        params = {
            g.policy_id: policies[g.policy_id].init(jax.random.key(0), g.observation_space)
            for g in envs.groups
        }
        return jr.EnvRunner(envs, policies, params, rollout_length, seed=0)
    envs = jr.make_vec(env, num_envs, "process", config=config)
    policy = mlp_policy(envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    return jr.EnvRunner(envs, policy, params, rollout_length, seed=0)


def steps_per_s(runner: jr.EnvRunner, samples: int) -> float:
    start = time.perf_counter()
    for _ in range(samples):
        runner.sample()
    return samples * runner.rollout_length * runner.envs.num_envs / (time.perf_counter() - start)


def measure(
    env: str, num_envs: int, rollout_length: int, blocks: int, block_steps: int
) -> dict[str, Any]:
    runners = {
        "default": make_runner(env, num_envs, 0, rollout_length),
        "share": make_runner(env, num_envs, num_envs // 2, rollout_length),
    }
    try:
        firsts = {k: r.sample() for k, r in runners.items()}
        identical = all(
            np.array_equal(a, b)
            for a, b in zip(jax.tree.leaves(firsts["default"]), jax.tree.leaves(firsts["share"]))
        )
        samples = max(1, block_steps // (rollout_length * num_envs))
        rates: dict[str, list[float]] = {k: [] for k in runners}
        for block in range(blocks):
            order = list(runners) if block % 2 == 0 else list(reversed(runners))
            for name in order:
                rates[name].append(steps_per_s(runners[name], samples))
    finally:
        for runner in runners.values():
            runner.stop()
    ratios = [s / d for s, d in zip(rates["share"], rates["default"])]
    return {
        "num_envs": num_envs,
        "main_process_envs": num_envs // 2,
        "rollout_length": rollout_length,
        "default_steps_per_s_median": statistics.median(rates["default"]),
        "share_steps_per_s_median": statistics.median(rates["share"]),
        "share_over_default_median": statistics.median(ratios),
        "share_over_default_min_max": [min(ratios), max(ratios)],
        "identical_trajectories": identical,
        "rounds": rates,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--rollout-length", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--block-steps", type=int, default=4096, help="env steps per block")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = []
    for num_envs in args.num_envs:
        row = measure(args.env, num_envs, args.rollout_length, args.blocks, args.block_steps)
        rows.append(row)
        print(
            f"{args.env} x{num_envs}: default {row['default_steps_per_s_median']:,.0f}, "
            f"share of {num_envs // 2} {row['share_steps_per_s_median']:,.0f} env steps/s, "
            f"share/default {row['share_over_default_median']:.2f} "
            f"[{row['share_over_default_min_max'][0]:.2f}-"
            f"{row['share_over_default_min_max'][1]:.2f}], "
            f"identical trajectories: {row['identical_trajectories']}",
            flush=True,
        )
    report = {
        "benchmark": "main_process_share",
        "command": "python benchmarks/main_process_share.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v),
        "machine": machine_info(),
        "results": rows,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
