"""What the benchmark scripts share: the ``--cpu-dispatch`` option and their JSON
report (the machine's details come from ``jaxrunner bench``'s ``machine_info``)."""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import subprocess
import sys
from typing import Any

from jaxrunner._src.bench.timing import machine_info
from jaxrunner._src.cpu_dispatch import use_async_cpu_dispatch, use_inline_cpu_dispatch


def parse_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """A benchmark script's command line: adds ``--cpu-dispatch {inline,async}``
    (default inline), parses, and sets JAX's CPU dispatch as told. Call it before any
    JAX computation."""
    parser.add_argument(
        "--cpu-dispatch",
        choices=("inline", "async"),
        default="inline",
        help="how JAX runs CPU computations: inline in the calling thread "
        "(jaxrunner.cpu_dispatch.use_inline_cpu_dispatch) or JAX's default asynchronous dispatch "
        "(default: %(default)s)",
    )
    args = parser.parse_args()
    if args.cpu_dispatch == "inline":
        use_inline_cpu_dispatch()
    else:
        use_async_cpu_dispatch()
    return args


def write_report(
    benchmark: str,
    args: argparse.Namespace,
    results: list[dict[str, Any]],
    machine: dict[str, Any] | None = None,
) -> None:
    """Prints a benchmark's JSON report (its name, date, command line, commit, options,
    ``machine`` or :func:`machine_info`, results) and writes it to ``args.out`` if set."""
    report = {
        "benchmark": benchmark,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "commit": source_commit(),
        "config": {**vars(args), "out": str(args.out)},
        "machine": machine_info() if machine is None else machine,
        "results": results,
    }
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


def source_commit() -> str | None:
    """The checkout's commit, ``+changes`` where its tracked files differ from it (None
    outside a git checkout): what the figures measured."""
    repo = pathlib.Path(__file__).resolve().parent.parent

    def git(*command: str) -> str:
        return subprocess.run(
            ["git", *command], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short=12", "HEAD")
        return commit + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return None
