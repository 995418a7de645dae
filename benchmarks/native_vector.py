"""Natively vectorized envs: EnvRunner on ``backend="gymnasium"`` against a hand loop.

The env is gymnasium's own vector implementation (``gymnasium.make_vec(env,
vectorization_mode="vector_entry_point")``; for CartPole-v1, ``CartPoleVectorEnv``,
which steps every env with a few numpy ops). Systems, measured side by side in one
process, interleaved in rounds (medians reported, every round kept):

* ``jaxrunner``: ``EnvRunner.sample()`` over ``make_vec(env, n, backend="gymnasium")``
  with the benchmark MLP (``jaxrunner._src.bench.mlp_policy``); one group (the vector env
  steps all envs at once).
* ``hand_loop``: what a user would write: the same gymnasium vector env, the same
  policy jitted with one key split per step, ``np.asarray`` of actions and extras.
* ``raw``: the same vector env stepped with random actions drawn ahead: no policy.
* ``policy_only``: the hand loop's jitted policy on fixed observations, blocking on
  its output each step: the policy's own floor (not a sampler).

Usage::

    python benchmarks/native_vector.py                      # widths 256 1024 4096
    python benchmarks/native_vector.py --seconds 3 --rounds 5 \\
        --out benchmarks/results/native_vector_cpu.json
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import gymnasium
import jax
import numpy as np

import jaxrunner as jr
from jaxrunner._src import bench

Measure = Callable[[argparse.Namespace, int], dict[str, Any]]


def _native(args: argparse.Namespace, num_envs: int) -> gymnasium.vector.VectorEnv:
    return gymnasium.make_vec(args.env, num_envs, vectorization_mode="vector_entry_point")


def _policy(space: gymnasium.Space, obs_space: gymnasium.Space, seed: int) -> tuple[jr.Policy, Any]:
    policy = bench.mlp_policy(space)
    return policy, policy.init(jax.random.key(seed), obs_space)


def measure_jaxrunner(args: argparse.Namespace, num_envs: int) -> dict[str, Any]:
    envs = jr.make_vec(args.env, num_envs, backend="gymnasium")
    policy, params = _policy(envs.single_action_space, envs.single_observation_space, args.seed)
    with jr.EnvRunner(envs, policy, params, args.rollout_length, args.seed, num_splits=1) as r:
        r.sample()  # warm-up (compiles)
        steps_per_s = bench.timed(lambda: r.sample().reward.size, args.seconds)
        return {"steps_per_s": steps_per_s, "perf_ms_per_step": r.get_metrics()["perf"]}


def measure_hand_loop(args: argparse.Namespace, num_envs: int) -> dict[str, Any]:
    envs = _native(args, num_envs)
    rollout = bench.hand_loop(envs, num_envs, args.rollout_length, args.seed)
    try:
        rollout()  # warm-up (compiles)
        return {"steps_per_s": bench.timed(rollout, args.seconds)}
    finally:
        envs.close()


def measure_raw(args: argparse.Namespace, num_envs: int) -> dict[str, Any]:
    envs = _native(args, num_envs)
    envs.reset(seed=args.seed)
    rng = np.random.default_rng(args.seed)
    pool = [rng.integers(0, 2, size=num_envs) for _ in range(17)]

    def rollout() -> int:
        for t in range(args.rollout_length):
            envs.step(pool[t % len(pool)])
        return args.rollout_length * num_envs

    try:
        rollout()
        return {"steps_per_s": bench.timed(rollout, args.seconds)}
    finally:
        envs.close()


def measure_policy_only(args: argparse.Namespace, num_envs: int) -> dict[str, Any]:
    envs = _native(args, num_envs)
    policy, params = _policy(envs.single_action_space, envs.single_observation_space, args.seed)
    act = bench.hand_act(policy, num_envs)
    obs, _ = envs.reset(seed=args.seed)
    envs.close()
    key = jax.random.key(args.seed)

    def rollout() -> int:
        nonlocal key
        for _ in range(args.rollout_length):
            action, _, key = act(params, obs, key)
            np.asarray(action)
        return args.rollout_length * num_envs

    rollout()
    return {"steps_per_s": bench.timed(rollout, args.seconds)}


SYSTEMS: dict[str, Measure] = {
    "jaxrunner": measure_jaxrunner,
    "hand_loop": measure_hand_loop,
    "raw": measure_raw,
    "policy_only": measure_policy_only,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repeats; median kept")
    parser.add_argument("--rollout-length", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()

    rows = []
    for num_envs in args.num_envs:
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in SYSTEMS}
        load = []
        for _ in range(args.rounds):  # interleaved, so drifts in machine load hit all alike
            load.append(os.getloadavg())
            for name, measure in SYSTEMS.items():
                rounds[name].append(measure(args, num_envs))
        row: dict[str, Any] = {"num_envs": num_envs, "loadavg_per_round": load}
        for name, results in rounds.items():
            row[f"{name}_steps_per_s"] = float(np.median([r["steps_per_s"] for r in results]))
            row[f"{name}_all_rounds"] = [r["steps_per_s"] for r in results]
        # Ratios per round (same round, same load), then their median.
        for ref in ("hand_loop", "raw"):
            ratios = [
                a["steps_per_s"] / b["steps_per_s"]
                for a, b in zip(rounds["jaxrunner"], rounds[ref])
            ]
            row[f"ratio_vs_{ref}"] = float(np.median(ratios))
            row[f"ratio_vs_{ref}_all_rounds"] = ratios
        row["jaxrunner_perf_ms_per_step"] = rounds["jaxrunner"][-1]["perf_ms_per_step"]
        rows.append(row)
        print(
            f"{num_envs:>5}: "
            + "  ".join(f"{k}={row[f'{k}_steps_per_s']:,.0f}" for k in SYSTEMS)
            + f"  vs hand {row['ratio_vs_hand_loop']:.2f}  vs raw {row['ratio_vs_raw']:.2f}",
            file=sys.stderr,
        )
    bench.write_report(
        "native_vector", args, rows, {**bench.machine_info(), "loadavg_end": os.getloadavg()}
    )


if __name__ == "__main__":
    main()
