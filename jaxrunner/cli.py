"""The ``jaxrunner`` command."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator, Sequence

from jaxrunner import __version__
from jaxrunner.bench import add_cpu_dispatch_option
from jaxrunner.envs import BACKENDS
from jaxrunner.errors import DispatchConfigError
from jaxrunner.serve.command import add_serve_command


def _bench(args: argparse.Namespace) -> int:
    from jaxrunner import bench
    from jaxrunner.cpu_dispatch import use_async_cpu_dispatch, use_inline_cpu_dispatch

    switch = use_inline_cpu_dispatch if args.cpu_dispatch == "inline" else use_async_cpu_dispatch
    try:  # before any JAX computation
        switch()
    except DispatchConfigError as err:  # only when called in a process using JAX
        print(f"jaxrunner bench: {err}", file=sys.stderr)
        return 2

    config = bench.BenchConfig(
        env=args.env,
        widths=tuple(args.num_envs),
        backend=args.backend,
        seconds=args.seconds,
    )
    with _progress(len(bench.SYSTEMS) * len(config.widths)) as progress:
        rows = bench.run(config, progress)
    if args.json:
        report = {
            "config": {**dataclasses.asdict(config), "cpu_dispatch": args.cpu_dispatch},
            "machine": bench.machine_info(),
            "results": rows,
        }
        print(json.dumps(report, indent=2))
    else:
        print(
            f"{config.env}, backend={config.backend}, 64-64 tanh MLP, stochastic actions, "
            f"{args.cpu_dispatch} CPU dispatch"
        )
        print("steps/s; raw: the same vector env stepped with random actions, no policy;")
        print("bare loop: its sub-envs' env.step/env.reset only, nothing stacked;")
        print("workers: env worker processes (0: the sub-envs step in this process);")
        print("groups: the runner's pipelining groups")
        print(bench.format_table(rows))
    return 0


@contextlib.contextmanager
def _progress(total: int) -> Iterator[Callable[[str], None]]:
    """A progress callback for ``bench.run``: a tqdm bar on stderr where tqdm is
    installed (the bench extra), else one line per measurement."""
    try:
        from tqdm import tqdm
    except ImportError:
        done: list[str] = []

        def line(label: str) -> None:
            done.append(label)
            print(f"[{len(done)}/{total}] {label}", file=sys.stderr, flush=True)

        yield line
        return
    started: list[str] = []
    with tqdm(total=total, file=sys.stderr, unit="run") as bar:

        def progress(label: str) -> None:
            if started:
                bar.update(1)
            started.append(label)
            bar.set_description(label)

        yield progress
        bar.update(1)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxrunner", description="A JAX-accelerated vectorized sampler for RL."
    )
    parser.add_argument("--version", action="version", version=f"jaxrunner {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser(
        "bench",
        help="measure sampling throughput against raw env stepping",
        description="Steps/s of jaxrunner's EnvRunner (with a 64-64 tanh MLP policy) and of "
        "raw random-action stepping of the same sub-envs, at each width.",
    )
    bench.add_argument("--env", default="CartPole-v1", help="gymnasium id (default: %(default)s)")
    bench.add_argument(
        "--num-envs",
        type=int,
        nargs="+",
        default=[1, 8, 64, 256],
        metavar="N",
        help="widths to measure (default: 1 8 64 256)",
    )
    bench.add_argument(
        "--backend",
        default="sync",
        choices=BACKENDS,
        help="how the sub-envs are stepped, as make_vec(backend=...) (default: %(default)s)",
    )
    bench.add_argument(
        "--seconds", type=float, default=2.0, help="seconds per measurement (default: 2)"
    )
    add_cpu_dispatch_option(bench)
    bench.add_argument(
        "--json",
        action="store_true",
        help="print only a JSON report on stdout (default: a table)",
    )
    bench.set_defaults(func=_bench)
    add_serve_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
