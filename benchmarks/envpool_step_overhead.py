"""What jaxrunner's EnvPool adapter adds to EnvPool's own step, and why it weighs more
than its own work.

Per width, on CartPole-v1 in sync mode, microseconds per call, each part timed alone
in blocks of calls, interleaved round by round (medians of the rounds kept):

* ``envpool_step``: EnvPool's ``step`` called back to back, nothing between;
* ``envpool_calls``: the same step through
  :class:`~jaxrunner._src.backends.envpool_calls.EnvPoolCalls`, EnvPool's C++ calls
  without its Python layer (what the adapter steps with);
* ``envpool_step_then_10us``: the same with 10 us of busy work after each step (any
  loop does work between steps: a policy call, recording), minus the 10 us;
* ``adapter_work``: the adapter's own checks and copies around a step, timed alone on
  a step's outputs (actions checked, rewards stored and checked, observations checked
  and copied for ``reset_at``, the ended envs noted);
* ``step_batch``: ``EnvPoolVectorEnv(keep_reset_steps=True).step_batch``, back to
  back: ``envpool_calls`` plus the adapter's work;
* ``send_after_{g}us`` and ``recv_after_{g}us`` (``--gaps``): EnvPool's C++ send and
  recv timed apart, each step after ``g`` us of busy work (a loop's policy and
  recording between a recv and the next send).

EnvPool's worker threads keep polling for the next batch after a step, so on a machine
with fewer cores than threads the work that follows a step runs beside them and slows
the next step down: the difference between ``envpool_step_then_10us`` and
``envpool_step`` is what any loop pays for not calling ``step`` back to back. After a
longer gap the threads have gone to sleep, and the next send pays to wake them: the
``send_after`` parts show how that grows with the gap.

Usage (needs the ``envpool`` extra)::

    python benchmarks/envpool_step_overhead.py --num-envs 8 64 \\
        --out benchmarks/results/envpool_step_overhead_cpu.json
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from script_report import write_report

import jaxrunner as jr
from jaxrunner._src import space_arrays
from jaxrunner._src.bench import machine_info

BUSY_S = 10e-6


def _busy(seconds: float = BUSY_S) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def gap_parts(num_envs: int, gaps_us: list[float]) -> dict[str, Callable[[], float]]:
    """Per gap: a step after that much busy work, returning its C++ send's and recv's
    seconds (``send_after_{g}us`` and ``recv_after_{g}us``)."""
    vec = jr.make_vec("CartPole-v1", num_envs, backend="envpool", keep_reset_steps=True)
    vec.reset_batch([None] * num_envs)
    calls, actions = vec._calls, np.zeros(num_envs, np.int64)
    parts: dict[str, Callable[[], float]] = {}
    for gap in gaps_us:

        def step(gap_s: float = gap * 1e-6) -> Any:
            _busy(gap_s)
            start = time.perf_counter()
            calls.send(actions)
            sent = time.perf_counter()
            calls.recv()
            return sent - start, time.perf_counter() - sent

        parts[f"after_{gap:g}us"] = step
    return parts


def parts(num_envs: int) -> dict[str, Callable[[], object]]:
    """The timed calls (see the module docstring), on one EnvPool pool."""
    vec = jr.make_vec("CartPole-v1", num_envs, backend="envpool", keep_reset_steps=True)
    vec.reset_batch([None] * num_envs)
    actions = np.zeros(num_envs, np.int64)
    out = vec._calls.step(actions)
    space = vec.single_observation_space

    def adapter_work() -> None:  # EnvPoolVectorEnv._answer's own work, on one step's outputs
        vec._check_actions(actions)
        vec._reward[:] = out.reward
        math.isfinite(vec._reward.dot(vec._reward))
        vec._obs_finite(out.obs)
        vec._terminated[:] = out.terminated
        vec._truncated[:] = out.truncated
        space_arrays.copy_into(space, vec._obs, out.obs)
        vec._ended = vec._terminated | vec._truncated

    def step_then_busy() -> None:
        vec.env.step(actions)
        _busy()

    return {
        "envpool_step": lambda: vec.env.step(actions),
        "envpool_calls": lambda: vec._calls.step(actions),
        "envpool_step_then_10us": step_then_busy,
        "adapter_work": adapter_work,
        "step_batch": lambda: vec.step_batch(actions),
    }


def measure(num_envs: int, rounds: int, calls: int, gaps_us: list[float]) -> dict:
    timed = parts(num_envs)
    gapped = gap_parts(num_envs, gaps_us)
    for fn in [*timed.values(), *gapped.values()]:  # warm up
        for _ in range(200):
            fn()
    us: dict[str, list[float]] = {name: [] for name in timed}
    us |= {f"{call}_{name}": [] for name in gapped for call in ("send", "recv")}
    for k in range(rounds):
        for name in list(timed) if k % 2 == 0 else list(reversed(timed)):
            fn = timed[name]
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            us[name].append(1e6 * (time.perf_counter() - start) / calls)
        for name in list(gapped) if k % 2 == 0 else list(reversed(gapped)):
            sums = np.sum([gapped[name]() for _ in range(calls)], axis=0)
            us[f"send_{name}"].append(1e6 * sums[0] / calls)
            us[f"recv_{name}"].append(1e6 * sums[1] / calls)
    us["envpool_step_then_10us"] = [t - 1e6 * BUSY_S for t in us["envpool_step_then_10us"]]
    return {
        "num_envs": num_envs,
        "median_us": {name: statistics.median(t) for name, t in us.items()},
        "rounds_us": us,
        "load_average": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--num-envs", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=2000, help="calls per part per round")
    parser.add_argument(
        "--gaps", type=float, nargs="*", default=[10, 50, 200, 400],
        help="us of busy work before the send_after/recv_after steps",
    )  # fmt: skip
    parser.add_argument("--out", type=pathlib.Path, help="write the results here as JSON")
    args = parser.parse_args()
    results = []
    for n in args.num_envs:
        row = measure(n, args.rounds, args.calls, args.gaps)
        results.append(row)
        print(
            f"{n} envs: " + ", ".join(f"{k} {v:.1f}" for k, v in row["median_us"].items())
            + f" us | load {row['load_average'][0]:.2f}",
            file=sys.stderr, flush=True,
        )  # fmt: skip
    import envpool  # type: ignore[import-not-found]  # the benchmark's own venv

    write_report(
        "envpool_step_overhead", args, results, machine_info() | {"envpool": envpool.__version__}
    )


if __name__ == "__main__":
    main()
