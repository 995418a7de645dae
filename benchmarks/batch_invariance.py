"""Batch invariance: grouping changes no action, and the policy is paid once per env.

The compiled policy step runs the policy in fixed chunks of
``policy_chunk_rows(...)`` rows (``jaxrunner._src.samplers.batch_invariance``), so a pipelining
group or a ready-first bucket computes its own envs' rows only, bitwise as in one
full batch. Two parts:

* ``exactness``: Pendulum-v1 (Box actions) with MLPs of several widths, sampled with
  1, 2 and 3 pipelining groups on the sync backend and ready-first on the process
  backend (``ProcessConfig(ready_first=True)``, 4 workers: buckets of a worker's
  envs); how far each is from the one-group run (the JSON should show zeros).
* ``policy_cost``: the compiled policy step's cost per env step at full width, with
  1 and 2 groups, for a 64-64 MLP on CartPole-v1 observations and a NatureCNN
  (Conv 32 8x8/4, 64 4x4/2, 64 3x3/1, Dense 512) on 84x84x4 uint8 observations.
  ``chunked`` is today's step (each group its own rows, in chunks); ``full_batch``
  the previous one (one unchunked call of every env's row per group, so 2 groups paid
  the policy twice). Medians of interleaved rounds of dispatch + collect per step;
  no envs are stepped. Timings on a shared machine are noisy: read the ratios.

Usage::

    python benchmarks/batch_invariance.py --out benchmarks/results/batch_invariance_cpu.json
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import statistics
from collections.abc import Callable
from typing import Any

import gymnasium
import jax
import numpy as np

import jaxrunner as jr
from jaxrunner._src import bench
from jaxrunner._src.bench.timing import us_per_call
from jaxrunner._src.samplers.batch_invariance import policy_chunk_rows
from jaxrunner._src.samplers.policy_step import CompiledPolicyStep, host_actor_state


def _trajectory_gap(reference: jr.Trajectory, other: jr.Trajectory) -> dict[str, Any]:
    return {
        "trajectories_equal": all(
            np.array_equal(a, b)
            for a, b in zip(jax.tree.leaves(reference), jax.tree.leaves(other), strict=True)
        ),
        "max_action_diff": float(np.abs(reference.action - other.action).max()),
        "max_log_prob_diff": float(
            np.abs(reference.extras["log_prob"] - other.extras["log_prob"]).max()
        ),
    }


def exactness(num_envs: int, width: int, steps: int) -> list[dict[str, Any]]:
    """Pendulum trajectories of every layout against one group on the sync backend."""
    hidden = (width, width)

    def sample(backend: str, **kwargs: Any) -> jr.Trajectory:
        config = jr.ProcessConfig(num_workers=4, ready_first=True) if backend else None
        envs = jr.make_vec("Pendulum-v1", num_envs, backend=backend or "sync", config=config)
        policy = bench.mlp_policy(envs.single_action_space, hidden=hidden)
        params = policy.init(jax.random.key(0), envs.single_observation_space)
        with jr.EnvRunner(envs, policy, params, steps, 0, **kwargs) as runner:
            return runner.sample()

    reference = sample("", num_splits=1)
    rows = []
    for layout, backend, kwargs in (
        ("2 groups", "", {"num_splits": 2}),
        ("3 groups", "", {"num_splits": 3}),
        ("ready-first, 4 workers", "process", {}),
    ):
        row = {"hidden": list(hidden), "layout": layout}
        row.update(_trajectory_gap(reference, sample(backend, **kwargs)))
        rows.append(row)
        print(row)
    return rows


def _policy_case(workload: str) -> tuple[jr.Policy, Any, gymnasium.Space, np.ndarray]:
    """The workload's policy, params, observation space and random observations."""
    rng = np.random.default_rng(0)
    if workload == "cartpole_mlp":
        obs_space = gymnasium.make("CartPole-v1").observation_space
        policy = bench.mlp_policy(gymnasium.spaces.Discrete(2))
        obs = rng.normal(size=(4096, 4)).astype(np.float32)
    else:
        obs_space = gymnasium.spaces.Box(0, 255, (84, 84, 4), np.uint8)
        policy = jr.models.nature_cnn_policy(obs_space, gymnasium.spaces.Discrete(4))
        obs = rng.integers(0, 256, (64, 84, 84, 4), dtype=np.uint8)
    return policy, policy.init(jax.random.key(0), obs_space), obs_space, obs


