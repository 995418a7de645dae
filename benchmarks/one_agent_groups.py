"""What would a single-agent env cost through the multi-agent block?

Issue 40's one step model folds the gymnasium block into the multi-agent one. This
times the same runner, policy and CartPole envs two ways, in interleaved rounds in one
process: the dense single-agent block (``make_vec("CartPole-v1", n)``) and the
multi-agent block over each env wrapped as a one-agent PettingZoo parallel env (its
dicts, agent slots and masks). The ratio is what the merge would cost without a dense
fast path. Env steps/s, medians over rounds of about ``--seconds`` each.

Usage (needs the ``multiagent`` extra: PettingZoo)::

    python benchmarks/one_agent_groups.py --widths 1 8 64 --rounds 7 \
        --out benchmarks/results/one_agent_groups_cpu.json
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time
from typing import Any

import gymnasium
import jax
import numpy as np
from pettingzoo import ParallelEnv
from script_report import parse_args, write_report

import jaxrunner as jr
from jaxrunner.models import mlp_policy


class OneAgentParallel(ParallelEnv):
    """CartPole as a PettingZoo parallel env of one agent."""

    metadata = {"name": "one_agent_cartpole"}  # noqa: RUF012  # PettingZoo's attribute

    def __init__(self) -> None:
        self.env = gymnasium.make("CartPole-v1")
        self.possible_agents = ["agent"]
        self.agents: list[str] = []

    def observation_space(self, agent: str) -> gymnasium.Space:
        return self.env.observation_space

    def action_space(self, agent: str) -> gymnasium.Space:
        return self.env.action_space

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        obs, info = self.env.reset(seed=seed, options=options)
        self.agents = ["agent"]
        return {"agent": obs}, {"agent": info}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        obs, reward, term, trunc, info = self.env.step(actions["agent"])
        if term or trunc:
            self.agents = []
        a = "agent"
        return {a: obs}, {a: float(reward)}, {a: term}, {a: trunc}, {a: info}


def measure(num_envs: int, backend: str, rounds: int, seconds: float) -> dict[str, Any]:
    length = max(8, 2048 // num_envs)
    policy = mlp_policy(gymnasium.spaces.Discrete(2))
    params = policy.init(jax.random.key(0), gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32))
    makers = {
        "dense": lambda: jr.make_vec("CartPole-v1", num_envs, backend),
        "one_agent_groups": lambda: jr.make_vec(OneAgentParallel, num_envs, backend),
    }
    runners = {
        name: jr.EnvRunner(make(), policy, params, length, seed=0) for name, make in makers.items()
    }
    try:
        for runner in runners.values():  # compile and warm up
            runner.sample()
            runner.sample()
        rates: dict[str, list[float]] = {name: [] for name in runners}
        for k in range(rounds):
            for name in list(runners) if k % 2 == 0 else list(reversed(runners)):
                start, steps = time.perf_counter(), 0
                while time.perf_counter() - start < seconds:
                    runners[name].sample()
                    steps += length * num_envs
                rates[name].append(steps / (time.perf_counter() - start))
    finally:
        for runner in runners.values():
            runner.close()
            runner.envs.close()
    med = {name: statistics.median(r) for name, r in rates.items()}
    per_round = [g / d for g, d in zip(rates["one_agent_groups"], rates["dense"])]
    return {
        "num_envs": num_envs,
        "backend": backend,
        "rollout_length": length,
        "median_steps_per_s": med,
        "ratio": med["one_agent_groups"] / med["dense"],
        "ratio_range": [min(per_round), max(per_round)],
        "rounds": rates,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--backend", default="sync", choices=["sync", "process"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=1.0, help="per system per round")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parse_args(parser)
    results = []
    for n in args.widths:
        row = measure(n, args.backend, args.rounds, args.seconds)
        med = row["median_steps_per_s"]
        print(
            f"{args.backend} {n} envs: dense {med['dense']:,.0f}, through the multi-agent "
            f"block {med['one_agent_groups']:,.0f} env steps/s: {row['ratio']:.2f}x "
            f"[{row['ratio_range'][0]:.2f}-{row['ratio_range'][1]:.2f}]",
            flush=True,
        )
        results.append(row)
    write_report("one_agent_groups", args, results)


if __name__ == "__main__":
    main()
