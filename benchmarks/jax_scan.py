"""Pure-JAX path: EnvRunner on a JaxVectorEnv against a hand-written gymnax lax.scan.

Systems, same env (gymnax CartPole-v1), same policy (``jaxrunner._src.bench.mlp_policy``,
a 64x64 tanh MLP sampling its actions), same rollout length, one process:

* ``jaxrunner``: ``EnvRunner(JaxVectorEnv(env, params, B), ...).sample()``: the whole
  rollout as one compiled ``lax.scan`` (true final observations, fresh resets,
  episode ids and steps, metrics fetched once per sample).
* ``hand_scan`` (``jaxrunner._src.bench.build_hand_scan``): what a user would write with
  gymnax: one jitted ``lax.scan`` over ``vmap(env.step)`` (gymnax's auto-resetting
  step, keys from ``split``), storing the same transition fields (obs, action,
  reward, terminated, truncated, the final observation from
  ``info["final_observation"]``, log-prob), but no episode ids, step indices or
  episode statistics.

Each system is built (and compiled) once per width. Within a round the systems take
turns, one sample each, so that drifts in machine load hit both alike; medians over
rounds and per-round ratios are kept, per wall second and per CPU second of this
process (the latter less sensitive to other processes on a shared machine).

Usage::

    python benchmarks/jax_scan.py                      # widths 64 256 1024 4096
    python benchmarks/jax_scan.py --seconds 3 --rounds 5 --out benchmarks/results/jax_scan_cpu.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import pathlib
import time
from collections.abc import Callable

import gymnax
import jax
import numpy as np

import jaxrunner as jr
from jaxrunner._src import bench


def build_jaxrunner(num_envs: int, rollout_length: int, seed: int) -> Callable[[], int]:
    env, env_params = gymnax.make("CartPole-v1")
    venv = jr.JaxVectorEnv(env, env_params, num_envs)
    policy = bench.mlp_policy(venv.single_action_space)
    params = policy.init(jax.random.key(seed), venv.single_observation_space)
    runner = jr.EnvRunner(venv, policy, params, rollout_length, seed)

    def run() -> int:
        jax.block_until_ready(runner.sample())
        return rollout_length * num_envs

    return run


SYSTEMS = {"jaxrunner": build_jaxrunner, "hand_scan": bench.build_hand_scan}


def measure_round(runs: dict[str, Callable[[], int]], seconds: float) -> dict[str, dict]:
    """Calls the systems in alternation (one sample each, in turn) until each has run
    ``seconds``: load changes within the round hit all systems alike. Returns steps per
    wall second and per CPU second of this process (all threads): the CPU figure is
    less sensitive to other processes competing for the cores."""
    wall = dict.fromkeys(runs, 0.0)
    cpu = dict.fromkeys(runs, 0.0)
    steps = dict.fromkeys(runs, 0)
    while min(wall.values()) < seconds:
        for name, run in runs.items():
            wall_start, cpu_start = time.perf_counter(), time.process_time()
            steps[name] += run()
            wall[name] += time.perf_counter() - wall_start
            cpu[name] += time.process_time() - cpu_start
    return {
        "wall": {k: steps[k] / wall[k] for k in runs},
        "cpu": {k: steps[k] / cpu[k] for k in runs},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--rollout-length", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved repeats; median kept")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()

    rows = []
    for num_envs in args.num_envs:
        runs = {
            name: build(num_envs, args.rollout_length, args.seed) for name, build in SYSTEMS.items()
        }
        for run in runs.values():
            run()  # warm-up: compile, first dispatch
        rounds = [measure_round(runs, args.seconds) for _ in range(args.rounds)]
        row: dict = {"num_envs": num_envs, "loadavg": os.getloadavg()}
        for clock in ("wall", "cpu"):
            for name in runs:
                values = [r[clock][name] for r in rounds]
                row[f"{name}_steps_per_{clock}_s"] = float(np.median(values))
                row[f"{name}_{clock}_all_rounds"] = values
            ratios = [r[clock]["jaxrunner"] / r[clock]["hand_scan"] for r in rounds]
            row[f"ratio_{clock}_median_of_rounds"] = float(np.median(ratios))
            row[f"ratio_{clock}_all_rounds"] = ratios
        rows.append(row)
        print(
            f"{num_envs:>5}: wall jaxrunner={row['jaxrunner_steps_per_wall_s']:,.0f} "
            f"hand_scan={row['hand_scan_steps_per_wall_s']:,.0f} "
            f"ratio={row['ratio_wall_median_of_rounds']:.3f} | cpu "
            f"jaxrunner={row['jaxrunner_steps_per_cpu_s']:,.0f} "
            f"hand_scan={row['hand_scan_steps_per_cpu_s']:,.0f} "
            f"ratio={row['ratio_cpu_median_of_rounds']:.3f} | load {os.getloadavg()[0]:.1f}",
            flush=True,
        )

    bench.write_report(
        "jax_scan",
        args,
        rows,
        {
            **bench.machine_info(),
            "gymnax": importlib.metadata.version("gymnax"),
            "loadavg_end": os.getloadavg(),
        },
    )


if __name__ == "__main__":
    main()
