"""Load test of the policy server: throughput and latency under many concurrent agents.

Each system is a ``jaxrunner serve`` subprocess (CartPole-v1 spaces, a 64-64 tanh
MLP, token auth on, 127.0.0.1). The load comes from ``--clients`` agents spread
over ``--agent-processes`` processes (httpx, one asyncio loop each), each agent
playing CartPole episodes against the server over HTTP (start, then action + returns
per step, then end), until ``--requests`` requests have been made in all. One
process of 32 httpx clients needs about a core at 500 requests/s: on one process the
benchmark measures the load generator, not the server. Each agent keeps one
keep-alive connection; every connection opened beyond one per agent is a reconnect
(``agent_reconnects``: the server closed an authenticated connection; must be 0).
Systems run in interleaved rounds (the machine is shared; medians are kept):

* ``batched``: ``--max-batch 64 --max-wait-ms 2``: concurrent actions share one
  jitted policy call.
* ``unbatched``: ``--max-batch 1``: one policy call per action (what a server that
  does not batch would do).

With ``--hostile N`` each system also runs with N hostile sockets of each kind in
``--kinds`` open beside the agents, one kind per run (loopback only, no token; each
reopened one second after the server closes it, at most ``--hostile-max-opens`` opens
in a run):

* ``slow_reader``: pipelines 400 ``GET /openapi.json`` and never reads an answer
  (its receive buffer set to 4 KiB);
* ``idle_keepalive``: one ``GET /v1/health``, then silence;
* ``slowloris``: half a request header, then one more header byte a second.

With ``--placebo`` each system also runs beside a ``cpu_placebo``: a process with no
socket that burns as much CPU as the busiest hostile process of the round did. It
separates the two causes of a slowdown under attack: if the agents' rate beside the
placebo is close to their rate beside the hostile sockets, the loss is the load
generator's own CPU on the shared cores, not the server's handling of the sockets.
Every run records the CPU seconds of the server, the agents' processes and the
hostile (or placebo) process, per legitimate request.

Each run records requests/s, latency percentiles, the responses by status (5xx must
stay 0), lost steps (steps the agents took in episodes they ended, minus the
server's ``num_env_steps``: must be 0) and what became of the hostile sockets.
The hostile sockets run in a process of their own (not in the agents' event loops);
the agents, the hostile sockets and the server share the machine's cores.

Usage::

    python3 benchmarks/serve_load.py --requests 10000 --clients 32 --agent-processes 4 \\
        --rounds 2 --hostile 1000 --max-connections 1000 \\
        --out benchmarks/results/serve_load_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import json
import multiprocessing
import os
import pathlib
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import gymnasium
import httpx
import numpy as np

from jaxrunner._src import bench
from jaxrunner._src.services.serve import wire

SYSTEMS = {
    "batched": ["--max-batch", "64", "--max-wait-ms", "2"],
    "unbatched": ["--max-batch", "1", "--max-wait-ms", "0"],
}


def start_server(
    args: list[str], token_file: str, max_connections: int
) -> tuple[subprocess.Popen, dict[str, Any]]:
    command = [sys.executable, "-m", "jaxrunner", "serve", "--port", "0"]
    command += ["--token-file", token_file, "--max-concurrent", "4096"]
    command += ["--max-connections", str(max_connections), *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    return process, json.loads(process.stdout.readline())


KINDS_OF_CALL = ("start", "action", "returns", "end")
MAX_HOSTILE = 4000
KINDS = ("slow_reader", "idle_keepalive", "slowloris")
PIPELINED = b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n" * 400


async def _open(host: str, port: int, kind: str) -> tuple[asyncio.StreamReader, Any]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if kind == "slow_reader":  # a small window: the server's answers pile up sooner
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
    except OSError:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock, limit=4096)


async def _hold(kind: str, reader: asyncio.StreamReader, writer: Any, stop: asyncio.Event) -> str:
    """Holds one hostile socket until the server closes it (or ``stop``); returns how
    it ended."""
    if kind == "slow_reader":
        writer.write(PIPELINED)
    elif kind == "idle_keepalive":
        writer.write(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
    else:
        writer.write(b"POST /v1/episodes HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    while not stop.is_set():
        if kind == "slow_reader":  # never reads: probes with a harmless blank line
            try:
                writer.write(b"\r\n")
                await asyncio.wait_for(writer.drain(), 1.0)
            except asyncio.TimeoutError:
                continue
            except OSError:
                return "closed_by_server"
            if writer.transport.is_closing() or reader.at_eof():
                return "closed_by_server"
            await asyncio.sleep(1.0)
            continue
        try:  # idle keep-alive and slowloris: wait, read what comes
            answer = await asyncio.wait_for(reader.read(4096), 1.0)
        except asyncio.TimeoutError:
            if kind == "slowloris":
                writer.write(b"a")
            continue
        except OSError:
            return "closed_by_server"
        if not answer:
            return "closed_by_server"
        if kind == "slowloris" and answer.startswith(b"HTTP/1.1 408"):
            return "closed_by_server"
    return "still_open"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _burn(fraction: float, stop: Any) -> None:
    """The placebo: busy for ``fraction`` of every 10 ms until ``stop`` is set."""
    while not stop.is_set():
        start = time.perf_counter()
        while time.perf_counter() - start < 0.010 * fraction:
            pass
        time.sleep(0.010 * (1.0 - fraction))


class PlaceboProcess:
    """A process that burns ``fraction`` of a core, with no socket (see the module
    docstring); :meth:`stop` ends it."""

    def __init__(self, fraction: float) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._process = context.Process(
            target=_burn, args=(min(max(fraction, 0.0), 1.0), self._stop), daemon=True
        )
        self._process.start()
        self.pid = self._process.pid

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._process.join(30)
        return {}


class HostileProcess:
    """``count`` hostile sockets of ``kind`` against ``url``, from a process of their
    own (spawned), so they never slow the agents' event loop; :meth:`stop` ends them
    and returns what became of them."""

    def __init__(self, url: str, kind: str, count: int, max_opens: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._results = context.Queue()
        self._process = context.Process(
            target=_hostile_main,
            args=(url, kind, count, max_opens, self._stop, self._results),
            daemon=True,
        )
        self._process.start()
        self.pid = self._process.pid

    def stop(self) -> dict[str, int]:
        self._stop.set()
        counts = self._results.get(timeout=120)
        self._process.join(30)
        return counts


def _hostile_main(url: str, kind: str, count: int, max_opens: int, stop: Any, results: Any) -> None:
    """The hostile process: runs the sockets until ``stop`` is set, then reports."""

    async def run() -> dict[str, int]:
        done = asyncio.Event()

        async def watch() -> None:
            while not stop.is_set():
                await asyncio.sleep(0.2)
            done.set()

        watcher = asyncio.ensure_future(watch())
        counts = await hostile_sockets(url, kind, count, max_opens, done)
        await watcher
        return counts

    results.put(asyncio.run(run()))


async def hostile_sockets(
    url: str, kind: str, count: int, max_opens: int, stop: asyncio.Event
) -> dict[str, int]:
    """Keeps ``count`` hostile sockets of ``kind`` against ``url`` until ``stop``."""
    host, port = url.removeprefix("http://").split(":")
    counts: collections.Counter[str] = collections.Counter()

    async def one() -> None:
        while not stop.is_set() and counts["opened"] < max_opens:
            try:
                reader, writer = await _open(host, int(port), kind)
            except OSError:
                counts["connect_errors"] += 1
                await asyncio.sleep(1.0)
                continue
            counts["opened"] += 1
            try:
                counts[await _hold(kind, reader, writer, stop)] += 1
            finally:
                writer.transport.abort()
            await asyncio.sleep(1.0)  # then reconnect, as an attacker would

    tasks = [asyncio.ensure_future(one()) for _ in range(count)]
    await stop.wait()
    await asyncio.gather(*tasks, return_exceptions=True)
    return dict(counts)


class NoAnswer(Exception):
    """A newcomer's request got no answer (see :func:`play`)."""


