"""Peers: every jaxrunner backend against what a user would otherwise write, side by side.

One run, one machine, one env (CartPole-v1: gymnasium's, EnvPool's C++ port or
gymnax's JAX port, each the same dynamics), one policy (``jaxrunner.bench.mlp_policy``:
a 64-64 tanh MLP sampling its actions, jitted), one rollout length. Systems:

* jaxrunner ``EnvRunner.sample()`` on ``backend="sync"``, ``"process"`` (default
  workers and groups), ``"gymnasium"`` (``gymnasium.make_vec``: CartPole's own vector
  entry point), ``"envpool"`` (if importable), ``"ray"`` (``--with-ray`` only: it
  starts a local Ray instance) and ``jr.JaxVectorEnv`` on gymnax (if importable):
  the whole rollout as one compiled ``lax.scan``.
* Hand-written loops, what a user would write without jaxrunner: gymnasium's
  ``SyncVectorEnv`` + the same jitted policy + numpy conversion (``core.py``'s
  ``measure_hand_loop``); gymnasium's ``AsyncVectorEnv`` (one process per sub-env,
  forkserver) + the same loop; CartPole's native gymnasium vector env + the same loop
  (``native_vector.py``'s); EnvPool (sync mode) + the same loop; a gymnax
  ``lax.scan`` over ``vmap(env.step)`` (``jax_scan.py``'s ``build_hand_scan``).
* RLlib's ``SingleAgentEnvRunner`` (its default RLModule, set to a 64-64 tanh MLP)
  when ``ray.rllib`` imports; skipped otherwise (the reason is recorded).

Each system runs at the widths that fit it (``max_width`` below: per-env Python
envs up to 1024, one process per sub-env up to 64, native and JAX envs up to 4096).
At each width every system is built once and kept alive; then in each round each
system is timed for ``--seconds`` in turn (interleaved, so drifts in the load of a
shared machine hit all alike), after a warm-up that compiles. Medians over rounds
are reported, every round is kept, and jaxrunner/hand-loop ratios are taken within
each round. The JSON records the machine, load averages and the command; a PNG plots
steps/s against width (log-log, one line per system).

Usage::

    python benchmarks/peers.py --out benchmarks/results/peers_cpu.json   # ~10-15 min, 2 cores
    python benchmarks/peers.py --widths 1 64 --rounds 1 --seconds 0.2     # smoke test

On a machine shared with other sessions, give this session priority (Linux autogroup;
see README): ``setsid bash -c 'echo -10 > /proc/self/autogroup; exec python
benchmarks/peers.py --out benchmarks/results/peers_cpu.json'``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import importlib
import importlib.metadata
import json
import multiprocessing
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import gymnasium
import jax

import jaxrunner as jr
from jaxrunner import bench

# Sibling benchmark scripts (this directory is on sys.path when run as a script).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import core
import native_vector

Measure = Callable[[], float]
"""One round's measurement of a built system: env steps per second."""
Opener = Callable[[int, argparse.Namespace, contextlib.ExitStack], Measure]
"""Builds a system at a width (registering its cleanup on the stack) and warms it up."""


@dataclasses.dataclass(frozen=True)
class System:
    """One line of the plot."""

    name: str
    label: str
    max_width: int
    open: Opener
    needs: tuple[str, ...] = ()
    """Modules that must import, else the system is skipped (reason recorded)."""
    flag: str | None = None
    """An ``args`` attribute that must be true, else the system is skipped."""

    def unavailable(self, args: argparse.Namespace) -> str | None:
        """Why this system cannot run here, or None."""
        if self.flag and not getattr(args, self.flag):
            return f"off (pass --{self.flag.replace('_', '-')})"
        for module in self.needs:
            try:
                importlib.import_module(module)
            except Exception as err:  # ImportError, or a broken install (ray.rllib: no dm-tree)
                return f"import {module} failed: {type(err).__name__}: {err}"
        return None


def _timed(step: Callable[[], int], seconds: float) -> Measure:
    step()  # warm-up: compiles, first resets
    return lambda: bench.timed(step, seconds)


def _env_steps(runner: jr.EnvRunner) -> Callable[[], int]:
    return lambda: runner.sample().reward.size


