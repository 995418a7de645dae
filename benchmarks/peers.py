"""Peers: every kind of env jaxrunner steps, against the loop a user writes for it.

One run, one machine, one env (CartPole-v1: gymnasium's, EnvPool's C++ port or
gymnax's JAX port, the same dynamics), one policy (``jr.models.mlp_policy``: a 64-64
tanh MLP sampling its actions, jitted), ``T = max(8, 2048 // width)`` steps per rollout
for every system. The measurement is ``jaxrunner bench``'s own
(``jaxrunner._src.bench.measure_width``): jaxrunner's ``EnvRunner.sample()`` at its
defaults in one long-lived child process, the recording hand loop
(``jaxrunner._src.bench.RecordingHandLoop``: ``np.asarray`` on actions and log-probs,
obs/action/log-prob/reward/flags into ``[T, B]`` numpy buffers; for gymnax the
``lax.scan`` of ``jaxrunner._src.bench.build_hand_scan``) at JAX's defaults in another,
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
averages; a PNG plots steps/s against width (log-log; ``jaxrunner bench --plot``'s
figure).

``--workload {cartpole,pong,halfcheetah}`` (``jaxrunner._src.bench.workloads``) compares
instead the peer libraries on a real workload, every system with the workload's envs
and policy (NatureCNN on Pong, a 256-256 Gaussian MLP on HalfCheetah) recording
``[T, B]``, ``T = max(8, steps // width)`` (2048, 256 and 512 steps), at its widths:

* row ``sync``: jaxrunner's sync backend, the recording hand loop over gymnasium's
  ``SyncVectorEnv``, PufferLib's ``Serial`` by hand and RLlib's
  ``SingleAgentEnvRunner`` (CartPole and HalfCheetah; its own MLP of the same widths,
  torch) -- the single-process samplers;
* row ``process``: jaxrunner's process backend, the same sync hand loop, gymnasium's
  ``AsyncVectorEnv`` by hand, EnvPool by hand in sync mode and in async mode
  (``batch_size = num_envs // 2``) and PufferLib's ``Multiprocessing`` (a worker per
  physical core but one, left to the main process) -- the parallel ones;
* row ``envpool`` (where EnvPool imports in this venv too): jaxrunner's envpool backend
  at its defaults and in async mode (``batch_size = num_envs // 2``, under "others"),
  ``EnvRunner.from_env(backend="auto")`` (its trial's choice, under "others"), EnvPool
  by hand in sync mode (its hand loop) and in async mode.

EnvPool, PufferLib (with torch, which ``import pufferlib`` needs) and RLlib (where
``ray.rllib`` imports there; else in this process) conflict with the main venv: they
run in a child under ``--peers-python`` (default ``/work/venv-peers/bin/python``; see
benchmarks/README.md), ``peer_child.py``, which imports this checkout's jaxrunner,
drives the peers as ``peer_loops.py`` does and speaks the bench child protocol; every
other system runs in the main venv. EnvPool's and PufferLib's reset steps (the step
after an episode ended, which only resets it) are not counted.

Usage::

    python benchmarks/peers.py --out benchmarks/results/peers_cpu.json   # ~5 min, 2 cores
    python benchmarks/peers.py --widths 1 --rounds 1 --seconds 0.2        # smoke test
    python benchmarks/peers.py --workload pong --out benchmarks/results/peers_pong_cpu.json

On a machine shared with other sessions, give this session priority (Linux autogroup;
see README): ``setsid bash -c 'echo -10 > /proc/self/autogroup; exec python
benchmarks/peers.py --out benchmarks/results/peers_cpu.json'``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib
import importlib.metadata
import json
import os
import pathlib
import shutil
import sys
import time
from typing import Any

import peer_child
from peer_loops import RLLIB_HIDDEN, RLlibLoop, peer_labels
from script_report import source_commit

from jaxrunner._src import bench
from jaxrunner._src.bench import plot
from jaxrunner._src.bench.child import Child
from jaxrunner._src.bench.systems import RolloutSystem
from jaxrunner._src.bench.workloads import WORKLOADS, get_workload

WIDTHS: dict[str, tuple[int, ...]] = {
    "sync": (1, 8, 64, 256),
    "process": (64, 256),
    "gymnasium": (1024, 4096),
    "envpool": (256, 1024),
    "jax": (4096,),
}
"""The widths each kind of env is measured at by default."""
RLLIB_MAX_WIDTH = 256
SINGLE_PROCESS_PEERS: tuple[str, ...] = ("puffer_serial",)
"""Peers timed beside jaxrunner's sync backend, in the peers' venv."""
PARALLEL_PEERS: tuple[str, ...] = ("envpool", "envpool_async", "puffer_mp")
"""Peers timed beside jaxrunner's process backend, in the peers' venv (gymnasium's
AsyncVectorEnv, by hand in the main venv, too)."""
JAXRUNNER_VARIANT_LABELS = {
    "jaxrunner_async": "jaxrunner, EnvPool async mode (batch_size = num_envs // 2)",
    "jaxrunner_auto": 'jaxrunner, EnvRunner.from_env(backend="auto"): its trial\'s choice',
}
"""The envpool row's other jaxrunner systems: its backend in EnvPool's async mode, as
the async hand loop beside it, and ``EnvRunner.from_env`` (which tries EnvPool's modes
where EnvPool has the env)."""

ENVPOOL_PEERS: tuple[str, ...] = ("envpool_async",)
"""Peers timed beside jaxrunner's envpool backend (where EnvPool imports in this venv:
its own hand loop is EnvPool's sync mode by hand), in the peers' venv."""


# --- RLlib -----------------------------------------------------------------------------------


def rllib_unavailable() -> str | None:
    try:
        importlib.import_module("ray.rllib")
    except Exception as err:  # ImportError, or a broken install (ray.rllib: no dm-tree)
        return f"import ray.rllib failed: {type(err).__name__}: {err}"
    return None


def rllib_system(
    env: str, width: int, seed: int, hidden: tuple[int, ...] = (64, 64), length: int | None = None
) -> RolloutSystem:
    """RLlib's ``SingleAgentEnvRunner`` in this process (``peer_loops.RLlibLoop``: its
    own gymnasium SyncVectorEnv of ``width`` sub-envs, its default RLModule, a tanh MLP
    of ``hidden`` as ours, exploring), warmed up."""
    loop = RLlibLoop(env, width, length or bench.rollout_length(width), seed, hidden)
    return RolloutSystem(loop.rollout, loop.close)


# --- the workloads ---------------------------------------------------------------------------

ASYNC_MAX_WIDTH = 64
"""Gymnasium's AsyncVectorEnv runs a process per env: not past this many."""


