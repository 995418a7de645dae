"""Where the test suite's CPU time goes: which processes, and how much of the test
processes' own time JAX spends tracing, lowering and loading compiled programs.

Runs ``python -m pytest`` (the README's test command, with any extra arguments after
``--``) while it reads every process's CPU time from ``/proc`` twice a second; a process
counts with the last CPU time read (one that ends between two reads loses up to half
a second). Processes are grouped by kind: the pytest processes (the xdist workers run
the tests), Ray's workers (an actor each) and its own services, the process backend's
fork server and workers, notebook kernels, and each other command (a docs page's
script, a benchmark's child). In the pytest processes, this file is also a pytest plugin
(``-p suite_cpu``) that adds up JAX's compile events: tracing, lowering to MLIR (which
a persistent-cache hit still pays: the cache's key is the lowered program) and the
backend compile, which holds the cache reads; in all, and per test. The suite is CPU-bound on 2
cores (``-n 3`` took as long as ``-n 2``), so its wall time falls only with its CPU.

Usage (Linux only)::

    python benchmarks/suite_cpu.py --out benchmarks/results/suite_cpu_20261202_cpu.json
    python benchmarks/suite_cpu.py -- tests/test_ray.py -k Contract
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
COMPILE_EVENTS = "JAXRUNNER_SUITE_CPU_EVENTS"
"""The folder where each pytest process writes its JAX event totals."""
CACHE_READ = "/jax/compilation_cache/cache_retrieval_time_sec"

KINDS = (
    ("ray worker", ("default_worker.py", "ray::")),
    ("ray services", ("raylet", "gcs_server", "dashboard", "runtime_env", "log_monitor")),
    ("process backend", ("multiprocessing.forkserver", "multiprocessing.spawn")),
    ("notebook kernel", ("ipykernel",)),
    ("pytest", (" -m pytest", "exec(eval(sys.stdin.readline()))")),  # xdist's workers: -c
)


def kind_of(cmdline: str) -> str:
    for kind, marks in KINDS:
        if any(mark in cmdline for mark in marks):
            return kind
    words = cmdline.split()
    script = next((w for w in words[1:] if not w.startswith("-")), words[0] if words else "?")
    return "other: " + os.path.basename(script)


def read_processes(seen: dict[int, list[Any]], skip: set[int]) -> None:
    """Updates ``seen`` (pid -> [cpu seconds, command line]) from ``/proc``."""
    ticks = os.sysconf("SC_CLK_TCK")
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        pid = int(name)
        try:
            stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            cpu = (int(fields[11]) + int(fields[12])) / ticks
            if pid not in seen:
                raw = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
                seen[pid] = [0.0, raw.replace(b"\0", b" ").decode(errors="replace").strip()]
            seen[pid][0] = max(seen[pid][0], cpu)
        except (OSError, ValueError, IndexError):  # ended meanwhile
            continue


# The plugin half: loaded in every pytest process by ``-p suite_cpu``.
_EVENTS: collections.Counter[str] = collections.Counter()
_PER_TEST: collections.Counter[str] = collections.Counter()
"""Each test's time in JAX's trace, lowering and compile events."""


def pytest_configure(config: Any) -> None:
    if os.environ.get(COMPILE_EVENTS):
        import jax

        def add(name: str, seconds: float, **_: Any) -> None:
            # Time spent (not the cache's estimate of time saved).
            if name.startswith("/jax/core/compile/") or name == CACHE_READ:
                _EVENTS[name] += seconds
            if name.startswith("/jax/core/compile/"):  # (the compile holds the cache reads)
                test = os.environ.get("PYTEST_CURRENT_TEST", "outside a test")
                _PER_TEST[test.rsplit(" ", 1)[0]] += seconds

        jax.monitoring.register_event_duration_secs_listener(add)


def pytest_unconfigure(config: Any) -> None:
    folder = os.environ.get(COMPILE_EVENTS)
    if folder and _EVENTS:
        import resource

        usage = resource.getrusage(resource.RUSAGE_SELF)
        totals = {"cpu_s": usage.ru_utime + usage.ru_stime, **_EVENTS}
        report = {"totals": totals, "per_test": _PER_TEST}
        pathlib.Path(folder, f"{os.getpid()}.json").write_text(json.dumps(report))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=None, help="write the JSON here")
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments")
    args = parser.parse_args()
    if not pathlib.Path("/proc/self/stat").exists():
        sys.exit("suite_cpu.py reads /proc: it runs on Linux only.")
    from jaxrunner._src.bench import machine_info

    events = pathlib.Path(os.environ.get("TMPDIR", "/tmp"), f"suite_cpu_{os.getpid()}")
    events.mkdir(exist_ok=True)
    env = {
        **os.environ,
        COMPILE_EVENTS: str(events),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "-m", "pytest", "-p", "suite_cpu", *args.pytest_args]
    before: dict[int, list[Any]] = {}
    read_processes(before, set())  # what runs already is not the suite's
    skip = {*before, os.getpid()}
    seen: dict[int, list[Any]] = {}
    start = time.perf_counter()
    with subprocess.Popen(command, cwd=HERE.parent, env=env) as suite:
        while suite.poll() is None:
            read_processes(seen, skip)
            time.sleep(0.5)
    wall = time.perf_counter() - start
    by_kind: dict[str, dict[str, float]] = collections.defaultdict(lambda: {"cpu_s": 0, "n": 0})
    for cpu, cmdline in seen.values():
        row = by_kind[kind_of(cmdline)]
        row["cpu_s"] += cpu
        row["n"] += 1
    total = sum(row["cpu_s"] for row in by_kind.values())
    jax_events: collections.Counter[str] = collections.Counter()
    per_test: collections.Counter[str] = collections.Counter()
    for path in events.glob("*.json"):
        part = json.loads(path.read_text())
        jax_events.update(part["totals"])
        per_test.update(part["per_test"])
        path.unlink()
    events.rmdir()
    report = {
        "command": " ".join(sys.argv),
        "pytest_exit_code": suite.returncode,
        "wall_s": wall,
        "cpu_s": total,
        "kinds": dict(sorted(by_kind.items(), key=lambda kv: -kv[1]["cpu_s"])),
        "test_processes_jax_s": dict(jax_events),
        "tests_jax_compile_s": {"total": sum(per_test.values()), "tests": len(per_test)},
        "slowest_tests_jax_compile_s": dict(per_test.most_common(30)),
        "machine": machine_info(),
    }
    print(f"wall {wall:.0f} s, CPU {total:.0f} s ({total / wall:.2f} cores)")
    for kind, row in list(report["kinds"].items())[:15]:
        print(f"{row['cpu_s']:8.1f} s {row['n']:5.0f} processes  {kind}")
    if jax_events:
        print("in the pytest processes (CPU s, then JAX's events, s):")
        for name, seconds in jax_events.most_common():
            print(f"{seconds:8.1f}  {name}")
        print(f"the tests with the most (of {sum(per_test.values()):.0f} s in {len(per_test)}):")
        for test, seconds in per_test.most_common(10):
            print(f"{seconds:8.1f}  {test}")
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    sys.exit(suite.returncode)


if __name__ == "__main__":
    main()
