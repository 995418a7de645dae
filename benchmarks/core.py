"""Core sampler benchmark: the sync backend against raw stepping and a hand-written loop.

Systems, each measured at every width in one process, side by side:

* ``jaxrunner``: ``EnvRunner.sample()`` (backend from ``--backend``).
* ``raw``: the same vector env stepped with random actions, no policy.
* ``bare_loop``: the sub-envs' ``env.step``/``env.reset`` only.
* ``hand_loop``: what a user would write: ``gymnasium.vector.SyncVectorEnv`` +
  the same jitted Flax policy + numpy conversion of its outputs.
* ``gym_raw``: ``gymnasium.vector.SyncVectorEnv`` of the same sub-envs stepped with
  random actions (drawn ahead of time), no policy: gymnasium's own raw stepping.

Every system runs under the same JAX CPU dispatch mode (``--cpu-dispatch``, inline by
default, as ``jaxrunner bench``).

Usage::

    python benchmarks/core.py                     # CartPole-v1, widths 1 8 64 256
    python benchmarks/core.py --seconds 5 --out benchmarks/results/core_sync_cpu.json
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import gymnasium
import numpy as np

from jaxrunner import bench, use_inline_cpu_dispatch


def measure_hand_loop(config: bench.BenchConfig, num_envs: int) -> float:
    """gymnasium's SyncVectorEnv driven by the same jitted policy, by hand."""
    envs = gymnasium.vector.SyncVectorEnv(
        [lambda: gymnasium.make(config.env)] * num_envs,
        autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP,
    )
    rollout = bench.hand_loop(envs, num_envs, config.rollout_length, config.seed)
    try:
        rollout()  # warm-up (compiles)
        return bench.timed(rollout, config.seconds)
    finally:
        envs.close()


def measure_gym_raw(config: bench.BenchConfig, num_envs: int) -> float:
    """gymnasium's SyncVectorEnv of the same sub-envs, random actions, no policy."""
    envs = gymnasium.vector.SyncVectorEnv(
        [lambda: gymnasium.make(config.env)] * num_envs,
        autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP,
    )
    envs.reset(seed=config.seed)
    envs.action_space.seed(config.seed)
    pool = [envs.action_space.sample() for _ in range(97)]
    cursor = 0

    def rollout() -> int:
        nonlocal cursor
        for _ in range(config.rollout_length):
            envs.step(pool[cursor])
            cursor = (cursor + 1) % len(pool)
        return config.rollout_length * num_envs

    try:
        rollout()
        return bench.timed(rollout, config.seconds)
    finally:
        envs.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--backend", default="sync")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repeats; median kept")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    bench.add_cpu_dispatch_option(parser)
    args = parser.parse_args()
    if args.cpu_dispatch == "inline":
        use_inline_cpu_dispatch()

    config = bench.BenchConfig(
        env=args.env, widths=tuple(args.num_envs), backend=args.backend, seconds=args.seconds
    )
    systems = {**bench.SYSTEMS, "hand_loop": measure_hand_loop, "gym_raw": measure_gym_raw}
    rows = []
    for num_envs in config.widths:
        samples: dict[str, list[float]] = {name: [] for name in systems}
        for _ in range(args.rounds):  # interleaved, so drifts in machine load hit all alike
            for name, measure in systems.items():
                samples[name].append(measure(config, num_envs))
        row = {"num_envs": num_envs}
        row.update({f"{k}_steps_per_s": float(np.median(v)) for k, v in samples.items()})
        row.update({f"{k}_all_rounds": v for k, v in samples.items()})
        for ref in ("raw", "bare_loop", "hand_loop", "gym_raw"):
            row[f"ratio_vs_{ref}"] = row["jaxrunner_steps_per_s"] / row[f"{ref}_steps_per_s"]
        rows.append(row)
        print(
            f"{num_envs:>5}: "
            + "  ".join(f"{k}={row[f'{k}_steps_per_s']:,.0f}" for k in systems)
            + f"  vs raw {row['ratio_vs_raw']:.2f}  vs hand {row['ratio_vs_hand_loop']:.2f}"
            + f"  vs gym raw {row['ratio_vs_gym_raw']:.2f}",
            file=sys.stderr,
        )
    bench.write_report("core", args, rows)


if __name__ == "__main__":
    main()
