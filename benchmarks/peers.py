"""Peers: every kind of env jaxrunner steps, against the loop a user writes for it.

One run, one machine, one env (CartPole-v1: gymnasium's, EnvPool's C++ port or
gymnax's JAX port, the same dynamics), one policy (``jaxrunner.bench.mlp_policy``: a
64-64 tanh MLP sampling its actions, jitted), ``T = max(8, 2048 // width)`` steps per
rollout for every system. The measurement is ``jaxrunner bench``'s own
(``jaxrunner.bench.measure_width``): jaxrunner's ``EnvRunner.sample()`` at its defaults
in one long-lived child process, the recording hand loop
(``jaxrunner.bench.RecordingHandLoop``: ``np.asarray`` on actions and log-probs,
obs/action/log-prob/reward/flags into ``[T, B]`` numpy buffers; for gymnax the
``lax.scan`` of ``jaxrunner.bench.build_hand_scan``) at JAX's defaults in another,
each built once per width and timed in interleaved rounds. Per kind of env:

* ``sync`` (widths 1 8 64 256): gymnasium ``SyncVectorEnv``, SAME_STEP autoreset.
* ``process`` (64 256): the same sync hand loop (what a user writes), plus gymnasium's
  ``AsyncVectorEnv`` (one process per env) up to 64 envs for information.
* ``gymnasium`` native vector (1024 4096): ``gymnasium.make_vec(env, n,
  vectorization_mode="vector_entry_point")`` by hand.
* ``envpool`` (256 1024, when envpool imports): ``envpool.make_gymnasium`` in sync mode.
* ``jax`` (4096, when gymnax imports): ``JaxVectorEnv`` against the gymnax scan.
* RLlib's ``SingleAgentEnvRunner`` (when ``ray.rllib`` imports; the reason recorded
  otherwise), in this process, timed in the sync rounds up to 256 envs.

Ratios are jaxrunner / each other system, ratios of medians over rounds (the
per-round ratios' spread kept). The JSON keeps every round, the machine and load
averages; a PNG plots steps/s against width (log-log).

Usage::

    python benchmarks/peers.py --out benchmarks/results/peers_cpu.json   # ~5 min, 2 cores
    python benchmarks/peers.py --widths 1 --rounds 1 --seconds 0.2        # smoke test

On a machine shared with other sessions, give this session priority (Linux autogroup;
see README): ``setsid bash -c 'echo -10 > /proc/self/autogroup; exec python
benchmarks/peers.py --out benchmarks/results/peers_cpu.json'``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import json
import os
import pathlib
import sys
import time
from typing import Any

from jaxrunner import bench

WIDTHS: dict[str, tuple[int, ...]] = {
    "sync": (1, 8, 64, 256),
    "process": (64, 256),
    "gymnasium": (1024, 4096),
    "envpool": (256, 1024),
    "jax": (4096,),
}
"""The widths each kind of env is measured at by default."""
RLLIB_MAX_WIDTH = 256


# --- RLlib -----------------------------------------------------------------------------------


def rllib_unavailable() -> str | None:
    try:
        importlib.import_module("ray.rllib")
    except Exception as err:  # ImportError, or a broken install (ray.rllib: no dm-tree)
        return f"import ray.rllib failed: {type(err).__name__}: {err}"
    return None


class RLlibSystem:
    """RLlib's ``SingleAgentEnvRunner`` (new API stack) in this process: its own
    gymnasium SyncVectorEnv of ``width`` sub-envs, its default RLModule (a 64-64 tanh
    MLP here, as ours), exploring; ``sample(num_timesteps=...)`` per call."""

    def __init__(self, env: str, width: int, seed: int) -> None:
        from ray.rllib.algorithms.ppo import PPOConfig
        from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
        from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

        self._length = bench.rollout_length(width)
        config = (
            PPOConfig()
            .environment(env)
            .env_runners(
                num_env_runners=0,
                num_envs_per_env_runner=width,
                rollout_fragment_length=self._length,
            )
            .rl_module(
                model_config=DefaultModelConfig(fcnet_hiddens=[64, 64], fcnet_activation="tanh")
            )
            .debugging(seed=seed)
        )
        self._runner = SingleAgentEnvRunner(config=config)
        self._width = width
        self._rollout()  # warm-up

    def _rollout(self) -> int:
        episodes = self._runner.sample(num_timesteps=self._length * self._width, explore=True)
        return sum(len(episode) for episode in episodes)  # env steps actually taken

    def measure(self, seconds: float) -> dict[str, Any]:
        return {"steps_per_s": bench.timed(self._rollout, seconds)}

    def close(self) -> None:
        self._runner.stop()


# --- the run ---------------------------------------------------------------------------------


def series(rows: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """(width, median steps/s) per line of the plot."""
    lines: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for name, system in row["systems"].items():
            if name == "ceiling":
                continue
            # Hand loops by what they drive: the sync one serves sync and process.
            label = system["label"]
            if name == "rllib":
                label = "RLlib SingleAgentEnvRunner"
            elif name == "jaxrunner":
                label = f"jaxrunner {row['backend']}"
            points = lines.setdefault(label, [])
            if all(width != row["num_envs"] for width, _ in points):
                points.append((row["num_envs"], system["median"]))
    return lines


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """One line per (kind of env, width): jaxrunner, the hand loop, their ratio
    [min-max over rounds], and any other system measured there."""
    lines = [
        "| env kind | envs | jaxrunner steps/s | hand loop steps/s | ratio | others |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        systems, ratios = row["systems"], row["ratios"]

        def rate(name: str, systems: dict[str, Any] = systems) -> str:
            return f"{systems[name]['median']:,.0f}" if name in systems else "failed"

        ratio = ratios.get("hand")
        cell = f"{ratio['median']:.2f} [{ratio['min']:.2f}-{ratio['max']:.2f}]" if ratio else "-"
        others = "; ".join(
            f"{systems[n]['label']}: {systems[n]['median']:,.0f} (ratio {ratios[n]['median']:.2f})"
            for n in systems
            if n not in ("jaxrunner", "hand") and n in ratios
        )
        lines.append(
            f"| {row['backend']} | {row['num_envs']} | {rate('jaxrunner')} | {rate('hand')} "
            f"| {cell} | {others} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], title: str, path: pathlib.Path) -> None:
    """Steps/s against width, log-log (jaxrunner solid, hand loops dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for label, points in series(rows).items():
        x, y = zip(*sorted(points))
        style = "-" if label.startswith("jaxrunner") else "--"
        ax.plot(x, y, style, marker="o", markersize=4, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("number of envs (width)")
    ax.set_ylabel("env steps / s (median of rounds)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _versions(modules: tuple[str, ...]) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in modules:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument(
        "--widths", type=int, nargs="+", default=None, help="every kind at these widths"
    )
    parser.add_argument(
        "--kinds", nargs="+", default=list(WIDTHS), choices=list(WIDTHS), help="kinds of env"
    )
    parser.add_argument("--seconds", type=float, default=1.5, help="per system per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; median kept")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-rllib", action="store_true", help="leave RLlib out")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--plot", type=pathlib.Path, default=None, help="default: --out as .png")
    args = parser.parse_args()

    started = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.0f} s] {message}", file=sys.stderr, flush=True)

    skipped: dict[str, str] = {}
    rllib_reason = "off (--no-rllib)" if args.no_rllib else rllib_unavailable()
    if rllib_reason:
        skipped["rllib"] = rllib_reason
    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    with bench.Harness() as harness:
        children = harness.info()
        for kind in args.kinds:
            plan = bench.PLANS[kind]
            reason = plan.unavailable()
            if reason:
                skipped[kind] = reason
                log(f"skip {kind}: {reason}")
                continue
            widths = WIDTHS[kind] if args.widths is None else tuple(args.widths)
            for width in (w for w in widths if w <= plan.max_width):
                local: dict[str, Any] = {}
                if kind == "sync" and not rllib_reason and width <= RLLIB_MAX_WIDTH:
                    try:
                        local["rllib"] = RLlibSystem(args.env, width, args.seed)
                    except Exception as err:  # keep the other figures; record why
                        skipped[f"rllib x{width}"] = f"build: {type(err).__name__}: {err}"
                row = bench.measure_width(
                    harness,
                    plan,
                    args.env,
                    width,
                    rounds=args.rounds,
                    seconds=args.seconds,
                    seed=args.seed,
                    ceiling=False,
                    local=local,
                    log=log,
                )
                for system in local.values():
                    system.close()
                rows.append(row)
    table = markdown_table(rows)
    machine = children["jaxrunner"]["machine"]
    report = {
        "benchmark": "peers",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "python_executable": sys.executable,
        "config": {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()},
        "env": args.env,
        "policy": "jaxrunner.bench.mlp_policy (64, 64) tanh, stochastic, jitted",
        "rollout_length": "max(8, 2048 // width) for every system",
        "machine": {**machine, **_versions(("envpool", "gymnax", "ray", "matplotlib"))},
        "children": {
            k: {n: v for n, v in c.items() if n != "machine"} for k, c in children.items()
        },
        "autogroup": bench.autogroup(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "wall_s": time.perf_counter() - started,
        "skipped": skipped,
        "results": rows,
        "verdict": bench.verdict(rows),
        "markdown_table": table,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        log(f"wrote {args.out}")
    plot_path = args.plot or (args.out.with_suffix(".png") if args.out else None)
    if plot_path:
        devices = ", ".join(machine["jax_devices"])
        title = (
            f"{args.env}, 64-64 MLP policy; {devices}, {os.cpu_count()} CPUs; "
            f"median of {args.rounds} interleaved round{'s' if args.rounds > 1 else ''}"
        )
        plot(rows, title, plot_path)
        log(f"wrote {plot_path}")
    print(table)
    print(report["verdict"])


if __name__ == "__main__":
    main()
