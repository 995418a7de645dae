"""The multi-agent (group) sampler on a single-agent env against the lockstep sampler.

A single-agent env is the one-agent case of a policy group. This measures what sampling
it that way costs today: per width, CartPole-v1 on the sync backend, sampled by the
lockstep sampler as ``EnvRunner`` does, and by the group sampler through
:class:`OneGroup`, a view of the same vector env's steps as one group of one agent (no
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
from jaxrunner._src.backends.multi_agent.buffers import GroupBuffers, MultiAgentStep
from jaxrunner._src.core.agent_groups import AgentGroup
from jaxrunner._src.core.metrics import MetricsConfig, RunnerMetrics
from jaxrunner._src.core.seeds import env_seeds
from jaxrunner._src.samplers.lockstep import LockstepSampler
from jaxrunner._src.samplers.multi_agent import MultiAgentSampler
from jaxrunner._src.samplers.sampler import SamplerSetup
from jaxrunner.models import mlp_policy

PID = "default_policy"


def agent_axis(tree: Any) -> Any:
    return jax.tree.map(lambda x: x[:, None], tree)


class OneGroup:
    """A single-agent lockstep vector env as the group sampler sees a multi-agent one:
    one group of one agent that acts at every step."""

    def __init__(self, envs: Any) -> None:
        self.envs, self.num_envs = envs, envs.num_envs
        obs_space, action_space = envs.single_observation_space, envs.single_action_space
        self.groups = (AgentGroup(PID, ("agent",), obs_space, action_space),)
        self.possible_agents, self.turn_based = ("agent",), False
        self.capabilities = envs.capabilities
        n = self.num_envs
        self.acting = np.ones((n, 1), np.bool_)
        self.start = np.ones((n, 1), np.bool_)  # agent_start: the env's episode ended
        self.completed = np.ones((n, 1), np.bool_)
        self.zeros = np.zeros(n)
        self._views: dict[tuple[int, int], tuple[Any, dict[str, GroupBuffers]]] = {}

    def reset_batch(self, seeds: list[int]) -> MultiAgentStep:
        obs, infos = self.envs.reset_batch(seeds)
        n = self.num_envs
        flags = np.zeros((n, 1), np.bool_)
        buf = GroupBuffers.of(
            obs=agent_axis(obs), acting=self.acting, agent_start=self.start,
            completed=np.zeros((n, 1), np.bool_), reward=np.zeros((n, 1)), terminated=flags,
            truncated=flags, next_obs=agent_axis(obs),
        )  # fmt: skip
        return MultiAgentStep({PID: buf}, np.zeros(n, np.bool_), self.zeros, self.zeros, infos)

    def send(self, actions: list[Any], env_ids: slice | None = None) -> None:
        (action,) = actions  # [n, 1]: the one agent's column (CartPole's Discrete actions)
        self._rows, self._actions = env_ids, action[:, 0]

    def recv(self) -> MultiAgentStep:
        rows = self._rows
        out = self.envs.step_batch(self._actions, rows)
        lo, hi = (0, self.num_envs) if rows is None else (rows.start, rows.stop)
        done = np.logical_or(out.terminated, out.truncated, out=self.start[lo:hi, 0])
        base = out.reward if out.reward.base is None else out.reward.base
        views = self._views.get((lo, hi))
        if views is None or views[0] is not base:  # the env's buffers: views made once
            buf = GroupBuffers.of(
                obs=agent_axis(out.obs), acting=self.acting[lo:hi],
                agent_start=self.start[lo:hi], completed=self.completed[lo:hi],
                reward=out.reward[:, None], terminated=out.terminated[:, None],
                truncated=out.truncated[:, None], next_obs=agent_axis(out.next_obs),
            )  # fmt: skip
            views = self._views[lo, hi] = (base, {PID: buf})
        return MultiAgentStep(
            views[1], done, out.reward, self.zeros[lo:hi], out.infos, None, None, rows
        )


def build(sampler: str, num_envs: int, rollout_length: int) -> tuple[Any, Any]:
    envs = jr.make_vec("CartPole-v1", num_envs)
    policy = mlp_policy(envs.single_action_space)
    params = jax.device_put(policy.init(jax.random.key(0), envs.single_observation_space))
    seeds = env_seeds(0, num_envs)
    if sampler == "group":
        metrics = RunnerMetrics(MetricsConfig(), {PID: ("agent",)})
        setup = SamplerSetup({PID: policy}, {PID: params}, rollout_length, 0, metrics)
        view = OneGroup(envs)
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
