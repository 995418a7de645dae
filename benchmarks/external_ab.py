"""A/B of the in-process ExternalEnv path between two checkouts (no HTTP).

Each round runs, in a fresh subprocess per checkout (``PYTHONPATH`` set to it,
alternating A, B, A, B, ...), ``--agents`` threads that each play CartPole-spaced
episodes of ``--episode-steps`` steps against one ``ExternalEnv`` (a 64-64 MLP policy,
default config): ``start_episode``, then ``get_action`` + ``log_returns`` per step, then
``end_episode``, until ``--steps`` steps in all. It reports, per run, steps/s and the
process's CPU time per step (all threads: agents and batcher), and the ratios of the
medians (B over A; CPU time is the steadier of the two on a loaded, shared machine).

Usage::

    python benchmarks/external_ab.py --a /work/main --b . --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

WORKLOAD = r"""
import json, sys, threading, time
import gymnasium, jax, numpy as np
import jaxrunner as jr
from jaxrunner.models import mlp_policy

agents, steps, episode_steps = (int(a) for a in sys.argv[1:4])
game = gymnasium.make("CartPole-v1")
policy = mlp_policy(game.action_space, hidden=(64, 64))
params = policy.init(jax.random.key(0), game.observation_space)
obs = np.zeros(4, np.float32)

def play(env, n):
    done = 0
    while done < n:
        eid = env.start_episode()
        for _ in range(min(episode_steps, n - done)):
            env.get_action(eid, obs)
            env.log_returns(eid, 1.0)
            done += 1
        env.end_episode(eid, obs)

with jr.ExternalEnv(game.observation_space, game.action_space, policy, params) as env:
    play(env, 200)  # warm-up: compile the buckets a single agent uses
    threads = [threading.Thread(target=play, args=(env, 64)) for _ in range(agents)]
    [t.start() for t in threads]; [t.join() for t in threads]  # warm-up: larger buckets
    env.poll_episodes()
    per_agent = steps // agents
    threads = [threading.Thread(target=play, args=(env, per_agent)) for _ in range(agents)]
    started, cpu = time.perf_counter(), time.process_time()
    [t.start() for t in threads]; [t.join() for t in threads]
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    assert sum(e.length for e in env.poll_episodes()) == per_agent * agents
n = per_agent * agents
print(json.dumps({"steps_per_s": n / elapsed, "cpu_us_per_step": 1e6 * cpu / n}))
"""


def run(checkout: str, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(checkout), "JAX_PLATFORMS": "cpu"}
    argv = [str(args.agents), str(args.steps), str(args.episode_steps)]
    out = subprocess.run(
        [sys.executable, "-c", WORKLOAD, *argv], env=env, capture_output=True, text=True
    )
    if out.returncode:
        raise RuntimeError(f"{checkout}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="checkout A (the baseline)")
    parser.add_argument("--b", required=True, help="checkout B")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8000)
    parser.add_argument("--episode-steps", type=int, default=50)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
    for round_index in range(args.rounds):
        for name in ("a", "b") if round_index % 2 == 0 else ("b", "a"):
            results[name].append(run(getattr(args, name), args))
        a, b = results["a"][-1], results["b"][-1]
        print(f"round {round_index}: a {a}, b {b}")
    summary: dict[str, object] = {"a": args.a, "b": args.b, "runs": results}
    for key in ("steps_per_s", "cpu_us_per_step"):
        a, b = (statistics.median(r[key] for r in results[n]) for n in ("a", "b"))
        summary[key] = {"median_a": a, "median_b": b, "ratio_b_over_a": b / a}
    print(json.dumps({**summary, "loadavg": os.getloadavg()}))


if __name__ == "__main__":
    main()