# --- jaxrunner ---------------------------------------------------------------------------


def _open_runner(backend: str) -> Opener:
    """``EnvRunner.sample()`` on ``make_vec(env, width, backend)``, default options."""

    def open_runner(width: int, args: argparse.Namespace, stack: contextlib.ExitStack) -> Measure:
        envs = jr.make_vec(args.env, width, backend=backend)
        stack.callback(envs.close)
        policy = bench.mlp_policy(envs.single_action_space)
        params = policy.init(jax.random.key(args.seed), envs.single_observation_space)
        runner = jr.EnvRunner(envs, policy, params, args.rollout_length, args.seed)
        stack.callback(runner.stop)
        return _timed(_env_steps(runner), args.seconds)

    return open_runner


def open_ray(width: int, args: argparse.Namespace, stack: contextlib.ExitStack) -> Measure:
    import ray

    if not ray.is_initialized():  # once per run; shut down at exit
        ray.init(include_dashboard=False, log_to_driver=False)
    return _open_runner("ray")(width, args, stack)


def open_jax(width: int, args: argparse.Namespace, stack: contextlib.ExitStack) -> Measure:
    import jax_scan  # imports gymnax

    return _timed(jax_scan.build_jaxrunner(width, args.rollout_length, args.seed), args.seconds)


# --- hand-written loops --------------------------------------------------------------------


def open_hand_sync(width: int, args: argparse.Namespace, stack: contextlib.ExitStack) -> Measure:
    """``core.measure_hand_loop``: it builds, warms up and times the loop each round."""
    config = bench.BenchConfig(
        env=args.env,
        widths=(width,),
        seconds=args.seconds,
        rollout_length=args.rollout_length,
        seed=args.seed,
    )
    return lambda: core.measure_hand_loop(config, width)


def open_hand_native(width: int, args: argparse.Namespace, stack: contextlib.ExitStack) -> Measure:
    """``native_vector.measure_hand_loop`` (CartPole's own gymnasium vector env)."""
    return lambda: native_vector.measure_hand_loop(args, width)["steps_per_s"]


def hand_loop(
    envs: Any, width: int, args: argparse.Namespace, seeded_reset: bool = True
) -> Callable[[], int]:
    """:func:`jaxrunner.bench.hand_loop` with this script's arguments."""
    return bench.hand_loop(envs, width, args.rollout_length, args.seed, seeded_reset)


def open_hand_async(width: int, args: argparse.Namespace, stack: contextlib.ExitStack) -> Measure:
    # forkserver, not fork: forking this process (JAX's threads are running) can
    # deadlock the child.
    envs = gymnasium.vector.AsyncVectorEnv(
        [functools.partial(gymnasium.make, args.env)] * width,
        autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP,
        context="forkserver",
    )
    stack.callback(envs.close)
    return _timed(hand_loop(envs, width, args), args.seconds)


def open_hand_envpool(width: int, args: argparse.Namespace, stack: contextlib.ExitStack) -> Measure:
    import envpool

    envs = envpool.make_gymnasium(args.env, num_envs=width, batch_size=width, seed=args.seed)
    stack.callback(envs.close)
    return _timed(hand_loop(envs, width, args, seeded_reset=False), args.seconds)


def open_hand_scan(width: int, args: argparse.Namespace, stack: contextlib.ExitStack) -> Measure:
    import jax_scan  # imports gymnax

    return _timed(jax_scan.build_hand_scan(width, args.rollout_length, args.seed), args.seconds)


# --- RLlib -----------------------------------------------------------------------------------


