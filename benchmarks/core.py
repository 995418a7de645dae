"""Core sampler benchmark: the sync backend against raw stepping and a hand-written loop.

Systems, each measured at every width in one process, side by side:

* ``jaxrunner``: ``EnvRunner.sample()`` (backend from ``--backend``).
* ``raw``: the same vector env stepped with random actions, no policy.
* ``bare_loop``: the sub-envs' ``env.step``/``env.reset`` only.
* ``hand_loop``: what a user would write: ``gymnasium.vector.SyncVectorEnv`` +
  the same jitted Flax policy + numpy conversion of its outputs.
* ``gym_raw``: ``gymnasium.vector.SyncVectorEnv`` of the same sub-envs stepped with
  random actions (drawn ahead of time), no policy: gymnasium's own raw stepping.
* ``hand_loop_jax_defaults``: the hand loop in a child process left at JAX's
  defaults (asynchronous CPU dispatch): the loop as a user writes it without
  jaxrunner's dispatch switch. It alternates with the other systems round by round.

Every other system runs under the same JAX CPU dispatch mode (``--cpu-dispatch``,
inline by default, as ``jaxrunner bench``).

Per width the report also gives where jaxrunner's loop time goes, from its own perf
timers (microseconds per vector step, over the timed samples), and
``policy_bound_vs_raw``: the ratio to raw that a loop stepping the same envs and
calling the policy as the runner does would reach with no other cost at all,
``raw_us / (raw_us + inference_us)``.

Usage::

    python benchmarks/core.py                     # CartPole-v1, widths 1 8 64 256
    python benchmarks/core.py --seconds 5 --out benchmarks/results/core_sync_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import gymnasium
import numpy as np

from jaxrunner import bench

HAND_LOOP_CHILD = """
import json, sys
sys.path.insert(0, {here!r})
import core
from jaxrunner import bench
config = bench.BenchConfig(env={env!r}, seconds={seconds}, widths=({num_envs},))
print(json.dumps([core.measure_hand_loop(config, {num_envs}),
                  bench.machine_info()["jax_cpu_dispatch"]]))
"""


def measure_hand_loop_jax_defaults(config: bench.BenchConfig, num_envs: int) -> float:
    """The hand loop in a child process at JAX's default (asynchronous) CPU dispatch."""
    code = HAND_LOOP_CHILD.format(
        here=str(pathlib.Path(__file__).parent),
        env=config.env,
        seconds=config.seconds,
        num_envs=num_envs,
    )
    env = {**os.environ, "JAX_CPU_ENABLE_ASYNC_DISPATCH": "1"}  # JAX's default, kept
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    steps_per_s, mode = json.loads(done.stdout.strip().splitlines()[-1])
    assert mode == "async", "the child did not run at JAX's default dispatch"
    return steps_per_s


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
    args = bench.parse_args(parser)

    config = bench.BenchConfig(
        env=args.env, widths=tuple(args.num_envs), backend=args.backend, seconds=args.seconds
    )
    costs: list[dict[str, Any]] = []
    systems = {
        "jaxrunner": lambda c, n: bench.measure_jaxrunner(c, n, costs[-1]),
        "raw": bench.measure_raw,
        "bare_loop": bench.measure_bare_loop,
        "hand_loop": measure_hand_loop,
        "gym_raw": measure_gym_raw,
        "hand_loop_jax_defaults": measure_hand_loop_jax_defaults,
    }
    refs = [name for name in systems if name != "jaxrunner"]
    rows = []
    for num_envs in config.widths:
        samples: dict[str, list[float]] = {name: [] for name in systems}
        for _ in range(args.rounds):  # interleaved, so drifts in machine load hit all alike
            costs.append({})
            for name, measure in systems.items():
                samples[name].append(measure(config, num_envs))
        row: dict[str, Any] = {"num_envs": num_envs}
        row.update({f"{k}_steps_per_s": float(np.median(v)) for k, v in samples.items()})
        row.update({f"{k}_all_rounds": v for k, v in samples.items()})
        for ref in refs:
            row[f"ratio_vs_{ref}"] = row["jaxrunner_steps_per_s"] / row[f"{ref}_steps_per_s"]
        row["jaxrunner_us_per_step"] = {
            key: float(np.median([c[key] for c in costs[-args.rounds :]])) for key in costs[-1]
        }
        raw_us = 1e6 * num_envs / row["raw_steps_per_s"]
        inference_us = row["jaxrunner_us_per_step"]["inference_us"]
        row["policy_bound_vs_raw"] = raw_us / (raw_us + inference_us)
        rows.append(row)
        print(
            f"{num_envs:>5}: "
            + "  ".join(f"{k}={row[f'{k}_steps_per_s']:,.0f}" for k in systems)
            + f"\n       vs raw {row['ratio_vs_raw']:.2f} (policy-bound "
            + f"{row['policy_bound_vs_raw']:.2f})  vs hand {row['ratio_vs_hand_loop']:.2f}"
            + f"  vs hand at JAX defaults {row['ratio_vs_hand_loop_jax_defaults']:.2f}"
            + f"  vs gym raw {row['ratio_vs_gym_raw']:.2f}\n       us/step "
            + ", ".join(f"{k} {v:.0f}" for k, v in row["jaxrunner_us_per_step"].items()),
            file=sys.stderr,
        )
    bench.write_report("core", args, rows)


if __name__ == "__main__":
    main()
