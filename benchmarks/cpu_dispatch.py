"""JAX CPU dispatch, inline against asynchronous: what it does to a sampler.

JAX reads the dispatch mode once per process, so each measurement runs in a child
process; the two modes alternate round by round, so drifts in machine load hit both
alike. Per width and mode: ``EnvRunner.sample()`` steps/s and the hand-written loop's
(``jaxrunner._src.bench.RecordingHandLoop`` over gymnasium's SyncVectorEnv), CartPole-v1,
64-64 MLP, ``T = jaxrunner._src.bench.rollout_length(width)``.

Usage::

    python benchmarks/cpu_dispatch.py --out benchmarks/results/cpu_dispatch_cpu.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

import numpy as np

from jaxrunner._src import bench

CHILD = """
import json
import jaxrunner as jr
(jr.cpu_dispatch.use_inline_cpu_dispatch if {inline} else jr.cpu_dispatch.use_async_cpu_dispatch)()
from jaxrunner._src import bench
from jaxrunner._src.bench.systems import Spec, build

def steps_per_s(system, **options):
    spec = Spec(system=system, backend="sync", env="CartPole-v1", num_envs={num_envs},
                rollout_length=bench.rollout_length({num_envs}), **options)
    built = build(spec)
    try:
        return built.measure({seconds})["steps_per_s"]
    finally:
        built.close()

print(json.dumps({{
    "jaxrunner": steps_per_s("jaxrunner"),
    "hand_loop": steps_per_s("hand", reference="sync"),
    "mode": bench.machine_info()["jax_cpu_dispatch"],
}}))
"""


def measure(mode: str, num_envs: int, seconds: float) -> dict[str, float]:
    code = CHILD.format(inline=mode == "inline", seconds=seconds, num_envs=num_envs)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result.pop("mode") == mode, "the child ran in the other mode"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3, help="alternating repeats; median kept")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()

    rows = []
    for num_envs in args.num_envs:
        samples: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for mode in ("inline", "async"):
                for system, value in measure(mode, num_envs, args.seconds).items():
                    samples.setdefault(f"{system}_{mode}", []).append(value)
        row = {"num_envs": num_envs}
        row.update({f"{k}_steps_per_s": float(np.median(v)) for k, v in samples.items()})
        row.update({f"{k}_all_rounds": v for k, v in samples.items()})
        for system in ("jaxrunner", "hand_loop"):
            row[f"{system}_inline_over_async"] = (
                row[f"{system}_inline_steps_per_s"] / row[f"{system}_async_steps_per_s"]
            )
        rows.append(row)
        print(
            f"{num_envs:>5}: "
            + "; ".join(
                f"{system} inline {row[f'{system}_inline_steps_per_s']:,.0f} async "
                f"{row[f'{system}_async_steps_per_s']:,.0f} "
                f"(x{row[f'{system}_inline_over_async']:.2f})"
                for system in ("jaxrunner", "hand_loop")
            ),
            file=sys.stderr,
        )
    bench.write_report(
        "cpu_dispatch",
        args,
        rows,
        {k: v for k, v in bench.machine_info().items() if k != "jax_cpu_dispatch"},
    )


if __name__ == "__main__":
    main()
