"""PPO on CartPole-v1 at full settings: executes ``notebooks/ppo_cartpole.ipynb``
(so the recorded curve is the notebook's own code), saves the executed notebook
in place, and records the learning curve as JSON and PNG with the machine's details.

    python3 benchmarks/ppo_cartpole.py --out benchmarks/results/ppo_cartpole_cpu.json

Needs the ``notebooks`` extra (``pip install ".[notebooks]"``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import matplotlib
import nbclient
import nbformat

from jaxrunner._src.bench import machine_info

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parent.parent
TAG = "PPO_BENCHMARK_RESULT "
# Appended to the notebook for the run and removed before it is saved: reads the
# notebook's own variables.
EXTRA_CELL = f"""import json as _json
print({TAG!r} + _json.dumps({{
    "history": history,
    "settings": {{"total_env_steps": TOTAL_ENV_STEPS, "num_envs": NUM_ENVS,
                 "rollout_length": ROLLOUT, "epochs": EPOCHS, "minibatches": MINIBATCHES,
                 "gamma": GAMMA, "lam": LAM, "learning_rate": LEARNING_RATE, "ent_coef": ENT_COEF,
                 "seed": SEED}},
    "env_steps": env_steps, "sampling_s": sampling_s, "total_s": total_s,
    "greedy_eval_returns": eval_returns,
}}))"""


def run_notebook(path: Path) -> tuple[nbformat.NotebookNode, dict]:
    """Executes ``path`` at full settings; returns the executed notebook (without
    the extra cell) and the result the extra cell printed."""
    env_small = os.environ.pop("JAXRUNNER_NOTEBOOK_SMALL", None)
    try:
        nb = nbformat.read(path, as_version=4)
        nb.cells.append(nbformat.v4.new_code_cell(EXTRA_CELL))
        client = nbclient.NotebookClient(
            nb,
            timeout=3600,
            kernel_name="python3",
            resources={"metadata": {"path": str(path.parent)}},
        )
        client.execute()
    finally:
        if env_small is not None:
            os.environ["JAXRUNNER_NOTEBOOK_SMALL"] = env_small
    extra = nb.cells.pop()
    text = "".join(out.get("text", "") for out in extra.outputs)
    line = next(line for line in text.splitlines() if line.startswith(TAG))
    for cell in nb.cells:  # keep the saved notebook free of timing metadata churn
        cell.metadata.pop("execution", None)
    return nb, json.loads(line[len(TAG) :])


def dumps(result: dict) -> str:
    """Indented JSON with each learning-curve list on one line (thousands of points)."""
    history = result["history"]
    text = json.dumps({**result, "history": "@HISTORY@"}, indent=1)
    compact = "{\n" + ",\n".join(f'  "{k}": {json.dumps(v)}' for k, v in history.items()) + "\n }"
    return text.replace('"@HISTORY@"', compact) + "\n"


def plot(result: dict, path: Path) -> None:
    history = result["history"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(history["env_steps"], history["episode_return_mean"], label="mean return, last 100")
    ax.axhline(475, color="gray", ls="--", label="solved (475)")
    solved = result["first_env_steps_at_475"]
    if solved is not None:
        ax.axvline(solved, color="tab:green", ls=":", label=f"475 at {solved:,} steps")
    ax.set(
        xlabel="env steps",
        ylabel="episode return",
        title=f"PPO on CartPole-v1, jaxrunner sampler ({result['machine']['cpu_count']} CPUs)",
    )
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notebook", type=Path, default=ROOT / "notebooks" / "ppo_cartpole.ipynb")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/ppo_cartpole_cpu.json"
    )
    parser.add_argument(
        "--no-save-notebook", action="store_true", help="do not overwrite the notebook"
    )
    args = parser.parse_args(argv)

    load_before = os.getloadavg()
    start = time.perf_counter()
    nb, result = run_notebook(args.notebook)
    wall = time.perf_counter() - start
    if not args.no_save_notebook:
        nbformat.write(nb, args.notebook)

    history = result["history"]
    first = next(
        (s for s, r in zip(history["env_steps"], history["episode_return_mean"]) if r >= 475), None
    )
    result.update(
        {
            "command": "python3 " + " ".join([str(Path(sys.argv[0])), *sys.argv[1:]]),
            "machine": machine_info(),
            "load_avg_before": load_before,
            "load_avg_after": os.getloadavg(),
            "notebook_wall_s": wall,
            "first_env_steps_at_475": first,
            "final_return_mean": history["episode_return_mean"][-1],
            "max_return_mean": max(r for r in history["episode_return_mean"] if not math.isnan(r)),
            "sampling_env_steps_per_s": result["env_steps"] / result["sampling_s"],
            "loop_env_steps_per_s": result["env_steps"] / result["total_s"],
        }
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dumps(result))
    png = args.out.with_suffix(".png")
    plot(result, png)
    print(
        f"475 first reached at {first} env steps; final mean return "
        f"{result['final_return_mean']:.1f}; sampling {result['sampling_env_steps_per_s']:,.0f} "
        f"steps/s, whole loop {result['loop_env_steps_per_s']:,.0f} steps/s "
        f"({result['total_s']:.0f} s); load {load_before} -> {result['load_avg_after']}"
    )
    print(f"wrote {args.out} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
