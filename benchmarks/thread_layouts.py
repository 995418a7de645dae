"""Where the threads of EnvPool's async mode driven by hand run, on a host of few CPUs:
whether the policy, EnvPool's threads and the loop's own Python get out of each other's
way when each has CPUs of its own.

Per workload and width, each system in a child process of its own at JAX's defaults
(asynchronous CPU dispatch), timed in interleaved rounds:

* ``hand_sync``: EnvPool's sync mode by hand (``jaxrunner bench``'s recording loop);
* ``hand_async``: EnvPool's async mode by hand at EnvPool's defaults
  (``peer_loops.EnvPoolAsyncLoop``, half the envs a batch);
* the same async loop with EnvPool on every CPU but the policy's first ``--policy-cpus``,
  in three layouts: ``free`` (no placement), ``pinned`` (EnvPool's threads on their
  CPUs by its ``thread_affinity_offset``, every other thread on the policy's) and
  ``split`` (as pinned, but the loop's own thread beside EnvPool's: the policy's CPUs
  run only JAX's threads); each also with ``--work-us`` of Python per batch between the
  policy's dispatch and the read of its result (``+work``), standing for what a
  sampler does per batch besides the hand loop's work;
* ``jaxrunner``: ``EnvRunner.sample()`` on the ``"envpool"`` backend at its defaults
  (EnvPool's sync mode), and ``jaxrunner_pinned``: on its async mode in the ``pinned``
  layout, acting on each batch as the hand loop does (``chunk_rows`` = the batch), both
  at jaxrunner's own CPU dispatch (inline).

Reports each system's median env steps/s, the CPUs it kept busy, and its ratio to the
faster hand loop at EnvPool's defaults. Linux only (thread affinity); EnvPool numbers its
threads' CPUs from the offset, so the CPUs must be numbered without gaps.

Usage (the ``envpool`` extra, and ``atari`` for Pong)::

    python benchmarks/thread_layouts.py --workload pong --widths 8 32 \
        --out benchmarks/results/thread_layouts_pong_cpu.json
"""

from __future__ import annotations

import os
import sys

LAYOUT_VARIABLE = "JAXRUNNER_BENCH_THREAD_LAYOUT"
"""A child's layout: ``"<layout> <work_us> <policy CPUs> <EnvPool's CPUs>"`` (CPUs as
``0,1``), set by the parent."""


def _cpus(text: str) -> set[int]:
    return {int(c) for c in text.split(",")}


if __name__ == "__main__" and "--child" in sys.argv and os.environ.get(LAYOUT_VARIABLE):
    # Before JAX starts its threads: they take this thread's CPUs.
    _layout, _, _policy_cpus, _ = os.environ[LAYOUT_VARIABLE].split()
    if _layout not in ("defaults", "free"):
        os.sched_setaffinity(0, _cpus(_policy_cpus))

import argparse  # noqa: E402  (after the placement above, as JAX's import must be)
import dataclasses  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from peer_loops import EnvPoolAsyncLoop  # noqa: E402
from script_report import write_report  # noqa: E402

from jaxrunner._src.bench import child, systems  # noqa: E402
from jaxrunner._src.bench.workloads import get_workload  # noqa: E402

LAYOUTS = ("free", "pinned", "split")


def _busy(work_us: float) -> Any:
    """``meanwhile`` for the loop: ``work_us`` of copies of the batch's observations."""
    scratch: dict[int, np.ndarray] = {}

    def meanwhile(obs: np.ndarray, t: int) -> None:
        buf = scratch.get(0)
        if buf is None:
            buf = scratch[0] = np.zeros((8, *obs.shape), obs.dtype)
        end = time.perf_counter() + work_us * 1e-6
        while time.perf_counter() < end:
            buf[t % 8] = obs

    return meanwhile


def build(spec: systems.Spec) -> Any:
    """The system ``spec`` names: a hand loop of ``jaxrunner bench`` (sync mode), the
    async loop at EnvPool's defaults or in the layout of this child's environment, or
    jaxrunner's runner (in it too, where the spec's options place EnvPool's threads)."""
    if spec.system == "jaxrunner":
        return PlacedRunner(spec)
    if spec.reference == "envpool":
        return systems.build(spec)
    work = get_workload(str(spec.workload))
    kwargs, meanwhile = dict(work.envpool_kwargs), None
    layout, work_us, _, envpool_text = os.environ[LAYOUT_VARIABLE].split()
    envpool_cpus = _cpus(envpool_text)
    if layout != "defaults":
        kwargs["num_threads"] = len(envpool_cpus)
        if layout != "free":
            kwargs["thread_affinity_offset"] = min(envpool_cpus)
        if float(work_us):
            meanwhile = _busy(float(work_us))
    loop = EnvPoolAsyncLoop(
        work.envpool_id, kwargs, spec.num_envs, spec.rollout_length, spec.seed,
        lambda obs_space, action_space: systems.spec_policy(spec, obs_space, action_space),
        meanwhile,
    )  # fmt: skip
    system = Placed(loop.rollout, loop.close)  # (warmed up: JAX started)
    if layout == "split":  # this thread beside EnvPool's; JAX's keep the policy's CPUs
        os.sched_setaffinity(0, envpool_cpus)
    return system


def placement() -> dict[str, Any]:
    """Where this process's threads may run: the calling thread's CPUs, and each set of
    CPUs some thread has."""
    sets = set()
    for task in os.listdir("/proc/self/task"):
        try:
            sets.add(tuple(sorted(os.sched_getaffinity(int(task)))))
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
    return {"loop_cpus": sorted(os.sched_getaffinity(0)), "thread_cpus": sorted(sets)}