def workload_rows(
    args: argparse.Namespace,
    harness: bench.Harness,
    peers_child: Child | None,
    unavailable: dict[str, str],
    rllib_reason: str | None,
    skipped: dict[str, str],
    log: Any,
) -> list[dict[str, Any]]:
    """Per width, the single-process samplers beside jaxrunner's sync backend, the
    parallel ones beside its process backend and, where EnvPool imports here, EnvPool by
    hand beside its envpool backend (module docstring)."""
    workload = get_workload(args.workload)
    widths = workload.widths if args.widths is None else tuple(args.widths)
    kinds = [("sync", SINGLE_PROCESS_PEERS), ("process", PARALLEL_PEERS)]
    envpool_reason = bench.PLANS["envpool"].unavailable()
    if envpool_reason:
        skipped["envpool row"] = f"jaxrunner's envpool backend, in this venv: {envpool_reason}"
    else:
        kinds.append(("envpool", ENVPOOL_PEERS))
    rows: list[dict[str, Any]] = []
    for width in widths:
        for kind, peer_names in kinds:
            plan = dataclasses.replace(bench.PLANS[kind], extras=())  # peers below instead
            peers: dict[str, Child] = {}
            if kind == "process" and width <= ASYNC_MAX_WIDTH:
                peers["async"] = harness.jax_defaults  # gymnasium's, in the main venv
            if peers_child is not None:
                peers.update({p: peers_child for p in peer_names if p not in unavailable})
            local: dict[str, Any] = {}
            rllib_here = kind == "sync" and width <= RLLIB_MAX_WIDTH
            if rllib_here and args.workload not in RLLIB_HIDDEN:
                skipped["rllib"] = f"RLlib has no model of {args.workload}'s policy"
            elif rllib_here and peers_child is not None and "rllib" not in unavailable:
                peers["rllib"] = peers_child  # in its own venv
            elif rllib_here and not rllib_reason:
                try:
                    local["rllib"] = rllib_system(
                        workload.env_id,
                        width,
                        args.seed,
                        RLLIB_HIDDEN[args.workload],
                        workload.rollout_length(width),
                    )
                except Exception as err:  # keep the other figures; record why
                    skipped[f"rllib x{width}"] = f"build: {type(err).__name__}: {err}"
            rows.append(
                bench.measure_width(
                    harness,
                    plan,
                    workload.env_id,
                    width,
                    rounds=args.rounds,
                    seconds=args.seconds,
                    seed=args.seed,
                    ceiling=False,
                    local=local,
                    log=log,
                    workload=args.workload,
                    peers=peers,
                    labels={**peer_labels(), **JAXRUNNER_VARIANT_LABELS},
                    variants={"async": {"batch_size": max(1, width // 2)}}
                    if kind == "envpool"
                    else None,
                    auto=kind == "envpool",
                )
            )
            for system in local.values():
                system.close()
    return rows


# --- the run ---------------------------------------------------------------------------------


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
    parser.add_argument(
        "--workload",
        choices=list(WORKLOADS),
        default=None,
        help="the peer libraries on a real workload (module docstring); --env and --kinds "
        "are then unused",
    )
    parser.add_argument(
        "--peers-python",
        default=peer_child.PEERS_PYTHON,
        help="interpreter of the venv with EnvPool and PufferLib (--workload only)",
    )
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--plot", type=pathlib.Path, default=None, help="default: --out as .png")
    args = parser.parse_args()
    args.peers_python = shutil.which(args.peers_python) or args.peers_python  # "python3" too
    plot_path = args.plot or (args.out.with_suffix(".png") if args.out else None)
    if plot_path:
        try:  # before the run, not after
            plot.require_matplotlib("peers.py's plot")
        except ImportError as err:
            parser.error(str(err))

    started = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.0f} s] {message}", file=sys.stderr, flush=True)

    skipped: dict[str, str] = {}
    rllib_reason = "off (--no-rllib)" if args.no_rllib else rllib_unavailable()
    if rllib_reason:
        skipped["rllib"] = rllib_reason
    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    peer_versions: dict[str, Any] = {}
    unavailable: dict[str, str] = {}
    if args.workload:
        reason = get_workload(args.workload).unavailable()
        if reason:
            parser.error(f"--workload {args.workload}: {reason}")
        peer_versions, unavailable = peer_child.probe(args.peers_python)
        if args.no_rllib:
            unavailable["rllib"] = "off (--no-rllib)"
        if "rllib" not in unavailable or not rllib_reason:  # RLlib runs in one venv
            skipped.pop("rllib", None)
        else:
            skipped["rllib"] = f"{unavailable['rllib']}; in this venv: {rllib_reason}"
        for peer, why in unavailable.items():
            if peer != "rllib":
                skipped[peer] = why
            log(f"skip {peer} in the peers' venv: {why}")
    with contextlib.ExitStack() as stack:
        harness = stack.enter_context(bench.Harness())
        children = harness.info()
        peers_child = None
        if args.workload and len(unavailable) < len(peer_child.PEER_MODULES):
            peers_child = stack.enter_context(peer_child.start(args.peers_python))
            children["peers"] = peers_child.request("info")
        if args.workload:
            rows = workload_rows(
                args, harness, peers_child, unavailable, rllib_reason, skipped, log
            )
        for kind in [] if args.workload else args.kinds:
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
                        local["rllib"] = rllib_system(args.env, width, args.seed)
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
                    labels=peer_labels(),
                )
                for system in local.values():
                    system.close()
                rows.append(row)
    table = markdown_table(rows)
    machine = children["jaxrunner"]["machine"]
    workload = get_workload(args.workload) if args.workload else None
    env = workload.env_id if workload else args.env
    policy = (
        f"{workload.policy_label}, stochastic, jitted"
        if workload
        else "jr.models.mlp_policy: 64-64 tanh MLP, stochastic, jitted"
    )
    steps = workload.steps_per_rollout if workload else 2048
    report = {
        "benchmark": "peers",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "commit": source_commit(),
        "python_executable": sys.executable,
        "config": {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()},
        "env": env,
        "workload": args.workload,
        "policy": policy,
        "rollout_length": f"max(8, {steps} // width) for every system",
        "machine": {**machine, **_versions(("envpool", "gymnax", "ray", "matplotlib"))},
        "peers_venv": {"python": args.peers_python, **peer_versions} if args.workload else None,
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
    if plot_path:
        plot.plot(rows, plot.title(report), plot_path)
        log(f"wrote {plot_path}")
    print(table)
    print(report["verdict"])


if __name__ == "__main__":
    main()
