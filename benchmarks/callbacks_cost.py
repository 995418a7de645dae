"""What callbacks cost: a runner whose callbacks override only ``on_episode_end``
against the same runner without callbacks (issue 32: "hooks a user does not override
cost nothing"; before, every step's observation, action and extras were copied for
the callbacks, 23% of HalfCheetah's steps/s).

Two runners (sync backend, the benchmark MLP, ``T = 256``) are alive at once and
sample in interleaved rounds; the figure is the ratio of the medians of env steps/s.

Usage::

    python benchmarks/callbacks_cost.py --out benchmarks/results/callbacks_cost_cpu.json
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time

import jax

import jaxrunner as jr
from jaxrunner._src import bench


class EpisodeReturns(jr.Callbacks):
    """A typical user hook: the return of every episode that ends."""

    def __init__(self) -> None:
        self.returns: list[float] = []

    def on_episode_end(self, runner, env_index, episode) -> None:
        self.returns.append(episode.total_return)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--rollout-length", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=2.0, help="per system per round")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = bench.parse_args(parser)
    runners = {}
    for name, callbacks in (("none", None), ("end_only", EpisodeReturns())):
        envs = jr.make_vec(args.env, args.num_envs)
        policy = bench.mlp_policy(envs.single_action_space)
        params = policy.init(jax.random.key(0), envs.single_observation_space)
        runners[name] = jr.EnvRunner(
            envs, policy, params, args.rollout_length, seed=0, callbacks=callbacks
        )
        runners[name].sample()  # compile
    rates: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(args.rounds):
        for name, runner in runners.items():
            steps, start = 0, time.perf_counter()
            while time.perf_counter() - start < args.seconds:
                steps += runner.sample().reward.size
            rates[name].append(steps / (time.perf_counter() - start))
    for runner in runners.values():
        runner.stop()
    medians = {name: statistics.median(r) for name, r in rates.items()}
    row = {
        "env": args.env,
        "num_envs": args.num_envs,
        **{f"{name}_steps_per_s": m for name, m in medians.items()},
        "end_only_vs_none": medians["end_only"] / medians["none"],
        "all_rounds": rates,
    }
    print(f"{args.env} x{args.num_envs}: end_only / none = {row['end_only_vs_none']:.3f}")
    bench.write_report("callbacks_cost", args, [row], bench.machine_info())


if __name__ == "__main__":
    main()
