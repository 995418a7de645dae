"""Does ``examples/ppo_continuous.py`` learn like its hand-loop twin
(``benchmarks/ppo_continuous_hand.py``)? Runs both at CleanRL's defaults per seed, one
after the other; records each curve (global step -> mean return of the last 10
episodes), its returns at a few steps and time as JSON, and the curves as a PNG.

    python3 benchmarks/ppo_continuous_learning.py --seeds 1 \\
        --out benchmarks/results/ppo_continuous_learning_cpu.json

Needs EnvPool and optax. ``--logs NAME:SEED:PATH[:WALL_S] ...`` records runs already made
(each script's output, ``python <script> --seed SEED > PATH``) instead of running them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import matplotlib

from jaxrunner._src.bench import machine_info

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = {"example": "examples/ppo_continuous.py", "hand": "benchmarks/ppo_continuous_hand.py"}
AT = (100_000, 250_000, 500_000, 750_000)


def parse(text: str) -> dict:
    """A run's curve and figures from its per-iteration lines."""
    rows = [
        {name: float(value) for name, value in re.findall(r"(\w+)=(\S+)", line)}
        for line in text.splitlines()
        if line.startswith("global_step=")
    ]
    steps = [int(row["global_step"]) for row in rows]
    returns = [row["episodic_return"] for row in rows]
    # The return at the last iteration that ended at or before each step.
    at = {
        str(x): next(r for s, r in zip(steps[::-1], returns[::-1]) if s <= x)
        for x in AT
        if steps[0] <= x <= steps[-1]
    }
    return {
        "iterations": len(rows),
        "final_global_step": steps[-1],
        "final_return_mean": returns[-1],  # of the last 10 episodes
        "return_at": at,
        "max_return_mean": max(returns),
        "loop_s": steps[-1] / rows[-1]["SPS"],  # the script's own clock: from its first step
        "curve": {"global_step": steps, "episodic_return": returns},
    }


def plot(result: dict, path: Path) -> None:
    """The curves, one line per run: a colour per script, a line style per seed."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    seeds = sorted({run["seed"] for run in result["runs"]})
    for run in result["runs"]:
        curve, label = run["curve"], f"{run['name']} (seed {run['seed']})"
        color = f"C{list(SCRIPTS).index(run['name'])}"
        style = ("-", "--", ":", "-.")[seeds.index(run["seed"]) % 4]
        ax.plot(curve["global_step"], curve["episodic_return"], style, color=color, label=label)
    settings = result["settings"]
    ax.set(
        xlabel="env steps",
        ylabel="mean return, last 10 episodes",
        title=f"PPO on {settings['env_id']}: the example and its hand-loop twin",
    )
    ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--env-id", default="HalfCheetah-v4")
    p.add_argument("--total-timesteps", type=int, default=1_000_000)
    p.add_argument(
        "--logs", nargs="+", metavar="NAME:SEED:PATH[:WALL_S]", help="record these logs instead"
    )
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    flags = ["--env-id", args.env_id, "--total-timesteps", str(args.total_timesteps)]
    load_before = list(os.getloadavg())
    runs = []
    if args.logs:
        for item in args.logs:
            name, seed, path, *wall = item.split(":")
            runs.append((name, int(seed), Path(path).read_text(), float(wall[0]) if wall else None))
    else:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        for seed in args.seeds:
            for name, script in SCRIPTS.items():
                start = time.perf_counter()
                done = subprocess.run(
                    [sys.executable, str(ROOT / script), *flags, "--seed", str(seed)],
                    capture_output=True, text=True, env=env, check=True,
                )  # fmt: skip
                runs.append((name, seed, done.stdout, time.perf_counter() - start))
    result = {
        "question": "Does examples/ppo_continuous.py (jr.EnvRunner with connectors) learn "
        "like benchmarks/ppo_continuous_hand.py (the same learner, EnvPool stepped by hand)?",
        "settings": {
            "env_id": args.env_id,
            "total_timesteps": args.total_timesteps,
            "num_envs": 1,
            "num_steps": 2048,
            "note": "CleanRL's ppo_continuous_action defaults; global_step counts env steps "
            "(EnvPool's reset steps are no step); returns: mean of the last 10 episodes",
        },
        "runs": [
            {
                "name": name,
                "script": SCRIPTS[name],
                "seed": seed,
                "command": f"python {SCRIPTS[name]} {' '.join(flags)} --seed {seed}",
                "wall_s": wall,
                **parse(text),
            }
            for name, seed, text, wall in runs
        ],
        "how": "from logs of runs made by hand (at nice 10, side by side on a shared machine: "
        "times are no speed comparison)"
        if args.logs
        else "each run alone, one after the other",
        "command": "python3 benchmarks/ppo_continuous_learning.py " + " ".join(sys.argv[1:]),
        "machine": machine_info(),
        "load_avg_before": load_before,
        "load_avg_after": list(os.getloadavg()),
    }
    result["mean_over_seeds"] = {
        name: {
            "seeds": [run["seed"] for run in mine],
            "final_return_mean": sum(run["final_return_mean"] for run in mine) / len(mine),
            "return_at": {
                x: sum(run["return_at"][x] for run in mine) / len(mine)
                for x in mine[0]["return_at"]
                if all(x in run["return_at"] for run in mine)
            },
        }
        for name in SCRIPTS
        if (mine := [run for run in result["runs"] if run["name"] == name])
    }
    text = json.dumps(result, indent=1)  # then each list of numbers on one line:
    text = re.sub(r"\[\s+([^][{}]*?)\s+\]", lambda m: "[" + " ".join(m[1].split()) + "]", text)
    args.out.write_text(text + "\n")
    plot(result, args.out.with_suffix(".png"))
    for run in result["runs"]:
        at = " ".join(f"{int(x) // 1000}k={r:.0f}" for x, r in run["return_at"].items())
        print(
            f"{run['name']:8} seed {run['seed']}: {at} final={run['final_return_mean']:.0f} "
            f"(at {run['final_global_step']}) loop {run['loop_s'] / 60:.1f} min"
        )


if __name__ == "__main__":
    main()
