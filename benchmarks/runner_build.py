"""How long building an ``EnvRunner`` takes, at a git revision against the working tree.

What a notebook user waits for between editing a cell and seeing a sample: the runner's
build (its policy step traced, lowered and compiled) and its first ``sample()``, in a
fresh process (the first build), and again in that process with the policy made again
(a rebuild, as when the cell runs again: only what is not kept between runners). Each
package builds in its own child process, the two alternating over ``--rounds``; JAX's
persistent compile cache is off, as it is by default, unless ``--compile-cache`` (a
fresh directory, warmed by one untimed child per package). Per package: the median first
build and the median of each child's median rebuild, in seconds; ``speedup``: base / new.

Usage::

    python benchmarks/runner_build.py --base HEAD~3
    python benchmarks/runner_build.py --base HEAD~3 --compile-cache --out results/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np
from script_report import parse_args, write_report

HERE = pathlib.Path(__file__).resolve().parent


def child(package: str, base_dir: str, env: str, num_envs: int, rebuilds: int) -> dict:
    """One process's first build and its median rebuild, in seconds."""
    import importlib

    if package == "base":
        sys.path.insert(0, base_dir)
        os.environ["PYTHONPATH"] = os.pathsep.join([base_dir, os.environ.get("PYTHONPATH", "")])
    jr = importlib.import_module("jaxrunner_base" if package == "base" else "jaxrunner")
    import jax

    envs = jr.make_vec(env, num_envs, "sync")
    times = []
    for i in range(1 + rebuilds):
        clock = time.perf_counter()
        policy = jr.models.mlp_policy(envs.single_action_space)  # as a cell run again
        params = policy.init(jax.random.key(i), envs.single_observation_space)
        runner = jr.EnvRunner(envs, policy, params, rollout_length=16, seed=i)
        runner.sample()
        times.append(time.perf_counter() - clock)
        runner.stop(close_envs=False)
    envs.close()
    loaded = jr.EnvRunner.__module__.split(".")[0]  # the base's own, not the working tree's
    return {"package": loaded, "first_s": times[0], "rebuild_s": float(np.median(times[1:]))}


def run_child(package: str, args: argparse.Namespace, base_dir: str, cache: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)
    if cache is not None:
        env |= {
            "JAX_COMPILATION_CACHE_DIR": cache,
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        }
    command = [sys.executable, __file__, "--child", package, "--base-dir", base_dir]
    command += ["--env", args.env, "--num-envs", str(args.num_envs)]
    command += ["--rebuilds", str(args.rebuilds), "--cpu-dispatch", args.cpu_dispatch]
    out = subprocess.run(command, env=env, cwd=HERE, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD~1", help="git revision to compare against")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rebuilds", type=int, default=5, help="rebuilds per child")
    parser.add_argument("--compile-cache", action="store_true", help="a warm persistent cache")
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--child", choices=("base", "new"), help=argparse.SUPPRESS)
    parser.add_argument("--base-dir", help=argparse.SUPPRESS)
    args = parse_args(parser)
    if args.child:
        result = child(args.child, args.base_dir, args.env, args.num_envs, args.rebuilds)
        print(json.dumps(result))
        return
    from ab_revision import git, import_base

    with tempfile.TemporaryDirectory() as tmp:
        base_dir = pathlib.Path(tmp, "base")
        import_base(args.base, base_dir)
        cache = str(pathlib.Path(tmp, "xla")) if args.compile_cache else None
        if cache is not None:
            for package in ("base", "new"):
                run_child(package, args, str(base_dir), cache)
        rounds: dict[str, list[dict]] = {"base": [], "new": []}
        for r in range(args.rounds):
            for package in ("base", "new") if r % 2 == 0 else ("new", "base"):
                rounds[package].append(run_child(package, args, str(base_dir), cache))
    result = {
        "base_commit": git("rev-parse", args.base),
        "env": args.env,
        "num_envs": args.num_envs,
    }
    for key in ("first_s", "rebuild_s"):
        base, new = (float(np.median([x[key] for x in rounds[p]])) for p in ("base", "new"))
        result |= {f"base_{key}": base, f"new_{key}": new, f"{key[:-2]}_speedup": base / new}
    result["rounds"] = rounds
    write_report("runner_build", args, [result])


if __name__ == "__main__":
    main()