class Placed(systems.RolloutSystem):
    """A hand loop whose measures also say where its threads may run."""

    def measure(self, seconds: float) -> dict[str, Any]:
        return {**super().measure(seconds), **placement()}


class PlacedRunner(systems.JaxrunnerSystem):
    """``EnvRunner.sample()`` whose measures also say where its threads may run."""

    def measure(self, seconds: float) -> dict[str, Any]:
        return {**super().measure(seconds), **placement()}


def cpu_sets(policy_cpus: int) -> tuple[list[int], list[int]]:
    """The policy's CPUs (the first ``policy_cpus`` of this process's) and EnvPool's (the
    rest)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) <= policy_cpus or cpus != list(range(cpus[0], cpus[0] + len(cpus))):
        raise SystemExit(
            f"thread_layouts: CPUs {cpus}: need more than --policy-cpus={policy_cpus}, "
            "numbered without gaps (EnvPool pins its threads from an offset)."
        )
    return cpus[:policy_cpus], cpus[policy_cpus:]


def _start(name: str, layout: str, work_us: float, policy_cpus: int) -> child.Child:
    policy, envpool = (",".join(map(str, cpus)) for cpus in cpu_sets(policy_cpus))
    os.environ[LAYOUT_VARIABLE] = f"{layout} {work_us} {policy} {envpool}"
    try:
        command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--child"]
        # The hand loops at JAX's defaults, jaxrunner at its own.
        jax_defaults = not name.startswith("jaxrunner")
        return child.Child(name, jax_defaults=jax_defaults, command=command)
    finally:
        del os.environ[LAYOUT_VARIABLE]


def specs(args: argparse.Namespace, width: int) -> dict[str, tuple[systems.Spec, str, float]]:
    """Each system's spec, layout and extra work per batch (µs), by name."""
    work = get_workload(args.workload)
    common = {
        "backend": "envpool", "env": work.env_id, "num_envs": width,
        "rollout_length": work.rollout_length(width), "workload": args.workload,
    }  # fmt: skip

    def hand(reference: str) -> systems.Spec:
        return systems.Spec(system="hand", reference=reference, **common)

    out = {
        "hand_sync": (hand("envpool"), "defaults", 0.0),
        "hand_async": (hand("envpool_async"), "defaults", 0.0),
    }
    for layout in LAYOUTS:
        out[layout] = (hand("envpool_async"), layout, 0.0)
        if args.work_us:
            out[f"{layout}+work"] = (hand("envpool_async"), layout, args.work_us)
    envpool_cpus = cpu_sets(args.policy_cpus)[1]
    pinned = {
        "batch_size": width // 2,
        "num_threads": len(envpool_cpus),
        "thread_affinity_offset": envpool_cpus[0],
    }
    out["jaxrunner"] = (systems.Spec(system="jaxrunner", **common), "defaults", 0.0)
    out["jaxrunner_pinned"] = (  # acting on each batch, as the hand loop does
        systems.Spec(system="jaxrunner", env_kwargs=pinned, chunk_rows=width // 2, **common),
        "pinned",
        0.0,
    )
    return out


def measure(args: argparse.Namespace, width: int) -> dict[str, Any]:
    systems_at = specs(args, width)
    children: dict[str, child.Child] = {}
    rates: dict[str, list[float]] = {name: [] for name in systems_at}
    cores: dict[str, list[float]] = {name: [] for name in systems_at}
    placement: dict[str, Any] = {}
    try:
        for name, (spec, layout, work_us) in systems_at.items():
            children[name] = _start(name, layout, work_us, args.policy_cpus)
            children[name].request("build", name=name, spec=dataclasses.asdict(spec))
        names = list(systems_at)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                out = children[name].request("measure", name=name, seconds=args.seconds)
                rates[name].append(out["steps_per_s"])
                cores[name].append(out["cpu_s"] / out["wall_s"])
                placement[name] = {k: out[k] for k in ("loop_cpus", "thread_cpus") if k in out}
    finally:
        for c in children.values():
            c.close()
    median = {name: statistics.median(r) for name, r in rates.items()}
    best = max(("hand_sync", "hand_async"), key=median.__getitem__)
    return {
        "num_envs": width,
        "rollout_length": get_workload(args.workload).rollout_length(width),
        "median_steps_per_s": median,
        "cores": {name: statistics.median(c) for name, c in cores.items()},
        "placement": placement,
        "best_hand": best,
        "ratio_to_best_hand": {name: m / median[best] for name, m in median.items()},
        "rounds": rates,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=("cartpole", "pong", "halfcheetah"), default="pong")
    parser.add_argument("--widths", type=int, nargs="+", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--work-us", type=float, default=500.0, help="0: no +work systems")
    parser.add_argument("--policy-cpus", type=int, default=1)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()
    results = []
    for width in args.widths or get_workload(args.workload).widths:
        row = measure(args, width)
        results.append(row)
        line = ", ".join(
            f"{name} {row['median_steps_per_s'][name]:,.0f} ({ratio:.2f}x, "
            f"{row['cores'][name]:.2f} CPUs)"
            for name, ratio in row["ratio_to_best_hand"].items()
        )
        print(f"{args.workload} x{width}: {line}", file=sys.stderr)
    write_report("thread_layouts", args, results)


if __name__ == "__main__":
    if "--child" in sys.argv:
        child.main(build)
    else:
        main()