async def play(
    url: str,
    token: str,
    num_clients: int,
    num_requests: int,
    seed: int,
    first_index: int,
    fresh: bool = False,
    stop: Any = None,
) -> dict:
    """``num_clients`` agents (numbered from ``first_index``) on this process's loop
    playing CartPole until ``num_requests`` requests are made (or ``stop`` is set);
    returns their raw latencies, statuses, steps and TCP connections opened (a
    reconnect is one more than ``num_clients``: the server closed a keep-alive
    connection). ``fresh``: each request on a new TCP connection (newcomers)."""
    latencies: dict[str, list[float]] = {k: [] for k in KINDS_OF_CALL}
    budget = [num_requests]
    steps = [0]
    statuses: collections.Counter[int] = collections.Counter()
    connects = [0]
    abandoned = [0]  # newcomers' episodes left after a request got no answer
    obs_space = gymnasium.make("CartPole-v1").observation_space
    limits = httpx.Limits(
        max_connections=num_clients,
        max_keepalive_connections=0 if fresh else num_clients,
        keepalive_expiry=10.0,
    )

    def more() -> bool:
        return budget[0] > 0 and (stop is None or not stop.is_set())

    headers = {"Authorization": f"Bearer {token}"}

    async def trace(event: str, info: dict) -> None:  # httpcore's connection events
        if event == "connection.connect_tcp.started":
            connects[0] += 1

    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as http:

        async def call(kind: str, path: str, body: dict) -> Any:
            budget[0] -= 1
            tick = time.perf_counter()
            try:
                response = await http.post(path, json=body, extensions={"trace": trace})
            except httpx.TransportError:
                if not fresh:
                    raise
                statuses[0] += 1  # no answer (a newcomer's connect or read timed out)
                raise NoAnswer() from None
            latencies[kind].append(time.perf_counter() - tick)
            statuses[response.status_code] += 1
            response.raise_for_status()
            return response.json()

        async def agent(index: int) -> None:
            game = gymnasium.make("CartPole-v1")
            episode = 0
            while more():
                obs, _ = game.reset(seed=seed + 100_000 * index + episode)
                episode += 1
                try:
                    await episode_of(game, obs)
                except NoAnswer:
                    abandoned[0] += 1  # its steps are counted nowhere

        async def episode_of(game: Any, obs: Any) -> None:
            eid = (await call("start", "/v1/episodes", {}))["episode_id"]
            taken, ended, terminated = 0, False, False
            while more() and not ended:
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

        cpu = time.process_time()
        await asyncio.gather(*(agent(first_index + i) for i in range(num_clients)))
        cpu = time.process_time() - cpu
    return {
        "latencies": latencies,
        "statuses": dict(statuses),
        "steps": steps[0],
        "connections_opened": connects[0],
        "abandoned_episodes": abandoned[0],
        "cpu_seconds": cpu,
    }


