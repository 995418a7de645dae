"""Soak: millions of env steps on ``backend="process"`` with faults of every kind.

CartPole-v1 sub-envs wrapped by :func:`jaxrunner.testing.faulty_env_fns` raise, hang,
exit, get SIGKILLed, segfault, return NaN rewards and badly shaped observations (in
``step``; and raise, return bad observations or exit in ``reset``), about
``--fault-rate`` per call in all. An ``EnvRunner`` on envs built with a ``restart_policy`` samples
through it all, with a short ``step_timeout_s`` so that hangs resolve fast.

Every ``--record-every`` env steps it records the resident memory (RSS) of the main
process and of each worker, the main process's open file descriptors, and the
accounting, checked exactly against a cross-process :class:`~jaxrunner.testing.CallLog`
kept by the envs themselves:

* good ``env.step`` calls (``step_ok``) = valid transitions (``num_env_steps``) +
  steps whose results died with their worker (``num_lost_steps``);
* failed calls (``step_failed``) = dropped slots (``num_dropped_steps``) - lost steps
  - slots of replaced workers' envs that never started their step
  (``num_unrun_steps``).

Target: zero unaccounted steps, RSS growth after warm-up within 5%.

Usage (a fairer CPU share on a shared machine)::

    setsid bash -c 'echo -10 > /proc/self/autogroup; exec python benchmarks/soak.py \\
        --out benchmarks/results/soak_cpu.json'
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import pathlib
import sys
import tempfile
import time
from typing import Any

import gymnasium
import jax

import jaxrunner as jr
from jaxrunner._src import bench
from jaxrunner.testing import CallLog, FaultPlan, faulty_env_fns

STEP_KINDS = ("raise", "hang", "exit", "kill", "segfault", "nan_reward", "bad_obs")
RESET_KINDS = ("raise", "bad_obs", "exit")


def rss_bytes(pid: int) -> int | None:
    """Resident memory of process ``pid`` (psutil if installed, else /proc)."""
    try:
        import psutil

        return int(psutil.Process(pid).memory_info().rss)
    except ImportError:
        pass
    except Exception:  # gone (a worker replaced between listing and reading)
        return None
    try:
        fields = pathlib.Path(f"/proc/{pid}/statm").read_text().split()
    except OSError:
        return None
    return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def live_descendants() -> int:
    """Processes descended from this one that still run (zombies excluded): workers,
    the fork server, anything they left behind."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = pathlib.Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat[0] not in ("Z", "X"):
            parents[int(entry)] = int(stat[1])
    mine, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - mine
        mine |= frontier
    return len(mine)


def faults(rate: float, hang_s: float, per_kind: bool = False) -> list[FaultPlan]:
    """Every kind, ``rate`` per step call in all (and per reset call in all); with
    ``per_kind``, ``rate`` for each kind."""
    n_step, n_reset = (1, 1) if per_kind else (len(STEP_KINDS), len(RESET_KINDS))
    step = [FaultPlan(kind=k, probability=rate / n_step, hang_s=hang_s) for k in STEP_KINDS]
    reset = [FaultPlan(kind=k, call="reset", probability=rate / n_reset) for k in RESET_KINDS]
    return step + reset


