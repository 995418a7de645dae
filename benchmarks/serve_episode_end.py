"""Memory and time of ending a long image episode in an ExternalEnv (issue 30, item 8).

An ``ExternalEnv`` with Atari-shaped observations (uint8 84x84x4, 28 KiB a step) and a
memory budget ``--budget-mib`` logs one episode until it holds ``--fill`` of the budget,
then ends it. Measured, in this process (Linux ``/proc``):

* ``rss_growth_mib``: the peak resident memory while ending (``VmHWM``, reset just
  before through ``/proc/self/clear_refs``) minus the resident memory before;
* ``episode_mib``: the episode's bytes as the budget charges them;
* ``end_s``: the wall time of ``end_episode`` (the stacking runs off the env's lock);
* ``action_p99_ms``/``action_max_ms``: the latency of another episode's
  ``get_action`` calls made from a second thread while the long one ends.

The bound asked for is ``rss_growth_mib`` well under ``episode_mib``: the stacked copy
replaces the rows as it goes, instead of doubling the episode. ``without_trim`` is the
same run, in a fresh process, with the freed rows left in the C heap (the behaviour
before the trims): there the copy doubles the episode.

Usage::

    python benchmarks/serve_episode_end.py --budget-mib 512 --out \\
        benchmarks/results/serve_episode_end_cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import gymnasium
import jax
import numpy as np

import jaxrunner as jr
from jaxrunner._src import bench

OBS_SPACE = gymnasium.spaces.Box(0, 255, (84, 84, 4), np.uint8)
ACTION_SPACE = gymnasium.spaces.Discrete(6)


def _status_kib(field: str) -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    pathlib.Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


def run(budget_mib: int, fill: float, seed: int) -> dict:
    policy = bench.mlp_policy(ACTION_SPACE, hidden=(16,))
    params = policy.init(jax.random.key(0), OBS_SPACE)
    config = jr.ExternalEnvConfig(max_batch=1, buckets=(1,), max_memory_bytes=budget_mib << 20)
    rng = np.random.default_rng(seed)
    with jr.ExternalEnv(OBS_SPACE, ACTION_SPACE, policy, params, seed=seed, config=config) as env:
        long_id, other_id = env.start_episode(), env.start_episode()
        obs = rng.integers(0, 256, OBS_SPACE.shape, np.uint8)
        env.get_action(other_id, obs)
        steps = int(fill * (budget_mib << 20) / obs.nbytes)
        for _ in range(steps):  # a fresh array a step, as a request's body would be
            env.get_action(long_id, rng.integers(0, 256, OBS_SPACE.shape, np.uint8))
            env.log_returns(long_id, 1.0)
        used_mib = env.get_metrics()["memory_bytes"] / 2**20
        latencies: list[float] = []
        ending = threading.Event()

        def other_agent() -> None:
            while not ending.is_set():
                tick = time.perf_counter()
                env.get_action(other_id, obs)
                latencies.append(time.perf_counter() - tick)

        rss_before = _status_kib("VmRSS")
        _reset_peak()
        agent = threading.Thread(target=other_agent)
        agent.start()
        tick = time.perf_counter()
        env.end_episode(long_id, obs)
        end_s = time.perf_counter() - tick
        ending.set()
        agent.join()
        peak = _status_kib("VmHWM")
        (episode,) = [e for e in env.poll_episodes() if e.episode_id == 0 or e.length == steps]
        assert episode.length == steps, (episode.length, steps)
    ms = 1000.0 * np.asarray(latencies or [0.0])
    return {
        "steps": steps,
        "budget_mib": budget_mib,
        "episode_mib": used_mib,
        "stacked_obs_mib": episode.obs.nbytes / 2**20,
        "rss_before_mib": rss_before / 1024,
        "rss_growth_mib": (peak - rss_before) / 1024,
        "end_s": end_s,
        "other_actions_during_end": len(latencies),
        "action_p99_ms": float(np.percentile(ms, 99)),
        "action_max_ms": float(ms.max()),
    }


WITHOUT_TRIM = """
import json, sys
sys.path.insert(0, "benchmarks")
from jaxrunner._src.services.external import episodes
episodes.release_freed_memory = lambda: None
import serve_episode_end
print(json.dumps(serve_episode_end.run(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]))))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-mib", type=int, default=512, help="max_memory_bytes, in MiB")
    parser.add_argument("--fill", type=float, default=0.9, help="share of the budget logged")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()
    loadavg_start = os.getloadavg()
    result = run(args.budget_mib, args.fill, args.seed)
    # The same without handing freed rows back while stacking (the behaviour before),
    # in a fresh process so that the first run's heap does not serve the second.
    without = subprocess.run(
        [sys.executable, "-c", WITHOUT_TRIM, str(args.budget_mib), str(args.fill), str(args.seed)],
        check=True,
        capture_output=True,
        text=True,
    )
    report = {
        "benchmark": "serve_episode_end",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "command": " ".join(["python", *sys.argv]),
        "machine": bench.machine_info(),
        "loadavg_start": loadavg_start,
        "loadavg_end": os.getloadavg(),
        "result": result,
        "without_trim": json.loads(without.stdout),
    }
    text = json.dumps(report, indent=2)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