def _agents_main(
    url: str,
    token: str,
    clients: int,
    requests: int,
    seed: int,
    first: int,
    go: Any,
    out: Any,
    stop: Any = None,
) -> None:
    """An agent process: ready once imported, plays when ``go`` is set, reports to
    ``out`` (with ``stop``: newcomers, each request on a new connection, until set)."""
    out.put("ready")
    go.wait()
    fresh = stop is not None
    result = asyncio.run(play(url, token, clients, requests, seed, first, fresh, stop))
    out.put((fresh, result))


class AgentProcesses:
    """The agents spread over ``processes`` spawned processes (clients and requests
    shared out evenly), so that one process's CPU does not cap the load: 32 httpx
    clients on one loop need about a core at 500 requests/s. With ``newcomers``, one
    more process of that many agents that open a new connection per request, playing
    until the others are done."""

    def __init__(
        self,
        url: str,
        token: str,
        clients: int,
        requests: int,
        seed: int,
        processes: int,
        newcomers: int = 0,
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self._go = context.Event()
        self._stop = context.Event()
        self._out = context.Queue()
        self._processes = []
        first = 0
        for index in range(processes):
            share = clients // processes + (index < clients % processes)
            budget = requests // processes + (index < requests % processes)
            process = context.Process(
                target=_agents_main,
                args=(url, token, share, budget, seed, first, self._go, self._out),
                daemon=True,
            )
            process.start()
            self._processes.append(process)
            first += share
        self._newcomers = None
        if newcomers:
            self._newcomers = context.Process(
                target=_agents_main,
                args=(url, token, newcomers, 10**9, seed, first, self._go, self._out, self._stop),
                daemon=True,
            )
            self._newcomers.start()
        for _ in range(
            len(self._processes) + bool(newcomers)
        ):  # all imported, connected to nothing
            assert self._out.get(timeout=120) == "ready"

    def run(self) -> tuple[list[dict], dict | None]:
        """Starts them all at once; returns each agent process's :func:`play` result,
        and the newcomers' (once the others are done), or None."""
        self._go.set()
        results, newcomers = [], None
        while len(results) < len(self._processes):
            fresh, result = self._out.get(timeout=3600)
            if fresh:
                newcomers = result
            else:
                results.append(result)
        if self._newcomers is not None:
            self._stop.set()
            if newcomers is None:
                newcomers = self._out.get(timeout=600)[1]
            self._newcomers.join(30)
        for process in self._processes:
            process.join(30)
        return results, newcomers


def accept_queue(port: int) -> int:
    """The listening socket's accept queue on ``port`` now (``ss``'s Recv-Q)."""
    out = subprocess.run(
        ["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=False
    ).stdout.split()
    return int(out[1]) if len(out) > 1 else -1


def watch_accept_queue(port: int, stop: threading.Event, every_s: float = 0.25) -> list[int]:
    """Samples :func:`accept_queue` every ``every_s`` until ``stop`` is set."""
    samples = []
    while not stop.wait(every_s):
        samples.append(accept_queue(port))
    return samples


async def run_load(
    url: str,
    token: str,
    num_clients: int,
    num_requests: int,
    seed: int,
    kind: str | None = None,
    hostile: int = 0,
    hostile_max_opens: int = 0,
    server_pid: int | None = None,
    placebo_fraction: float = 0.0,
    agent_processes: int = 1,
    newcomers: int = 0,
    hostile_warmup_s: float = 8.0,
) -> dict:
    """``num_clients`` agents over ``agent_processes`` processes playing CartPole until
    ``num_requests`` requests are made, beside ``hostile`` sockets of ``kind`` (or, for
    ``cpu_placebo``, a process burning ``placebo_fraction`` of a core)."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
        before = (await http.get("/v1/metrics")).json()
    attackers: HostileProcess | PlaceboProcess | None = None
    opened = time.perf_counter()
    if kind == "cpu_placebo":
        attackers = PlaceboProcess(placebo_fraction)
    elif kind:
        attackers = HostileProcess(url, kind, hostile, hostile_max_opens)
    # The agents start up while the hostile sockets open (8 s: spawned, every one open;
    # a loaded server takes longer to take in their first burst).
    agents = AgentProcesses(url, token, num_clients, num_requests, seed, agent_processes, newcomers)
    await asyncio.sleep(max(0.0, opened + hostile_warmup_s - time.perf_counter()) if kind else 0)
    pids = {"server": server_pid, "other": attackers.pid if attackers else None}
    cpu_before = {k: cpu_seconds(pid) for k, pid in pids.items() if pid is not None}
    watching = threading.Event()
    port = int(url.rsplit(":", 1)[1])
    watcher = asyncio.get_running_loop().run_in_executor(None, watch_accept_queue, port, watching)
    started = time.perf_counter()
    parts, fresh = await asyncio.get_running_loop().run_in_executor(None, agents.run)
    seconds = time.perf_counter() - started
    watching.set()
    queue = await watcher
    cpu = {k: cpu_seconds(pids[k]) - v for k, v in cpu_before.items()}  # type: ignore[arg-type]
    cpu["agents"] = sum(part["cpu_seconds"] for part in parts)
    slow_counts = attackers.stop() if attackers is not None else {}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
        metrics = (await http.get("/v1/metrics")).json()

    latencies = {
        k: [x for part in parts for x in part["latencies"][k]] for k in parts[0]["latencies"]
    }
    statuses: collections.Counter[int] = collections.Counter()
    for part in parts:
        statuses.update({int(k): v for k, v in part["statuses"].items()})
    # Every step taken, the newcomers' too, must be in the server's num_env_steps.
    steps = sum(part["steps"] for part in parts)
    all_steps = steps + (fresh["steps"] if fresh is not None else 0)
    connections = sum(part["connections_opened"] for part in parts)
    every = [x for values in latencies.values() for x in values]

    def percentiles(values: list[float]) -> dict[str, float]:
        if not values:
            return {f"p{q}_ms": float("nan") for q in (50, 90, 99)}
        ms = 1000.0 * np.asarray(values)
        return {f"p{q}_ms": float(np.percentile(ms, q)) for q in (50, 90, 99)}

    newcomer_stats = {}
    if fresh is not None:
        answered = [x for values in fresh["latencies"].values() for x in values]
        newcomer_stats = {
            "newcomers": newcomers,
            "requests": len(answered),
            "requests_per_s": len(answered) / seconds,
            "latency_all": percentiles(answered),
            "statuses": fresh["statuses"],
            "connections_opened": fresh["connections_opened"],
            "abandoned_episodes": fresh["abandoned_episodes"],
        }
    return {
        "requests": len(every),
        "seconds": seconds,
        "requests_per_s": len(every) / seconds,
        "env_steps_per_s": steps / seconds,
        "latency_all": percentiles(every),
        "latency_action": percentiles(latencies["action"]),
        "server_mean_batch_size": metrics["mean_batch_size"],
        "server_inference_ms_per_batch": metrics["perf"]["inference_ms"],
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "num_5xx": sum(v for k, v in statuses.items() if k >= 500),
        "agent_steps": steps,
        "lost_steps": all_steps - (metrics["num_env_steps"] - before["num_env_steps"]),
        "dropped_steps": metrics["num_dropped_steps"] - before["num_dropped_steps"],
        # The agents' TCP connections: one per client unless the server closed some.
        "agent_processes": agent_processes,
        "agent_connections_opened": connections,
        "agent_reconnects": max(0, connections - num_clients),
        "hostile_kind": kind,
        "hostile_sockets": hostile if kind else 0,
        "hostile": slow_counts,
        # CPU seconds of each party during the agents' run (the agents: all their
        # processes), and as cores (seconds / wall).
        "cpu_seconds": cpu,
        "cpu_cores": {k: v / seconds for k, v in cpu.items()},
        "server_cpu_ms_per_request": 1000.0 * cpu.get("server", float("nan")) / len(every),
        "agents_cpu_ms_per_request": 1000.0 * cpu["agents"] / len(every),
        # Agents that open a new TCP connection per request, beside the others.
        "newcomers": newcomer_stats,
        # The listening socket's accept queue (connections the kernel holds for accept()).
        "accept_queue": {
            "max": max(queue, default=-1),
            "median": statistics.median(queue) if queue else -1,
            "samples_every_0.25_s": queue,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000, help="requests per run")
    parser.add_argument("--clients", type=int, default=32, help="concurrent agents")
    parser.add_argument(
        "--agent-processes",
        type=int,
        default=4,
        help="processes the agents are spread over (default: %(default)s)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--hostile",
        type=int,
        default=0,
        help=f"hostile sockets of each kind beside the agents (loopback; at most {MAX_HOSTILE})",
    )
    parser.add_argument(
        "--kinds",
        nargs="+",
        choices=KINDS,
        default=["slow_reader", "idle_keepalive"],
        help="hostile kinds, one per run (default: %(default)s)",
    )
    parser.add_argument(
        "--hostile-max-opens", type=int, default=20_000, help="bound on hostile opens per run"
    )
    parser.add_argument(
        "--max-connections", type=int, default=2048, help="the servers' max_connections"
    )
    parser.add_argument(
        "--hostile-warmup-s",
        type=float,
        default=8.0,
        help="seconds from opening the hostile sockets to starting the agents",
    )
    parser.add_argument(
        "--newcomers",
        type=int,
        default=0,
        help="agents beside the others that open a new connection per request (one process)",
    )
    parser.add_argument(
        "--systems",
        nargs="+",
        choices=list(SYSTEMS),
        default=list(SYSTEMS),
        help="servers to run (default: %(default)s)",
    )
    parser.add_argument(
        "--placebo",
        action="store_true",
        help="also run beside a socketless process burning the hostile processes' CPU",
    )
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()
    if not 1 <= args.agent_processes <= args.clients:
        parser.error("--agent-processes: expected 1..--clients")
    if not 0 <= args.hostile <= MAX_HOSTILE:
        parser.error(f"--hostile: expected 0..{MAX_HOSTILE}")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * args.hostile + 4 * args.clients + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    variants: list[str | None] = [None, *args.kinds] if args.hostile else [None]
    if args.placebo and args.hostile:
        variants.append("cpu_placebo")
    systems = {name: SYSTEMS[name] for name in args.systems}
    runs_of = [(name, kind) for kind in variants for name in systems]

    loadavg_start = os.getloadavg()
    servers = {}
    with tempfile.TemporaryDirectory() as tmp:
        token_file = os.path.join(tmp, "token")
        try:
            for name, flags in systems.items():
                servers[name] = start_server(flags, token_file, args.max_connections)
            token = pathlib.Path(token_file).read_text().strip()
            for _, info in servers.values():  # warm-up: compile every bucket
                asyncio.run(
                    run_load(
                        info["url"],
                        token,
                        args.clients,
                        2_000,
                        args.seed,
                        agent_processes=args.agent_processes,
                    )
                )
            runs: dict[str, list[dict]] = {_label(n, k, args.hostile): [] for n, k in runs_of}
            for round_index in range(args.rounds):
                hostile_cores = [0.0]  # the busiest hostile process of this round, in cores
                for name, kind in runs_of:
                    label = _label(name, kind, args.hostile)
                    info = servers[name][1]
                    result = asyncio.run(
                        run_load(
                            info["url"],
                            token,
                            args.clients,
                            args.requests,
                            args.seed,
                            kind,
                            args.hostile,
                            args.hostile_max_opens,
                            servers[name][0].pid,
                            max(hostile_cores),
                            args.agent_processes,
                            args.newcomers,
                            args.hostile_warmup_s,
                        )
                    )
                    if kind not in (None, "cpu_placebo"):
                        hostile_cores.append(result["cpu_cores"]["other"])
                    result["loadavg"] = os.getloadavg()
                    runs[label].append(result)
                    print(
                        f"round {round_index} {label:>30}: "
                        f"{result['requests_per_s']:6.0f} req/s, cpu "
                        f"{ {k: round(v, 2) for k, v in result['cpu_cores'].items()} }, action p50 "
                        f"{result['latency_action']['p50_ms']:.1f} ms, p99 "
                        f"{result['latency_action']['p99_ms']:.1f} ms, mean batch "
                        f"{result['server_mean_batch_size']:.1f}, 5xx {result['num_5xx']}, lost "
                        f"{result['lost_steps']}, agent reconnects {result['agent_reconnects']}, "
                        f"hostile {result['hostile']}, accept queue max "
                        f"{result['accept_queue']['max']} median "
                        f"{result['accept_queue']['median']}, "
                        f"load {os.getloadavg()[0]:.2f}",
                        file=sys.stderr,
                    )
                    if result["newcomers"]:
                        fresh = result["newcomers"]
                        print(
                            f"    newcomers: {fresh['requests']} answers, "
                            f"{fresh['requests_per_s']:.1f} req/s, p50 "
                            f"{fresh['latency_all']['p50_ms']:.0f} ms, p90 "
                            f"{fresh['latency_all']['p90_ms']:.0f} ms, "
                            f"statuses {fresh['statuses']}",
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
            "server_cpu_ms_per_request": median(name, "server_cpu_ms_per_request"),
            "agents_cpu_ms_per_request": median(name, "agents_cpu_ms_per_request"),
            **{
                f"cpu_cores_{party}": median(name, "cpu_cores", party)
                for party in runs[name][0]["cpu_cores"]
            },
            "num_5xx_total": sum(run["num_5xx"] for run in runs[name]),
            "lost_steps_total": sum(run["lost_steps"] for run in runs[name]),
            "agent_reconnects_total": sum(run["agent_reconnects"] for run in runs[name]),
            "env_steps_per_s": median(name, "env_steps_per_s"),
            **{
                f"action_{q}": median(name, "latency_action", q)
                for q in ("p50_ms", "p90_ms", "p99_ms")
            },
            **{f"all_{q}": median(name, "latency_all", q) for q in ("p50_ms", "p90_ms", "p99_ms")},
            "accept_queue_max": median(name, "accept_queue", "max"),
            **(
                {
                    "newcomers_requests_per_s": median(name, "newcomers", "requests_per_s"),
                    **{
                        f"newcomers_{q}": median(name, "newcomers", "latency_all", q)
                        for q in ("p50_ms", "p90_ms", "p99_ms")
                    },
                }
                if args.newcomers
                else {}
            ),
        }
        for name in runs
    }
    # Under attack against unattacked, same server (the figures that count on a shared
    # machine: both from the same interleaved rounds).
    for name, kind in runs_of:
        label = _label(name, kind, args.hostile)
        if kind is not None:
            attacked, calm = summary[label], summary[name]
            summary[label]["agents_vs_unattacked"] = (
                attacked["requests_per_s"] / calm["requests_per_s"]
            )
            if args.newcomers:
                summary[label]["newcomers_vs_unattacked"] = (
                    attacked["newcomers_requests_per_s"] / calm["newcomers_requests_per_s"]
                )
    if len(systems) == 2:
        summary["batched_vs_unbatched_throughput"] = (
            summary["batched"]["requests_per_s"] / summary["unbatched"]["requests_per_s"]
        )
    report = {
        "benchmark": "serve_load",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "config": {
            "requests_per_run": args.requests,
            "clients": args.clients,
            "agent_processes": args.agent_processes,
            "rounds": args.rounds,
            "hostile_sockets_per_kind": args.hostile,
            "hostile_kinds": args.kinds,
            "hostile_max_opens": args.hostile_max_opens,
            "max_connections": args.max_connections,
            "newcomers": args.newcomers,
            "hostile_warmup_s": args.hostile_warmup_s,
            "env": "CartPole-v1",
            "policy": "64-64 tanh MLP, stochastic",
            "systems": systems,
            "load": "agents: --agent-processes asyncio processes (httpx); hostile sockets: "
            "another; each "
            "server in its own process; loopback; all share the machine's cores",
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


def _label(name: str, kind: str | None, hostile: int) -> str:
    return f"{name}+{hostile}_{kind}" if kind else name


if __name__ == "__main__":
    main()
