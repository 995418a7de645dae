"""The ``jaxrunner`` command."""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

from jaxrunner import __version__
from jaxrunner._src import bench
from jaxrunner._src.arg_checks import check_not_folder
from jaxrunner._src.bench import plot
from jaxrunner._src.bench.workloads import WORKLOADS
from jaxrunner._src.services.serve.command import add_serve_command
from jaxrunner.errors import InvalidArgumentError, MissingDependencyError

DEFAULT_ENV = "CartPole-v1"


def _bench(args: argparse.Namespace) -> int:
    env = DEFAULT_ENV if args.env is None else args.env
    plans = bench.plans_for(env)  # a PettingZoo env has plans of its own
    # A flag left out keeps the config's default (a workload's own with --workload).
    options: dict[str, Any] = {"seconds": args.seconds, "rounds": args.rounds}
    if args.num_envs is not None:
        options["widths"] = tuple(args.num_envs)
    if args.backend is not None:
        options["backends"] = tuple(plans) if args.backend == "all" else (args.backend,)
    try:
        if args.workload is not None:
            if args.env is not None:  # (given, even as the default's value)
                raise InvalidArgumentError(
                    f"--workload {args.workload} runs its own env; leave --env out."
                )
            config = bench.BenchConfig.for_workload(args.workload, **options)
        else:
            config = bench.BenchConfig(env=env, **options)
    except InvalidArgumentError as err:  # before anything starts: name the flag
        flags = "--num-envs (ints >= 1), --seconds (> 0) or --rounds (>= 1)"
        if args.backend not in (*plans, "all", None):
            flags = f"--backend ({', '.join(plans)} or all for this env)"
        if args.workload is not None:
            flags += ", --backend (a host backend) or --env (none with --workload)"
        print(f"jaxrunner bench: {err} Check {flags}.", file=sys.stderr)
        return 2
    outputs = (("--out", args.out, "bench.json"), ("--plot", args.plot, "bench.png"))
    try:  # before a minute of measuring, not after
        bench.check_env_id(config, "--env")
        for flag, path, example in outputs:
            if path is not None:
                check_not_folder(path, f"{flag} {path}", example)
        if args.plot:
            plot.require_matplotlib()
    except (InvalidArgumentError, MissingDependencyError) as err:
        print(f"jaxrunner bench: {err}", file=sys.stderr)
        return 2
    if args.plot and not args.plot.suffix:  # what matplotlib would write (and say so)
        args.plot = args.plot.with_suffix(".png")
    started = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:5.0f} s] {message}", file=sys.stderr, flush=True)

    report = bench.run(config, log)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(bench.format_report(report))
    if args.plot:  # after the figures are out: a failed plot loses none of them
        plot.plot(report["results"], plot.title(report), args.plot)
        log(f"wrote {args.plot}")
    complete = report["results"] and all("hand" in row["ratios"] for row in report["results"])
    return 0 if complete else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxrunner", description="A JAX-accelerated vectorized sampler for RL."
    )
    parser.add_argument("--version", action="version", version=f"jaxrunner {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    bench_command = commands.add_parser(
        "bench",
        help="is jaxrunner faster than the loop you would write by hand?",
        description="Env steps/s of jaxrunner's EnvRunner.sample() (single- or "
        "multi-agent) at its defaults against "
        "the recording hand loop a user writes (the same jitted 64-64 tanh MLP, np.asarray, "
        "[T, B] numpy buffers, JAX at its defaults), each in its own process, in interleaved "
        "rounds; the policy-bound ceiling; where a jaxrunner step goes; a one-line verdict.",
    )
    bench_command.add_argument(
        "--env",
        help="gymnasium id, or a PettingZoo parallel env as module:name (e.g. "
        "mpe2:simple_spread_v3: EnvRunner against the hand-written PettingZoo loop, "
        f"backends sync and process) (default: {DEFAULT_ENV})",
    )
    bench_command.add_argument(
        "--num-envs",
        type=int,
        nargs="+",
        metavar="N",
        help="widths to measure (default: 1 8 64 256; a workload's own with --workload)",
    )
    bench_command.add_argument(
        "--backend",
        choices=(*bench.PLANS, "all"),
        help="jaxrunner backend (make_vec(backend=...); auto: EnvRunner.from_env's choice "
        "of sync or process, measured with the policy and printed per width; jax: gymnax "
        "in a JaxVectorEnv), or "
        "all: every installed one, each at the widths that fit it (default: sync; sync and "
        "process with --workload)",
    )
    bench_command.add_argument(
        "--workload",
        choices=tuple(WORKLOADS),
        help="a real workload instead of --env: cartpole (CartPole-v1, 64-64 MLP; 1 8 64 "
        "256 envs), pong (ALE/Pong-v5 preprocessed, 4 frames stacked, NatureCNN; 8 32 envs; "
        "pip install 'jaxrunner[atari]'), halfcheetah (HalfCheetah-v5, 256-256 Gaussian MLP; "
        "8 32 envs; pip install 'jaxrunner[mujoco]'), every system with the same envs and "
        "policy (default: none)",
    )
    bench_command.add_argument(
        "--seconds",
        type=float,
        default=1.0,
        help="seconds per system per round (default: %(default)s)",
    )
    bench_command.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds per width (default: %(default)s)"
    )
    bench_command.add_argument(
        "--json",
        action="store_true",
        help="print only the JSON report on stdout (default: tables and a verdict)",
    )
    bench_command.add_argument(
        "--out",
        type=pathlib.Path,
        help="also write the JSON report (every round, the machine) to this file (default: none)",
    )
    bench_command.add_argument(
        "--plot",
        type=pathlib.Path,
        metavar="PNG",
        help="also draw env steps/s against the number of envs, a line per system, into this "
        "PNG (needs matplotlib: pip install 'jaxrunner[plot]') (default: none)",
    )
    bench_command.set_defaults(func=_bench)
    add_serve_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
