"""Does pipelining change the actions? XLA's matmuls round differently by batch size,
so invariant 7 holds bit for bit only because every group's policy call computes
all the envs' rows (``jaxrunner.policy_step.CompiledPolicyStep``); this checks it with wide MLPs.

For MLPs of several widths, samples Pendulum-v1 (Box actions) with 1, 2 and 3
pipelining groups from the same seed, and records how far the actions and log-probs
of the grouped runs are from the one-group run.

Usage::

    python benchmarks/batch_invariance.py --out benchmarks/results/batch_invariance_cpu.json
"""

from __future__ import annotations

import argparse
import pathlib

import jax
import numpy as np

import jaxrunner as jr
from jaxrunner import bench


def sample(num_envs: int, hidden: tuple[int, ...], num_groups: int, steps: int) -> jr.Trajectory:
    envs = jr.make_vec("Pendulum-v1", num_envs)
    policy = bench.mlp_policy(envs.single_action_space, hidden=hidden)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, steps, 0, num_groups=num_groups) as runner:
        return runner.sample()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 256, 512])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = bench.parse_args(parser)

    rows = []
    for width in args.widths:
        hidden = (width, width)
        reference = sample(args.num_envs, hidden, 1, args.steps)
        for groups in (2, 3):
            grouped = sample(args.num_envs, hidden, groups, args.steps)
            rows.append(
                {
                    "hidden": list(hidden),
                    "num_groups": groups,
                    "actions_equal": bool(np.array_equal(reference.action, grouped.action)),
                    "max_action_diff": float(np.abs(reference.action - grouped.action).max()),
                    "max_log_prob_diff": float(
                        np.abs(reference.extras["log_prob"] - grouped.extras["log_prob"]).max()
                    ),
                }
            )
            print(rows[-1])
    bench.write_report("batch_invariance", args, rows)


if __name__ == "__main__":
    main()