def accounting(log: CallLog, metrics: dict[str, Any], envs: jr.ProcessVectorEnv) -> dict[str, int]:
    step_ok, step_failed = log.count("step_ok"), log.count("step_failed")
    lost, unrun = envs.num_lost_steps, envs.num_unrun_steps
    valid, dropped = metrics["num_env_steps"], metrics["num_dropped_steps"]
    return {
        "step_ok": step_ok,
        "step_failed": step_failed,
        "reset_ok": log.count("reset_ok"),
        "reset_failed": log.count("reset_failed"),
        "envs_made": log.count("made"),
        "num_env_steps": valid,
        "num_dropped_steps": dropped,
        "num_faulty_episodes": metrics["num_faulty_episodes"],
        "num_episodes": metrics["num_episodes"],
        "num_lost_steps": lost,
        "num_unrun_steps": unrun,
        "num_restarts": envs.num_restarts,
        "num_worker_restarts": envs.num_worker_restarts,
        # Both must be 0: every env.step call is a valid transition, a lost one or a
        # dropped slot, and every dropped slot a failed call, a lost or an unrun step.
        "unaccounted_ok": step_ok - (valid + lost),
        "unaccounted_failed": step_failed - (dropped - lost - unrun),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2_000_000, help="env step slots in all")
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--rollout-length", type=int, default=128)
    parser.add_argument("--fault-rate", type=float, default=1e-3)
    parser.add_argument(
        "--per-kind", action="store_true", help="--fault-rate for each fault kind, not in all"
    )
    parser.add_argument("--step-timeout", type=float, default=1.0)
    parser.add_argument("--hang-s", type=float, default=3600.0)
    parser.add_argument("--record-every", type=int, default=100_000)
    parser.add_argument("--warmup", type=int, default=200_000, help="steps before the RSS baseline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()

    log = CallLog(tempfile.mkdtemp(prefix="jaxrunner-soak-"))
    base = functools.partial(gymnasium.make, "CartPole-v1")
    plans = faults(args.fault_rate, args.hang_s, args.per_kind)
    fns = faulty_env_fns(base, args.num_envs, plans, log, args.seed)
    restart_policy = jr.RestartPolicy(max_attempts=5, backoff_s=0.05)
    config = jr.ProcessConfig(num_workers=args.num_workers, step_timeout_s=args.step_timeout)
    envs = jr.ProcessVectorEnv(fns, config, restart_policy=restart_policy)
    policy = bench.mlp_policy(envs.single_action_space)
    params = policy.init(jax.random.key(args.seed), envs.single_observation_space)
    runner = jr.EnvRunner(
        envs,
        policy,
        params,
        args.rollout_length,
        args.seed,
    )
    report: dict[str, Any] = {
        "benchmark": "soak",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
        "config": {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()},
        "faults": {"step": list(STEP_KINDS), "reset": list(RESET_KINDS)},
        "machine": bench.machine_info(),
        "autogroup": bench.autogroup(),
        "loadavg_before": os.getloadavg(),
        "target": "RSS growth after warm-up within 5%; zero unaccounted steps",
        "records": [],
    }
    start = time.perf_counter()
    slots, next_record = 0, args.record_every
    with runner:
        while slots < args.steps:
            traj = runner.sample()
            slots += traj.valid.size
            if slots >= next_record or slots >= args.steps:
                next_record += args.record_every
                record = _record(slots, start, log, runner, envs)
                report["records"].append(record)
                print(
                    f"{slots:>9} steps {record['elapsed_s']:7.1f} s "
                    f"{record['steps_per_s']:8.0f}/s main RSS {record['rss_main_mb']:.1f} MB "
                    f"workers {record['rss_workers_mb']} MB fds {record['open_fds']} "
                    f"worker restarts {record['accounting']['num_worker_restarts']} "
                    f"unaccounted {record['accounting']['unaccounted_ok']}"
                    f"/{record['accounting']['unaccounted_failed']}",
                    flush=True,
                )
                _summarise(report, args.warmup)
                if args.out:
                    args.out.write_text(json.dumps(report, indent=2) + "\n")
    report["loadavg_after"] = os.getloadavg()
    report["wall_s"] = time.perf_counter() - start
    _summarise(report, args.warmup)
    print(json.dumps(report["summary"], indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


def _record(
    slots: int, start: float, log: CallLog, runner: jr.EnvRunner, envs: jr.ProcessVectorEnv
) -> dict[str, Any]:
    elapsed = time.perf_counter() - start
    workers = [rss_bytes(pid) for pid in envs.worker_pids if pid is not None]
    main_rss = rss_bytes(os.getpid()) or 0
    return {
        "steps": slots,
        "elapsed_s": round(elapsed, 2),
        "steps_per_s": slots / elapsed,
        "loadavg": os.getloadavg(),
        "rss_main_mb": round(main_rss / 2**20, 2),
        "rss_workers_mb": [round(r / 2**20, 2) for r in workers if r is not None],
        "open_fds": open_fds(),
        "child_processes": live_descendants(),
        "accounting": accounting(log, runner.get_metrics(), envs),
    }


def _summarise(report: dict[str, Any], warmup: int) -> None:
    records = report["records"]
    after = [r for r in records if r["steps"] >= warmup] or records
    base, last = after[0], records[-1]
    growth = (last["rss_main_mb"] - base["rss_main_mb"]) / base["rss_main_mb"]
    worker_growth = None
    if base["rss_workers_mb"] and last["rss_workers_mb"]:
        b, e = max(base["rss_workers_mb"]), max(last["rss_workers_mb"])
        worker_growth = (e - b) / b
    acc = last["accounting"]
    report["summary"] = {
        "steps": last["steps"],
        "steps_per_s": last["steps_per_s"],
        "rss_main_baseline_mb": base["rss_main_mb"],
        "rss_main_last_mb": last["rss_main_mb"],
        "rss_main_growth": growth,
        "rss_main_max_mb": max(r["rss_main_mb"] for r in after),
        "child_processes_max": max(r["child_processes"] for r in records),
        "child_processes_last": records[-1]["child_processes"],
        "rss_worker_growth": worker_growth,
        "open_fds_first_last": [records[0]["open_fds"], last["open_fds"]],
        "unaccounted_steps": abs(acc["unaccounted_ok"]) + abs(acc["unaccounted_failed"]),
        "every_record_exact": all(
            r["accounting"]["unaccounted_ok"] == 0 == r["accounting"]["unaccounted_failed"]
            for r in records
        ),
        "num_worker_restarts": acc["num_worker_restarts"],
        "num_restarts": acc["num_restarts"],
        "num_dropped_steps": acc["num_dropped_steps"],
        "rss_target_met": abs(growth) <= 0.05,
    }


if __name__ == "__main__":
    main()
