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

With ``--slow-sockets N`` each system also runs with N slowloris sockets open
beside the agents (loopback only): each sends half a request header, then one more
header byte a second, and is reopened when the server closes it, until the run
ends (at most ``--slow-max-opens`` opens in all). Each run records requests/s,
latency percentiles, the responses by status (5xx must stay 0), lost steps (steps
the agents took in episodes they ended, minus the server's ``num_env_steps``: must
be 0) and how many slow sockets the server closed.

Usage::

    python3 benchmarks/serve_load.py --requests 20000 --clients 32 --rounds 3 \\
        --slow-sockets 1000 --out benchmarks/results/serve_load_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import json
import os
import pathlib
import resource
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


MAX_SLOW_SOCKETS = 2000


async def slowloris(url: str, count: int, max_opens: int, stop: asyncio.Event) -> dict:
    """Keeps ``count`` stalled sockets open against ``url`` until ``stop``."""
    host, port = url.removeprefix("http://").split(":")
    counts = collections.Counter()

    async def one() -> None:
        while not stop.is_set() and counts["opened"] < max_opens:
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
            except OSError:
                counts["connect_errors"] += 1
                await asyncio.sleep(0.5)
                continue
            counts["opened"] += 1
            writer.write(b"POST /v1/episodes HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            try:
                while not stop.is_set():
                    try:  # a trickle: one header byte a second, never the end
                        answer = await asyncio.wait_for(reader.read(4096), 1.0)
                    except asyncio.TimeoutError:
                        writer.write(b"a")
                        await writer.drain()
                        continue
                    if not answer or answer.startswith(b"HTTP/1.1 408"):
                        counts["closed_by_server"] += 1
                        break
            except OSError:
                counts["closed_by_server"] += 1
            finally:
                writer.close()

    tasks = [asyncio.ensure_future(one()) for _ in range(count)]
    await stop.wait()
    await asyncio.gather(*tasks, return_exceptions=True)
    return dict(counts)


async def run_load(
    url: str,
    token: str,
    num_clients: int,
    num_requests: int,
    seed: int,
    slow_sockets: int = 0,
    slow_max_opens: int = 0,
) -> dict:
    """``num_clients`` agents playing CartPole until ``num_requests`` requests are made,
    beside ``slow_sockets`` slowloris sockets."""
    latencies: dict[str, list[float]] = {"start": [], "action": [], "returns": [], "end": []}
    budget = [num_requests]
    steps = [0]
    statuses: collections.Counter[int] = collections.Counter()
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
            statuses[response.status_code] += 1
            response.raise_for_status()
            return response.json()

        async def agent(index: int) -> None:
            game = gymnasium.make("CartPole-v1")
            episode = 0
            while budget[0] > 0:
                obs, _ = game.reset(seed=seed + 100_000 * index + episode)
                episode += 1
                eid = (await call("start", "/v1/episodes", {}))["episode_id"]
                taken, ended, terminated = 0, False, False
                while budget[0] > 0 and not ended:
                    body = {"obs": wire.encode_tree(obs_space, obs)}
                    out = await call("action", f"/v1/episodes/{eid}/action", body)
                    action = int(wire.decode_array(out["action"], "action"))
                    obs, reward, terminated, truncated, _ = game.step(action)
                    taken += 1
                    await call("returns", f"/v1/episodes/{eid}/returns", {"reward": reward})
                    ended = terminated or truncated
                # Every episode is ended (cut at the budget: truncated), so every step
                # the agents took must be in the server's num_env_steps.
                final = {"obs": wire.encode_tree(obs_space, obs), "truncated": not terminated}
                await call("end", f"/v1/episodes/{eid}/end", final)
                steps[0] += taken

        before = (await http.get("/v1/metrics")).json()
        stop = asyncio.Event()
        slow = asyncio.ensure_future(slowloris(url, slow_sockets, slow_max_opens, stop))
        await asyncio.sleep(2.0 if slow_sockets else 0.0)  # every slow socket is open
        started = time.perf_counter()
        await asyncio.gather(*(agent(i) for i in range(num_clients)))
        seconds = time.perf_counter() - started
        stop.set()
        slow_counts = await slow
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
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "num_5xx": sum(v for k, v in statuses.items() if k >= 500),
        "agent_steps": steps[0],
        "lost_steps": steps[0] - (metrics["num_env_steps"] - before["num_env_steps"]),
        "dropped_steps": metrics["num_dropped_steps"] - before["num_dropped_steps"],
        "slow_sockets": slow_sockets,
        "slow": slow_counts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000, help="requests per run")
    parser.add_argument("--clients", type=int, default=32, help="concurrent agents")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--slow-sockets",
        type=int,
        default=0,
        help=f"slowloris sockets beside the agents (loopback; at most {MAX_SLOW_SOCKETS})",
    )
    parser.add_argument(
        "--slow-max-opens", type=int, default=20_000, help="bound on slow-socket opens per run"
    )
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()
    if not 0 <= args.slow_sockets <= MAX_SLOW_SOCKETS:
        parser.error(f"--slow-sockets: expected 0..{MAX_SLOW_SOCKETS}")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * args.slow_sockets + 4 * args.clients + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    variants = [0, args.slow_sockets] if args.slow_sockets else [0]
    runs_of = [(name, slow) for slow in variants for name in SYSTEMS]

    loadavg_start = os.getloadavg()
    servers = {}
    with tempfile.TemporaryDirectory() as tmp:
        token_file = os.path.join(tmp, "token")
        try:
            for name, flags in SYSTEMS.items():
                servers[name] = start_server(flags, token_file)
            token = pathlib.Path(token_file).read_text().strip()
            for _, info in servers.values():  # warm-up: compile every bucket
                asyncio.run(run_load(info["url"], token, args.clients, 2_000, args.seed))
            runs: dict[str, list[dict]] = {_label(n, k): [] for n, k in runs_of}
            for round_index in range(args.rounds):
                for name, slow in runs_of:
                    info = servers[name][1]
                    result = asyncio.run(
                        run_load(
                            info["url"],
                            token,
                            args.clients,
                            args.requests,
                            args.seed,
                            slow,
                            args.slow_max_opens,
                        )
                    )
                    result["loadavg"] = os.getloadavg()
                    runs[_label(name, slow)].append(result)
                    print(
                        f"round {round_index} {_label(name, slow):>20}: "
                        f"{result['requests_per_s']:6.0f} req/s, action p50 "
                        f"{result['latency_action']['p50_ms']:.1f} ms, p99 "
                        f"{result['latency_action']['p99_ms']:.1f} ms, mean batch "
                        f"{result['server_mean_batch_size']:.1f}, 5xx {result['num_5xx']}, lost "
                        f"{result['lost_steps']}, slow {result['slow']}",
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

    summary: dict[str, Any] = {
        name: {
            "requests_per_s": median(name, "requests_per_s"),
            "num_5xx_total": sum(run["num_5xx"] for run in runs[name]),
            "lost_steps_total": sum(run["lost_steps"] for run in runs[name]),
            "env_steps_per_s": median(name, "env_steps_per_s"),
            **{
                f"action_{q}": median(name, "latency_action", q)
                for q in ("p50_ms", "p90_ms", "p99_ms")
            },
            **{f"all_{q}": median(name, "latency_all", q) for q in ("p50_ms", "p90_ms", "p99_ms")},
        }
        for name in runs
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
            "slow_sockets": args.slow_sockets,
            "slow_max_opens": args.slow_max_opens,
            "env": "CartPole-v1",
            "policy": "64-64 tanh MLP, stochastic",
            "systems": SYSTEMS,
            "load": "one asyncio process (httpx), server in its own process, loopback",
        },
        "command": " ".join(["python", *sys.argv]),
        "machine": bench.machine_info(),
        "loadavg_start": loadavg_start,
        "loadavg_end": os.getloadavg(),
        "summary_median": summary,
        "runs": runs,
    }
    text = json.dumps(report, indent=2)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


def _label(name: str, slow: int) -> str:
    return f"{name}+{slow}slow" if slow else name


if __name__ == "__main__":
    main()
