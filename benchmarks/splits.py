"""Pipelining splits: does the default ``num_splits`` pay on this machine?

``EnvRunner(num_splits=None)`` (the default: one split on an accelerator; on a CPU
host two from 256 envs with asynchronous dispatch, else one, and the process backend's
own two from 16 sub-envs) against ``num_splits=1`` and
``num_splits=2``, and the recording hand loop over gymnasium's ``SyncVectorEnv``
(SAME_STEP autoreset, one policy call per step), on a workload of ``jaxrunner bench``
(its envs and jitted policy), the sync or process backend; or, with ``--env``, a
PettingZoo parallel env with the benchmark MLP per policy group, against the PettingZoo
hand loop (a list of parallel envs stepped one by one). Everything runs in this
process, built once per width and timed in interleaved rounds; ratios of medians.

Written for the GPU rows of the speed issue: on an H200 (16 cores) one split beat two
in every row, sync and process, 8 to 256 envs (``results/splits_*_gpu.json``), which
set the accelerator default.

Usage::

    python benchmarks/splits.py --workload cartpole --widths 8 64 256 \\
        --out benchmarks/results/splits_cartpole_gpu.json
    python benchmarks/splits.py --env mpe2:simple_spread_v3 --backend process --widths 8 16
    python benchmarks/splits.py --widths 8 --rounds 1 --seconds 0.2   # smoke test
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
from typing import Any

from script_report import parse_args, write_report

from jaxrunner import EnvRunner
from jaxrunner._src.bench.hand_loop import RecordingHandLoop, reference_envs
from jaxrunner._src.bench.multi_agent import MultiAgentHandLoop, env_factory
from jaxrunner._src.bench.systems import Spec, build_runner
from jaxrunner._src.bench.timing import timed
from jaxrunner._src.bench.workloads import WORKLOADS, get_workload

SPLITS: tuple[int | None, ...] = (None, 1, 2)
"""The runners timed at each width: the default, then one and two splits."""


def _label(num_splits: int | None) -> str:
    return "default" if num_splits is None else f"splits={num_splits}"


def _runner(args: argparse.Namespace, width: int, length: int, num_splits: int | None) -> Any:
    """A runner at ``width`` of the workload's envs and policy, or of the PettingZoo env
    ``--env`` with the benchmark MLP per policy group."""
    spec = Spec(
        system="jaxrunner", backend=args.backend,
        env=args.env or get_workload(args.workload).env_id, num_envs=width,
        rollout_length=length, seed=args.seed, multi_agent=bool(args.env),
        workload=None if args.env else args.workload, num_splits=num_splits,
    )  # fmt: skip
    return build_runner(spec)


def measure_width(args: argparse.Namespace, width: int) -> dict[str, Any]:
    workload = get_workload(args.workload)
    length = args.rollout_length if args.env else workload.rollout_length(width)
    systems: dict[str, Any] = {}
    closers: list[Any] = []
    resolved: dict[str, int] = {}
    try:
        for num_splits in (s for s in SPLITS if s is None or s <= width):
            runner = _runner(args, width, length, num_splits)
            closers.append(runner.stop)
            label = _label(num_splits)
            resolved[label] = runner.num_splits

            def sample(runner: EnvRunner = runner) -> int:
                trajectory = runner.sample()
                return trajectory.num_steps * trajectory.num_envs  # env steps

            systems[label] = sample
        if args.env:
            loop = MultiAgentHandLoop(env_factory(args.env), width, length, args.seed)
            closers.append(loop.close)
            systems["hand"] = loop.rollout
        else:
            hand_envs, _ = reference_envs("sync", workload.env_id, width, args.seed, args.workload)
            closers.append(hand_envs.close)
            policy = workload.policy(
                hand_envs.single_observation_space, hand_envs.single_action_space
            )
            hand = RecordingHandLoop(hand_envs, length, args.seed, policy=policy)
            systems["hand"] = hand.rollout
        for run in systems.values():
            run()  # warm-up: compiles, first resets
        rounds: dict[str, list[float]] = {name: [] for name in systems}
        for _ in range(args.rounds):
            for name, run in systems.items():
                rounds[name].append(timed(run, args.seconds))
    finally:
        for close in reversed(closers):
            close()
    medians = {name: statistics.median(rates) for name, rates in rounds.items()}
    return {
        "num_envs": width,
        "rollout_length": length,
        "num_splits": resolved,
        "rounds": rounds,
        "median_steps_per_s": medians,
        "vs_hand": {n: m / medians["hand"] for n, m in medians.items() if n != "hand"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=list(WORKLOADS), default="cartpole")
    parser.add_argument(
        "--env",
        default=None,
        help="a PettingZoo parallel env, module:name (e.g. mpe2:simple_spread_v3), with "
        "the benchmark MLP per policy group and the PettingZoo hand loop, in place of the workload",
    )
    parser.add_argument("--rollout-length", type=int, default=64, help="with --env")
    parser.add_argument("--backend", choices=("sync", "process"), default="sync")
    parser.add_argument("--widths", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parse_args(parser)
    results = [measure_width(args, width) for width in args.widths]
    write_report("splits", args, results)


if __name__ == "__main__":
    main()
