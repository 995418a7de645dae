"""The process backend against its floor: one core stepping every sub-env, nothing else.

With one worker (the default on 2 cores below 256 sub-envs: the main process keeps a
CPU for the policy), every sub-env steps in that worker, so the backend cannot pass
one core's rate of stepping them. Measured in one run, in interleaved rounds
(``jaxrunner._src.bench.measure_width``):

* ``jaxrunner``: ``EnvRunner.sample()`` with ``backend="process"`` at its defaults, in
  its child;
* ``hand``: the recording hand loop over gymnasium's ``SyncVectorEnv`` (what a user
  writes), at JAX's defaults in its child;
* ``floor``: in this process, a bare Python loop calling each gymnasium sub-env's
  ``step`` with random actions (and ``reset`` where an episode ended): the least any
  loop stepping them on one core does.
* ``ceiling``: ``jaxrunner bench``'s policy-bound ceiling in jaxrunner's child, whose
  raw env step is here the process backend's ``step_batch`` of every sub-env with
  random actions: the worker stepping them all, one round trip per step, no policy.

Per width: ``process_vs_hand`` (the issue's ratio), ``floor_vs_hand`` (the most a
one-worker layout can reach against the hand loop), ``process_vs_floor`` (how close
the backend comes to its floor) and ``raw_vs_floor`` (how close the worker's stepping
alone comes to it): medians of per-round ratios, with their range.
CartPole-v1, the benchmark's 64-64 MLP, ``T = max(8, 2048 // num_envs)``.

Usage::

    python benchmarks/process_floor.py --out benchmarks/results/process_floor_cpu.json
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import statistics
from typing import Any

import gymnasium

from jaxrunner._src import bench


class BareLoop:
    """``num_envs`` gymnasium envs stepped in turn with random actions drawn ahead."""

    def __init__(self, env: str, num_envs: int, seed: int) -> None:
        self.envs = [gymnasium.make(env) for _ in range(num_envs)]
        for i, sub_env in enumerate(self.envs):
            sub_env.reset(seed=seed + i)
            sub_env.action_space.seed(seed + i)
        self.pool = [[e.action_space.sample() for e in self.envs] for _ in range(97)]
        self.cursor = 0
        self.rollout = bench.rollout_length(num_envs)

    def _rollout(self) -> int:
        for _ in range(self.rollout):
            for sub_env, action in zip(self.envs, self.pool[self.cursor]):
                _, _, terminated, truncated, _ = sub_env.step(action)
                if terminated or truncated:
                    sub_env.reset()
            self.cursor = (self.cursor + 1) % len(self.pool)
        return self.rollout * len(self.envs)

    def measure(self, seconds: float) -> dict[str, Any]:
        return {"steps_per_s": bench.timed(self._rollout, seconds)}

    def close(self) -> None:
        for sub_env in self.envs:
            sub_env.close()


def per_round(
    row: dict[str, Any], top: str, bottom: str, key: str = "steps_per_s"
) -> dict[str, float] | None:
    """The median and range of ``top``'s ``key`` over ``bottom``'s steps/s, round by
    round; None where either system failed (``row["errors"]`` says why)."""
    systems = row["systems"]
    if top not in systems or bottom not in systems:
        return None
    tops = [r[key] for r in systems[top]["all_rounds"]]
    ratios = [a / r["steps_per_s"] for a, r in zip(tops, systems[bottom]["all_rounds"])]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def describe(row: dict[str, Any]) -> str:
    parts = []
    for key in ("process_vs_hand", "floor_vs_hand", "process_vs_floor", "raw_vs_floor"):
        ratio = row[key]
        shown = (
            "failed"
            if ratio is None
            else (f"{ratio['median']:.2f} [{ratio['min']:.2f}-{ratio['max']:.2f}]")
        )
        parts.append(f"{key} {shown}")
    return "  ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--seconds", type=float, default=1.0, help="per system per round")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = bench.parse_args(parser)
    # The process backend against the sync hand loop, without peers shown for information.
    plan = dataclasses.replace(bench.PLANS["process"], extras=())
    rows = []
    with bench.Harness() as harness:
        for num_envs in args.num_envs:
            floor = BareLoop(args.env, num_envs, args.seed)
            try:
                row = bench.measure_width(
                    harness,
                    plan,
                    args.env,
                    num_envs,
                    rounds=args.rounds,
                    seconds=args.seconds,
                    seed=args.seed,
                    local={"floor": floor},
                )
            finally:
                floor.close()
            row["process_vs_hand"] = per_round(row, "jaxrunner", "hand")
            row["floor_vs_hand"] = per_round(row, "floor", "hand")
            row["process_vs_floor"] = per_round(row, "jaxrunner", "floor")
            row["raw_vs_floor"] = per_round(row, "ceiling", "floor", "raw_env_steps_per_s")
            rows.append(row)
            print(f"x{num_envs}: {describe(row)}", flush=True)
    bench.write_report(
        "process_floor", args, rows, {**bench.machine_info(), "autogroup": bench.autogroup()}
    )


if __name__ == "__main__":
    main()