def _step_fn(
    policy: jr.Policy,
    params: Any,
    obs: np.ndarray,
    num_envs: int,
    groups: int,
    chunk_rows: int | None,
) -> Callable[[], None]:
    """One env step's policy calls: ``groups`` calls, each of its own rows (chunked) or
    of every env's row (the previous full-batch layout)."""
    state, _ = host_actor_state(policy, 0, num_envs, None, None)
    bounds = np.linspace(0, num_envs, groups + 1).round().astype(int)
    calls, stages = [], []
    for lo, hi in itertools.pairwise(bounds.tolist()):
        chunked = chunk_rows is not None
        size = (hi - lo) if chunked else num_envs
        call = CompiledPolicyStep(policy, params, state, size, obs[:size], chunk_rows=chunk_rows)
        stage = call.new_stage()
        own = slice(0, hi - lo) if chunked else slice(lo, hi)
        stage.obs[own] = obs[lo:hi]
        stage.env_index[own] = np.arange(lo, hi)
        calls.append(call)
        stages.append(stage)
    box = [state]

    def step() -> None:
        for call, stage in zip(calls, stages):
            pending, box[0] = call.dispatch(params, box[0], stage)
            call.collect(pending)

    return step


def policy_cost(workload: str, num_envs: int, rounds: int, seconds: float) -> dict[str, Any]:
    """Microseconds of policy per env step, medians of interleaved rounds."""
    policy, params, obs_space, obs = _policy_case(workload)
    obs = np.resize(obs, (num_envs, *obs.shape[1:]))
    chunk_rows = policy_chunk_rows(policy, params, obs_space, num_envs)
    steps = {
        f"{layout}, {groups} group{'s' * (groups > 1)}": _step_fn(
            policy, params, obs, num_envs, groups, chunk_rows if layout == "chunked" else None
        )
        for layout in ("full_batch", "chunked")
        for groups in (1, 2)
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():
        step()  # warm up
    for r in range(rounds):
        for name in list(steps)[:: 1 if r % 2 == 0 else -1]:
            times[name].append(us_per_call(steps[name], seconds))
    median = {name: statistics.median(values) for name, values in times.items()}
    row = {
        "workload": workload,
        "num_envs": num_envs,
        "chunk_rows": chunk_rows,
        "us_per_step_median": {k: round(v, 1) for k, v in median.items()},
        "us_per_step_rounds": {k: [round(v, 1) for v in vs] for k, vs in times.items()},
        "two_groups_over_one": {
            layout: round(median[f"{layout}, 2 groups"] / median[f"{layout}, 1 group"], 2)
            for layout in ("full_batch", "chunked")
        },
        "chunked_over_full_batch_1_group": round(
            median["chunked, 1 group"] / median["full_batch, 1 group"], 2
        ),
    }
    print(row)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=64, help="exactness width")
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 256, 512])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--mlp-envs", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--cnn-envs", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.5, help="per system and round")
    parser.add_argument("--skip-exactness", action="store_true")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = bench.parse_args(parser)

    results: list[dict[str, Any]] = []
    if not args.skip_exactness:
        for width in args.widths:
            for row in exactness(args.num_envs, width, args.steps):
                results.append({"part": "exactness", **row})
    for workload, widths in (("cartpole_mlp", args.mlp_envs), ("nature_cnn", args.cnn_envs)):
        for num_envs in widths:
            row = policy_cost(workload, num_envs, args.rounds, args.seconds)
            results.append({"part": "policy_cost", **row})
    bench.write_report("batch_invariance", args, results)


if __name__ == "__main__":
    main()