def open_rllib(width: int, args: argparse.Namespace, stack: contextlib.ExitStack) -> Measure:
    """RLlib's ``SingleAgentEnvRunner`` (new API stack) in this process: its own
    gymnasium SyncVectorEnv of ``width`` sub-envs, its default RLModule (a 64-64 tanh
    MLP here, as ours), exploring; ``sample(num_timesteps=...)`` per call."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    config = (
        PPOConfig()
        .environment(args.env)
        .env_runners(
            num_env_runners=0,
            num_envs_per_env_runner=width,
            rollout_fragment_length=args.rollout_length,
        )
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[64, 64], fcnet_activation="tanh"))
        .debugging(seed=args.seed)
    )
    runner = SingleAgentEnvRunner(config=config)
    stack.callback(runner.stop)

    def rollout() -> int:
        episodes = runner.sample(num_timesteps=args.rollout_length * width, explore=True)
        return sum(len(episode) for episode in episodes)  # env steps actually taken

    return _timed(rollout, args.seconds)


SYSTEMS: tuple[System, ...] = (
    System("jr_sync", "jaxrunner sync", 1024, _open_runner("sync")),
    System("jr_process", "jaxrunner process", 1024, _open_runner("process")),
    System("jr_gymnasium", "jaxrunner gymnasium (native vector)", 4096, _open_runner("gymnasium")),
    System("jr_envpool", "jaxrunner envpool", 4096, _open_runner("envpool"), ("envpool",)),
    System("jr_ray", "jaxrunner ray", 64, open_ray, ("ray",), flag="with_ray"),
    System("jr_jax", "jaxrunner JaxVectorEnv (gymnax)", 4096, open_jax, ("gymnax",)),
    System("hand_sync", "hand loop: gymnasium SyncVectorEnv", 1024, open_hand_sync),
    System("hand_async", "hand loop: gymnasium AsyncVectorEnv", 64, open_hand_async),
    System("hand_native", "hand loop: gymnasium native vector", 4096, open_hand_native),
    System("hand_envpool", "hand loop: EnvPool", 4096, open_hand_envpool, ("envpool",)),
    System("hand_scan", "hand loop: gymnax lax.scan", 4096, open_hand_scan, ("gymnax",)),
    System("rllib", "RLlib SingleAgentEnvRunner", 256, open_rllib, ("ray.rllib",)),
)

RATIOS: tuple[tuple[str, str], ...] = (
    ("jr_sync", "hand_sync"),
    ("jr_process", "hand_sync"),
    ("jr_process", "hand_async"),
    ("jr_gymnasium", "hand_native"),
    ("jr_envpool", "hand_envpool"),
    ("jr_jax", "hand_scan"),
    ("jr_sync", "rllib"),
)
"""(jaxrunner system, what a user would otherwise run): ratios taken within each round."""


def measure_width(
    width: int, systems: list[System], args: argparse.Namespace, log: Callable[[str], None]
) -> dict[str, Any]:
    """Builds every system that fits ``width``, then times them in interleaved rounds."""
    row: dict[str, Any] = {"num_envs": width, "loadavg_per_round": [], "errors": {}}
    rates: dict[str, list[float]] = {}
    with contextlib.ExitStack() as stack:
        measures: dict[str, Measure] = {}
        for system in systems:
            if width > system.max_width:
                continue
            start = time.perf_counter()
            try:
                measures[system.name] = system.open(width, args, stack)
            except Exception as err:  # keep the other systems' figures; record why
                row["errors"][system.name] = f"build: {type(err).__name__}: {err}"
                log(f"  x{width} {system.name}: FAILED to build: {err!r}")
                continue
            log(f"  x{width} {system.name}: built in {time.perf_counter() - start:.1f} s")
        for round_index in range(args.rounds):
            row["loadavg_per_round"].append(os.getloadavg())
            # Each round starts one system later, so no system always runs first or last.
            names = list(measures)
            shift = round_index % max(1, len(names))
            for name in names[shift:] + names[:shift]:
                measure = measures[name]
                try:
                    rates.setdefault(name, []).append(measure())
                except Exception as err:
                    row["errors"][name] = f"round {round_index}: {type(err).__name__}: {err}"
                    log(f"  x{width} {name}: FAILED: {err!r}")
                    del measures[name]
                    rates.pop(name, None)
            log(
                f"  x{width} round {round_index + 1}/{args.rounds}: "
                + "  ".join(f"{k}={v[-1]:,.0f}" for k, v in rates.items())
            )
    row["steps_per_s"] = {name: statistics.median(r) for name, r in rates.items()}
    row["all_rounds"] = rates
    row["ratios"] = {}
    for ours, theirs in RATIOS:
        if ours in rates and theirs in rates:
            per_round = [a / b for a, b in zip(rates[ours], rates[theirs])]
            row["ratios"][f"{ours}/{theirs}"] = {
                "median_of_rounds": statistics.median(per_round),
                "all_rounds": per_round,
            }
    return row


def markdown_table(rows: list[dict[str, Any]], systems: list[System]) -> str:
    """Systems as rows, widths as columns, median steps/s (``-``: not run at that width)."""
    widths = [row["num_envs"] for row in rows]
    names = [s for s in systems if any(s.name in row["steps_per_s"] for row in rows)]
    lines = [
        "| system | " + " | ".join(str(w) for w in widths) + " |",
        "|---|" + "---:|" * len(widths),
    ]
    for system in names:
        cells = [
            f"{row['steps_per_s'][system.name]:,.0f}" if system.name in row["steps_per_s"] else "-"
            for row in rows
        ]
        lines.append(f"| {system.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], systems: list[System], title: str, path: pathlib.Path) -> None:
    """Steps/s against width, log-log, one line per system (jaxrunner solid, others dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for system in systems:
        points = [
            (row["num_envs"], row["steps_per_s"][system.name])
            for row in rows
            if system.name in row["steps_per_s"]
        ]
        if not points:
            continue
        x, y = zip(*points)
        style = "-" if system.name.startswith("jr_") else "--"
        ax.plot(x, y, style, marker="o", markersize=4, label=system.label)
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
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 4, 16, 64, 256, 1024, 4096])
    parser.add_argument(
        "--systems", nargs="+", default=None, help="names to run (default: all available)"
    )
    parser.add_argument("--rollout-length", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=1.5, help="per measurement")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved repeats; median kept")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--with-ray", action="store_true", help="also backend='ray' (ray.init)")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--plot", type=pathlib.Path, default=None, help="default: --out as .png")
    args = bench.parse_args(parser)
    known = {s.name for s in SYSTEMS}
    if args.systems and not set(args.systems) <= known:
        parser.error(f"--systems: unknown {sorted(set(args.systems) - known)}; known: {known}")

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.0f} s] {message}", file=sys.stderr, flush=True)

    started = time.perf_counter()
    # AsyncVectorEnv's workers and the process backend's share one fork server; having
    # it import gymnasium once makes each worker start in milliseconds.
    multiprocessing.set_forkserver_preload(["gymnasium"])
    load_before = os.getloadavg()
    systems, skipped = [], {}
    for system in SYSTEMS:
        if args.systems and system.name not in args.systems:
            continue
        reason = system.unavailable(args)
        if reason:
            skipped[system.name] = reason
            log(f"skip {system.name}: {reason}")
        else:
            systems.append(system)

    rows = []
    for width in args.widths:
        rows.append(measure_width(width, systems, args, log))
        log(f"x{width}: " + "  ".join(f"{k}={v:,.0f}" for k, v in rows[-1]["steps_per_s"].items()))
    table = markdown_table(rows, systems)
    devices = ", ".join(str(d) for d in jax.devices())
    report = {
        "benchmark": "peers",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "python_executable": sys.executable,
        "config": {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()},
        "env": args.env,
        "policy": "jaxrunner.bench.mlp_policy (64, 64) tanh, stochastic, jitted",
        "machine": {
            **bench.machine_info(),
            **_versions(("envpool", "gymnax", "ray", "matplotlib")),
        },
        "autogroup": bench.autogroup(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "wall_s": time.perf_counter() - started,
        "systems": {s.name: {"label": s.label, "max_width": s.max_width} for s in systems},
        "skipped": skipped,
        "results": rows,
        "markdown_table": table,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        log(f"wrote {args.out}")
    plot_path = args.plot or (args.out.with_suffix(".png") if args.out else None)
    if plot_path:
        title = (
            f"{args.env}, 64-64 MLP policy; {devices}, {os.cpu_count()} CPUs; "
            f"median of {args.rounds} interleaved rounds"
        )
        plot(rows, systems, title, plot_path)
        log(f"wrote {plot_path}")
    print(table)


if __name__ == "__main__":
    main()
