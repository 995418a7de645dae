"""The multi-agent (group) sampler on a single-agent env against the lockstep sampler.

A single-agent env is the one-agent case of a policy group. This measures what sampling
it that way costs today: per width, CartPole-v1 on the sync backend, sampled by the
lockstep sampler as ``EnvRunner`` does, and by the group sampler through
``OneAgentSteps``, a view of the same vector env's steps as one group of one agent (no
copies: its arrays are the env's, with an agent axis of 1). Both with the benchmark
MLP and the same seed, timed in interleaved blocks in one process. Reports microseconds
per vector step of each, the median of the per-block ratios (group time over lockstep
time), and whether the two give the same observations, actions, rewards and
log-probabilities, bit for bit.

Usage::

    python benchmarks/one_group_sampler.py --num-envs 1 8 64 256 \
        --out benchmarks/results/one_group_sampler_cpu.json
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time
from typing import Any

import jax
import numpy as np
from script_report import parse_args, write_report

import jaxrunner as jr
from jaxrunner._src.backends.one_agent import OneAgentSteps
from jaxrunner._src.core.metrics import MetricsConfig, RunnerMetrics
from jaxrunner._src.core.seeds import env_seeds
from jaxrunner._src.samplers.lockstep import LockstepSampler
from jaxrunner._src.samplers.multi_agent import MultiAgentSampler
from jaxrunner._src.samplers.sampler import SamplerSetup
from jaxrunner.models import mlp_policy

PID = "default_policy"


def build(sampler: str, num_envs: int, rollout_length: int) -> tuple[Any, Any]:
    envs = jr.make_vec("CartPole-v1", num_envs)
    policy = mlp_policy(envs.single_action_space)
    params = jax.device_put(policy.init(jax.random.key(0), envs.single_observation_space))
    seeds = env_seeds(0, num_envs)
    if sampler == "group":
        metrics = RunnerMetrics(MetricsConfig(), {PID: ("agent",)})
        setup = SamplerSetup({PID: policy}, {PID: params}, rollout_length, 0, metrics)
        view = OneAgentSteps(envs)
        return MultiAgentSampler(view, view.reset_batch(seeds), setup), {PID: params}
    setup = SamplerSetup(
        {PID: policy}, {PID: params}, rollout_length, 0, RunnerMetrics(MetricsConfig())
    )
    obs, _ = envs.reset_batch(seeds)
    return LockstepSampler(envs, obs, setup), params


def same_bits(lockstep: Any, group: Any) -> bool:
    """The first sample of each: the same observations, actions, rewards, flags and
    log-probabilities."""
    g = group.groups[PID]
    pairs = [
        (lockstep.obs, g.obs[:, :, 0]),
        (lockstep.action, g.action[:, :, 0]),
        (lockstep.reward, g.reward[:, :, 0]),
        (lockstep.terminated, g.terminated[:, :, 0]),
        (lockstep.truncated, g.truncated[:, :, 0]),
        (lockstep.extras["log_prob"], g.extras["log_prob"][:, :, 0]),
    ]
    return all(np.array_equal(a, b) for a, b in pairs)


def measure(num_envs: int, rollout_length: int, blocks: int) -> dict[str, Any]:
    samplers = {name: build(name, num_envs, rollout_length) for name in ("lockstep", "group")}
    first = {name: s.sample(p) for name, (s, p) in samplers.items()}
    identical = same_bits(first["lockstep"], first["group"])
    samples = max(1, 4096 // (num_envs * rollout_length))
    us: dict[str, list[float]] = {name: [] for name in samplers}
    for block in range(blocks):
        order = list(samplers) if block % 2 == 0 else list(reversed(samplers))
        for name in order:
            sampler, params = samplers[name]
            start = time.perf_counter()
            for _ in range(samples):
                sampler.release(sampler.sample(params))
            us[name].append((time.perf_counter() - start) / (samples * rollout_length) * 1e6)
    ratios = [g / s for g, s in zip(us["group"], us["lockstep"])]
    return {
        "num_envs": num_envs,
        "us_per_vector_step": {name: statistics.median(v) for name, v in us.items()},
        "group_over_lockstep_time_median": statistics.median(ratios),
        "rounds": us,
        "identical_trajectories": identical,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--rollout-length", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parse_args(parser)
    results = []
    for num_envs in args.num_envs:
        row = measure(num_envs, args.rollout_length, args.blocks)
        print(
            f"{num_envs} envs: lockstep {row['us_per_vector_step']['lockstep']:.1f} us/step, "
            f"group {row['us_per_vector_step']['group']:.1f}, group/lockstep time "
            f"{row['group_over_lockstep_time_median']:.3f}, identical "
            f"{row['identical_trajectories']}",
            flush=True,
        )
        results.append(row)
    write_report("one_group_sampler", args, results)


if __name__ == "__main__":
    main()
