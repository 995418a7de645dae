"""Load test of the policy server: throughput and latency under many concurrent agents.

Each system is a ``jaxrunner serve`` subprocess (CartPole-v1 spaces, a 64-64 tanh
MLP, token auth on, 127.0.0.1). The load comes from this process: ``--clients``
agents on one asyncio loop (httpx), each playing CartPole episodes against the
server over HTTP (start, then action + returns per step, then end), until
``--requests`` requests have been made in all. Systems run in interleaved rounds
(the machine is shared; medians are kept):

* ``batched``: ``--max-batch 64 --max-wait-ms 2``: concurrent actions share one
  jitted policy call.
* ``unbatched``: ``--max-batch 1``: one policy call per action (what a server that
  does not batch would do).

Usage::

    python3 benchmarks/serve_load.py --requests 20000 --clients 32 --rounds 3 \\
        --out benchmarks/results/serve_load_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import gymnasium
import httpx
import numpy as np

from jaxrunner import bench
from jaxrunner.serve import wire

SYSTEMS = {
    "batched": ["--max-batch", "64", "--max-wait-ms", "2"],
    "unbatched": ["--max-batch", "1", "--max-wait-ms", "0"],
}


def start_server(args: list[str], token_file: str) -> tuple[subprocess.Popen, dict[str, Any]]:
    command = [sys.executable, "-m", "jaxrunner", "serve", "--port", "0"]
    command += ["--token-file", token_file, "--max-concurrent", "4096", *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    return process, json.loads(process.stdout.readline())


async def run_load(url: str, token: str, num_clients: int, num_requests: int, seed: int) -> dict:
    """``num_clients`` agents playing CartPole until ``num_requests`` requests are made."""
    latencies: dict[str, list[float]] = {"start": [], "action": [], "returns": [], "end": []}
    budget = [num_requests]
    steps = [0]
    obs_space = gymnasium.make("CartPole-v1").observation_space
    limits = httpx.Limits(
        max_connections=num_clients, max_keepalive_connections=num_clients, keepalive_expiry=10.0
    )
    headers = {"Authorization": f"Bearer {token}"}

    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as http:

        async def call(kind: str, path: str, body: dict) -> Any:
            budget[0] -= 1
            tick = time.perf_counter()
            response = await http.post(path, json=body)
            latencies[kind].append(time.perf_counter() - tick)
            response.raise_for_status()
            return response.json()

        async def agent(index: int) -> None:
            game = gymnasium.make("CartPole-v1")
            episode = 0
            while budget[0] > 0:
                obs, _ = game.reset(seed=seed + 100_000 * index + episode)
                episode += 1
                eid = (await call("start", "/v1/episodes", {}))["episode_id"]
                while budget[0] > 0:
                    body = {"obs": wire.encode_tree(obs_space, obs)}
                    out = await call("action", f"/v1/episodes/{eid}/action", body)
                    action = int(wire.decode_array(out["action"], "action"))
                    obs, reward, terminated, truncated, _ = game.step(action)
                    steps[0] += 1
                    await call("returns", f"/v1/episodes/{eid}/returns", {"reward": reward})
                    if terminated or truncated:
                        final = {"obs": wire.encode_tree(obs_space, obs), "truncated": truncated}
                        await call("end", f"/v1/episodes/{eid}/end", final)
                        break

        started = time.perf_counter()
        await asyncio.gather(*(agent(i) for i in range(num_clients)))
        seconds = time.perf_counter() - started
        metrics = (await http.get("/v1/metrics")).json()

    every = [x for values in latencies.values() for x in values]

    def percentiles(values: list[float]) -> dict[str, float]:
        ms = 1000.0 * np.asarray(values)
        return {f"p{q}_ms": float(np.percentile(ms, q)) for q in (50, 90, 99)}

    return {
        "requests": len(every),
        "seconds": seconds,
        "requests_per_s": len(every) / seconds,
        "env_steps_per_s": steps[0] / seconds,
        "latency_all": percentiles(every),
        "latency_action": percentiles(latencies["action"]),
        "server_mean_batch_size": metrics["mean_batch_size"],
        "server_inference_ms_per_batch": metrics["perf"]["inference_ms"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000, help="requests per run")
    parser.add_argument("--clients", type=int, default=32, help="concurrent agents")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()

    servers = {}
    with tempfile.TemporaryDirectory() as tmp:
        token_file = os.path.join(tmp, "token")
        try:
            for name, flags in SYSTEMS.items():
                servers[name] = start_server(flags, token_file)
            token = pathlib.Path(token_file).read_text().strip()
            for _, info in servers.values():  # warm-up: compile every bucket
                asyncio.run(run_load(info["url"], token, args.clients, 2_000, args.seed))
            runs: dict[str, list[dict]] = {name: [] for name in SYSTEMS}
            for round_index in range(args.rounds):
                for name, (_, info) in servers.items():
                    result = asyncio.run(
                        run_load(info["url"], token, args.clients, args.requests, args.seed)
                    )
                    result["loadavg"] = os.getloadavg()
                    runs[name].append(result)
                    print(
                        f"round {round_index} {name:>9}: {result['requests_per_s']:8.0f} req/s, "
                        f"action p50 {result['latency_action']['p50_ms']:.1f} ms, "
                        f"p99 {result['latency_action']['p99_ms']:.1f} ms, mean batch "
                        f"{result['server_mean_batch_size']:.1f}",
                        file=sys.stderr,
                    )
        finally:
            for process, _ in servers.values():
                process.terminate()
                process.wait(30)

    def median(name: str, *path: str) -> float:
        values = []
        for run in runs[name]:
            value: Any = run
            for key in path:
                value = value[key]
            values.append(value)
        return statistics.median(values)

    summary = {
        name: {
            "requests_per_s": median(name, "requests_per_s"),
            "env_steps_per_s": median(name, "env_steps_per_s"),
            **{
                f"action_{q}": median(name, "latency_action", q)
                for q in ("p50_ms", "p90_ms", "p99_ms")
            },
            **{f"all_{q}": median(name, "latency_all", q) for q in ("p50_ms", "p90_ms", "p99_ms")},
        }
        for name in SYSTEMS
    }
    summary["batched_vs_unbatched_throughput"] = (
        summary["batched"]["requests_per_s"] / summary["unbatched"]["requests_per_s"]
    )
    report = {
        "benchmark": "serve_load",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "config": {
            "requests_per_run": args.requests,
            "clients": args.clients,
            "rounds": args.rounds,
            "env": "CartPole-v1",
            "policy": "64-64 tanh MLP, stochastic",
            "systems": SYSTEMS,
            "load": "one asyncio process (httpx), server in its own process, loopback",
        },
        "machine": bench.machine_info(),
        "loadavg_end": os.getloadavg(),
        "summary_median": summary,
        "runs": runs,
    }
    text = json.dumps(report, indent=2)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
