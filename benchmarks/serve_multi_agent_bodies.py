"""Liveness of the multi-agent policy server under large bodies: ``/v1/health`` latency
while clients send 1,024-agent ``get_action`` calls (issue 43: p99 14 -> 414 ms when
such bodies were decoded on the event loop).

The server runs in a process of its own (1,024 agents of an MPE-sized Box(18) space,
one 64-64 MLP policy); ``--clients`` processes each loop start, action, end with every
agent; one prober calls ``/v1/health`` every 20 ms on a keep-alive connection.

Usage::

    python3 benchmarks/serve_multi_agent_bodies.py --seconds 20 --clients 2 \\
        --out benchmarks/results/serve_multi_agent_bodies_cpu.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import pathlib
import platform
import time

import numpy as np

AGENTS = 1024
OBS_DIM = 18


def _serve(queue, stop) -> None:
    import jax
    from gymnasium import spaces

    from jaxrunner import ExternalEnvConfig
    from jaxrunner.models import mlp_policy
    from jaxrunner.multi_agent import MultiAgentExternalEnv
    from jaxrunner.serve import PolicyServer

    obs_space = spaces.Box(-10.0, 10.0, (OBS_DIM,), np.float32)
    action_space = spaces.Discrete(5)
    policy = mlp_policy(action_space, hidden=(64, 64))
    params = {"policy_0": policy.init(jax.random.key(0), obs_space)}
    agents = [f"agent_{i}" for i in range(AGENTS)]
    config = ExternalEnvConfig(max_batch=AGENTS, buckets=(AGENTS,), max_wait_ms=1.0)
    with (
        MultiAgentExternalEnv(
            dict.fromkeys(agents, obs_space),
            dict.fromkeys(agents, action_space),
            policy,
            params,
            config=config,
        ) as env,
        PolicyServer(env, require_token=False, max_body_bytes=8 << 20) as server,
    ):
        queue.put(server.url)
        while not stop.wait(0.5):
            env.poll_episodes()


def _client(url: str, seconds: float, counts) -> None:
    from jaxrunner.serve import MultiAgentPolicyClient

    rng = np.random.default_rng(0)
    obs = {f"agent_{i}": rng.uniform(-1, 1, OBS_DIM).astype(np.float32) for i in range(AGENTS)}
    deadline = time.monotonic() + seconds
    with MultiAgentPolicyClient(url) as client:
        while time.monotonic() < deadline:
            eid = client.start_episode()
            for _ in range(4):
                client.get_action(eid, obs)
                counts.put(1)
            client.end_episode(eid, obs)


def run(seconds: float, clients: int) -> dict:
    import httpx

    ctx = multiprocessing.get_context("spawn")
    queue, stop, counts = ctx.Queue(), ctx.Event(), ctx.Queue()
    server = ctx.Process(target=_serve, args=(queue, stop))
    server.start()
    url = queue.get(timeout=120)
    loaders = [ctx.Process(target=_client, args=(url, seconds, counts)) for _ in range(clients)]
    latencies = {"idle": [], "loaded": []}
    with httpx.Client(base_url=url) as http:
        for _ in range(100):  # before the load
            started = time.perf_counter()
            http.get("/v1/health").raise_for_status()
            latencies["idle"].append(time.perf_counter() - started)
            time.sleep(0.02)
        for p in loaders:
            p.start()
        time.sleep(3.0)  # the clients import jax and connect
        deadline = time.monotonic() + seconds - 4.0
        while time.monotonic() < deadline:
            started = time.perf_counter()
            http.get("/v1/health").raise_for_status()
            latencies["loaded"].append(time.perf_counter() - started)
            time.sleep(0.02)
    for p in loaders:
        p.join()
    calls = 0
    while not counts.empty():
        calls += counts.get()
    stop.set()
    server.join(30)

    def ms(values: list[float]) -> dict:
        return {f"p{q}": 1000 * float(np.percentile(values, q)) for q in (50, 90, 99)}

    return {
        "health_ms": {k: ms(v) for k, v in latencies.items()},
        "num_health_calls": {k: len(v) for k, v in latencies.items()},
        "num_1024_agent_actions": calls,
        "seconds": seconds,
        "clients": clients,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    result = {
        "machine": {"platform": platform.platform(), "cpus": multiprocessing.cpu_count()},
        **run(args.seconds, args.clients),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
