"""What compact trajectories and buffer reuse save: memory, and the time of a sample.

Four runners on the same envs and policy (``--workload pong``: ALE/Pong-v5
preprocessed, uint8 84x84x4 stacked frames, NatureCNN; ``cartpole``: CartPole-v1, the
64-64 MLP; ``mpe``: the multi-agent MPE simple_spread_v3, 3 agents, one shared 64-64
MLP), sync backend, at ``--num-envs`` and ``--rollout-length``:

* ``dense``: the default, a new ``[T, B]`` buffer per sample with ``next_obs`` in full;
* ``compact``: ``EnvRunner(compact_next_obs=True)``;
* ``dense+release`` and ``compact+release``: the same, handing each sample back with
  ``runner.release(traj)`` once it is read, so the next one writes into its arrays.

Per system, in interleaved rounds (the order alternates): the bytes a trajectory
holds, the peak of memory newly allocated during ``sample()`` (``tracemalloc``, which
numpy reports its allocations to), the seconds per sample and env steps/s, and the
runner's own timer of observation handling (``obs_processing_ms``, its running
average per step: the copies of ``obs`` and ``next_obs`` into the buffers). Medians
over the rounds, ratios against ``dense``, with the machine's details and load average.

Usage::

    python benchmarks/trajectory_memory.py --workload pong --num-envs 16 \\
        --rollout-length 128 --rounds 5 --out benchmarks/results/trajectory_memory_pong_cpu.json
    python benchmarks/trajectory_memory.py --workload cartpole --num-envs 1 \\
        --rollout-length 1 --rounds 15 --timed-samples 300

``--timed-samples N`` times N samples per round (each released where the system
releases), outside ``tracemalloc``, before the one traced sample that gives the memory
figures: a sample of a few steps is too short to time alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import tracemalloc
from collections.abc import Callable

import jax
import numpy as np

import jaxrunner as jr
from jaxrunner._src.bench import machine_info
from jaxrunner._src.bench.workloads import get_workload

SEED = 0
SYSTEMS = ("dense", "compact", "dense+release", "compact+release")


def _nbytes(traj: jr.Trajectory) -> int:
    return sum(np.asarray(leaf).nbytes for leaf in jax.tree.leaves(traj))


def _simple_spread() -> object:
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=3, max_cycles=25)


def _system(
    name: str, workload: str, num_envs: int, length: int, timed: int = 0
) -> Callable[[], dict]:
    if workload == "mpe":
        envs = jr.make_vec(_simple_spread, num_envs)
        (group,) = envs.groups
        policy = jr.models.mlp_policy(group.action_space)
        params = policy.init(jax.random.key(SEED), group.observation_space)
    else:
        spec = get_workload(workload)
        envs = jr.make_vec(spec.make, num_envs)
        policy = spec.policy(envs.single_observation_space, envs.single_action_space)
        params = policy.init(jax.random.key(SEED), envs.single_observation_space)
    runner = jr.EnvRunner(
        envs, policy, params, length, SEED, compact_next_obs=name.startswith("compact")
    )
    release = name.endswith("+release")

    def sample() -> dict:
        seconds = None
        if timed:  # short samples: timed over many, outside tracemalloc
            clock = time.perf_counter()
            for _ in range(timed):
                traj = runner.sample()
                if release:
                    runner.release(traj)
            seconds = (time.perf_counter() - clock) / timed
        tracemalloc.start()
        clock = time.perf_counter()
        traj = runner.sample()
        traced = time.perf_counter() - clock
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        seconds = traced if seconds is None else seconds
        metrics = runner.get_metrics()
        result = {
            "seconds": seconds,
            "steps_per_s": num_envs * length / seconds,  # env steps
            "trajectory_bytes": _nbytes(traj),
            "peak_new_bytes": peak,
            "obs_processing_ms": metrics["perf"]["obs_processing_ms"],
        }
        if release:
            runner.release(traj)
        return result

    return sample


def measure(workload: str, num_envs: int, length: int, rounds: int, timed: int = 0) -> dict:
    systems = {name: _system(name, workload, num_envs, length, timed) for name in SYSTEMS}
    for run in systems.values():  # compile, warm up, and hand out the first buffers
        run()
        run()
    results: dict[str, list[dict]] = {name: [] for name in systems}
    for k in range(rounds):
        for name in SYSTEMS if k % 2 == 0 else tuple(reversed(SYSTEMS)):
            results[name].append(systems[name]())
    medians = {
        name: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        for name, rows in results.items()
    }
    base = medians["dense"]
    ratios = {
        name: {
            "trajectory_bytes": m["trajectory_bytes"] / base["trajectory_bytes"],
            "peak_new_bytes": m["peak_new_bytes"] / base["peak_new_bytes"],
            "steps_per_s": m["steps_per_s"] / base["steps_per_s"],
        }
        for name, m in medians.items()
    }
    return {"rounds": results, "medians": medians, "vs_dense": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="pong", choices=("pong", "cartpole", "mpe"))
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--rollout-length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--timed-samples",
        type=int,
        default=0,
        help="time this many samples per round, outside tracemalloc (0: the one traced "
        "sample); for short rollouts, where one sample is too short to time",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    load_before = os.getloadavg()
    result = measure(
        args.workload, args.num_envs, args.rollout_length, args.rounds, args.timed_samples
    )
    report = {
        "benchmark": "trajectory_memory",
        "command": "python benchmarks/trajectory_memory.py "
        f"--workload {args.workload} --num-envs {args.num_envs} "
        f"--rollout-length {args.rollout_length} --rounds {args.rounds}"
        + (f" --timed-samples {args.timed_samples}" if args.timed_samples else ""),
        "machine": machine_info(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        **result,
    }
    print(f"{args.workload}, {args.num_envs} envs, T = {args.rollout_length}:")
    print(f"{'system':<17}{'traj MiB':>10}{'peak MiB':>10}{'s/sample':>10}{'steps/s':>10}")
    for name, m in result["medians"].items():
        print(
            f"{name:<17}{m['trajectory_bytes'] / 2**20:>10.1f}{m['peak_new_bytes'] / 2**20:>10.1f}"
            f"{m['seconds']:>10.3f}{m['steps_per_s']:>10.0f}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
