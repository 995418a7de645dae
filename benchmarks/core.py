"""Core benchmark: ``jaxrunner bench`` with the settings the recorded figures use.

The same measurement as the command (``jaxrunner._src.bench.run``): per width, jaxrunner's
``EnvRunner.sample()`` at its defaults against the recording hand loop a user writes
(``jaxrunner._src.bench.RecordingHandLoop``: the same jitted 64-64 tanh MLP, ``np.asarray``,
``[T, B]`` numpy buffers, JAX at its defaults in its own process), the policy-bound
ceiling and where a jaxrunner step goes; interleaved rounds, medians with their
spread, every round kept in the JSON with the machine's details.

Usage::

    python benchmarks/core.py --out benchmarks/results/core_sync_cpu.json   # ~2 min
    python benchmarks/core.py --num-envs 1 --rounds 1 --seconds 0.2         # smoke test
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from jaxrunner._src import bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--backend", nargs="+", default=["sync"], choices=list(bench.PLANS))
    parser.add_argument("--seconds", type=float, default=2.0, help="per system per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; median kept")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()
    config = bench.BenchConfig(
        env=args.env,
        widths=tuple(args.num_envs),
        backends=tuple(args.backend),
        seconds=args.seconds,
        rounds=args.rounds,
    )
    report = bench.run(config, lambda message: print(message, file=sys.stderr, flush=True))
    report["benchmark"] = "core"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(bench.format_report(report))


if __name__ == "__main__":
    main()
