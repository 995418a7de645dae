"""jaxrunner's EnvRunner against RLlib's MultiAgentEnvRunner (issue 28).

One env, MPE ``simple_spread_v3`` from ``mpe2`` at its defaults (3 agents, 25 steps
per episode, discrete actions), one policy shared by the three agents, a 64-64 tanh
MLP sampling its actions on every side. Per width (8 and 64 envs):

* ``jaxrunner``: ``EnvRunner.sample()`` as ``jaxrunner bench --env
  mpe2:simple_spread_v3`` measures it (``jaxrunner._src.bench``'s child at jaxrunner's
  defaults), on the sync backend (``jaxrunner bench``'s default) and on the process
  backend (one worker per CPU).
* ``hand``: the multi-agent hand loop, the bench's reference (for context).
* ``floor``: in the parent process, the same PettingZoo envs stepped in turn with
  random actions drawn ahead, no policy and no recording: the most one process
  stepping them reaches, so ``floor / rllib`` bounds what any in-process sampler of
  these envs can show against RLlib.
* ``rllib``: RLlib's ``MultiAgentEnvRunner`` (new API stack), in its own process
  under the RLlib venv's interpreter: ``PPOConfig().environment(...)`` with the env
  registered through RLlib's ``ParallelPettingZooEnv`` wrapper,
  ``.env_runners(num_env_runners=0, num_envs_per_env_runner=N)``, one policy for every
  agent (``.multi_agent``), ``DefaultModelConfig(fcnet_hiddens=[64, 64])`` (tanh is
  its default), everything else at RLlib's defaults (PPO's RLModule, its connectors,
  its sync vector env); ``sample(num_timesteps=T * N, explore=True)`` per call.
  Torch runs one thread by default (``--torch-threads``): what Ray gives each
  EnvRunner actor at RLlib's defaults (``num_cpus_per_env_runner=1`` sets
  ``OMP_NUM_THREADS=1``); torch's own default (one thread per core) makes every tiny
  matmul wait on the others on a loaded machine (``--torch-threads 0`` measures it).

Every system is built and warmed up (one rollout) before timing, then timed in
interleaved rounds (``jaxrunner._src.bench.measure_width``: each system in turn, the first
one rotating); figures are medians over rounds, the ratio jaxrunner's median / the
other's. One env step is one step of one sub-env; agent steps count each agent acting
(RLlib's own count: ``MultiAgentEpisode.agent_steps()``; jaxrunner's: env steps x
agents, as every MPE agent acts every step). ``T = max(8, 2048 // N)`` for all. Each
measurement also reports its process's CPU seconds: env steps per CPU second, and on
the sync backend (one process per system) their ratios, move less with other
sessions' load than wall-clock figures.

Usage (RLlib in its own venv, see benchmarks/README.md)::

    python benchmarks/rllib_multi_agent.py --rllib-python /work/venv-rllib/bin/python \\
        --out benchmarks/results/multi_agent_rllib_cpu.json
    python benchmarks/rllib_multi_agent.py --quick --no-rllib   # jaxrunner half, smoke
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import pathlib
import platform
import statistics
import sys
import time
import traceback
from typing import Any

ENV = "mpe2:simple_spread_v3"
QUICK_LENGTH = 16  # --quick: a smoke run, not a measurement (MPE steps cost ~1 ms)
HIDDEN = (64, 64)
POLICY = "shared"
TARGET = 5.0  # issue 28: jaxrunner >= 5x RLlib's env steps/s
RLLIB_VERSIONS = ("ray", "torch", "gymnasium", "pettingzoo", "mpe2", "numpy")
JAXRUNNER_VERSIONS = ("pettingzoo", "mpe2", "ray")


def versions(names: tuple[str, ...]) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


# --- the RLlib side: runs under the RLlib venv's interpreter (no jax there) -----------------


class RLlibSystem:
    """RLlib's ``MultiAgentEnvRunner`` of ``num_envs`` simple_spread envs, warmed up."""

    def __init__(self, num_envs: int, rollout_length: int, seed: int) -> None:
        from mpe2 import simple_spread_v3
        from ray.rllib.algorithms.ppo import PPOConfig
        from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
        from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
        from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv
        from ray.tune.registry import register_env

        name = ENV.replace(":", "_")
        self.model = DefaultModelConfig(fcnet_hiddens=list(HIDDEN))  # tanh: its default
        register_env(name, lambda _: ParallelPettingZooEnv(simple_spread_v3.parallel_env()))
        self.config = (
            PPOConfig()
            .environment(name)
            .env_runners(num_env_runners=0, num_envs_per_env_runner=num_envs)
            .multi_agent(policies={POLICY}, policy_mapping_fn=lambda agent, *_, **__: POLICY)
            .rl_module(model_config=self.model)
            .debugging(seed=seed)
        )
        self.runner = MultiAgentEnvRunner(config=self.config)
        self.num_timesteps = rollout_length * num_envs
        self._rollout()  # warm-up: first resets

    def _rollout(self) -> tuple[int, int]:
        """One ``sample()``: (env steps, agent steps) taken, as RLlib's episodes count."""
        episodes = self.runner.sample(num_timesteps=self.num_timesteps, explore=True)
        return sum(e.env_steps() for e in episodes), sum(e.agent_steps() for e in episodes)

    def measure(self, seconds: float) -> dict[str, Any]:
        # jaxrunner._src.bench.timed's loop, counting agent steps too (no jaxrunner here).
        env_steps = agent_steps = 0
        start = time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            env, agents = self._rollout()
            env_steps, agent_steps = env_steps + env, agent_steps + agents
        return {"steps_per_s": env_steps / elapsed, "agent_steps_per_s": agent_steps / elapsed}

    def describe(self) -> dict[str, Any]:
        model = self.model
        return {
            "module": str(self.runner.module).replace("\n", " "),
            "fcnet_hiddens": list(model.fcnet_hiddens),
            "fcnet_activation": model.fcnet_activation,
            "gym_env_vectorize_mode": str(self.config.gym_env_vectorize_mode),
            "explore": True,
        }

    def close(self) -> None:
        self.runner.stop()


def serve_rllib(torch_threads: int) -> None:
    """The RLlib child: ``jaxrunner._src.bench.child``'s protocol (one JSON request per line
    on stdin, one ``{"ok": ..., "result"|"error": ...}`` reply per line on stdout), its
    serving loop written again here since this venv cannot import jaxrunner."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # library prints go to stderr
    import torch

    if torch_threads > 0:
        torch.set_num_threads(torch_threads)
    systems: dict[str, RLlibSystem] = {}
    for line in sys.stdin:
        request = json.loads(line)
        op, name = request["op"], request.get("name")
        try:
            if op == "exit":
                break
            if op == "info":
                result: Any = {
                    "python": platform.python_version(),
                    "executable": sys.executable,
                    "torch_num_threads": torch.get_num_threads(),
                    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                    **versions(RLLIB_VERSIONS),
                }
            elif op == "build":
                if name in systems:
                    systems.pop(name).close()
                start = time.perf_counter()
                spec = request["spec"]
                systems[name] = RLlibSystem(spec["num_envs"], spec["rollout_length"], spec["seed"])
                result = {"build_s": time.perf_counter() - start, **systems[name].describe()}
            elif op == "measure":
                cpu, wall = time.process_time(), time.perf_counter()
                result = systems[name].measure(float(request["seconds"]))
                result["cpu_s"] = time.process_time() - cpu
                result["wall_s"] = time.perf_counter() - wall
            elif op == "close":
                systems.pop(name).close()
                result = None
            else:
                raise ValueError(f"unknown op {op!r}")
            reply = {"ok": True, "result": result}
        except Exception as err:
            traceback.print_exc()
            reply = {"ok": False, "error": f"{op} {name or ''}: {type(err).__name__}: {err}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    for system in systems.values():
        system.close()


# --- the parent: runs in jaxrunner's venv ---------------------------------------------------


class RLlibProxy:
    """The RLlib child's system, timed by ``measure_width`` as a local system."""

    def __init__(self, child: Any) -> None:
        self.child = child

    def measure(self, seconds: float) -> dict[str, Any]:
        return self.child.request("measure", name="rllib", seconds=seconds)


class EnvFloor:
    """``num_envs`` simple_spread envs stepped in turn with random action dicts drawn
    ahead, each reset once no agent is left: no policy, no recording."""

    def __init__(self, num_envs: int, length: int, seed: int) -> None:
        from jaxrunner._src import bench

        self.envs = [bench.env_factory(ENV)() for _ in range(num_envs)]
        for i, env in enumerate(self.envs):
            env.reset(seed=seed + i)
            for agent in env.possible_agents:
                env.action_space(agent).seed(seed + i)
        self.pool = [
            [{a: env.action_space(a).sample() for a in env.possible_agents} for env in self.envs]
            for _ in range(97)
        ]
        self.cursor, self.length = 0, length

    def _rollout(self) -> int:
        for _ in range(self.length):
            for env, actions in zip(self.envs, self.pool[self.cursor]):
                env.step(actions)
                if not env.agents:
                    env.reset()
            self.cursor = (self.cursor + 1) % len(self.pool)
        return self.length * len(self.envs)

    def measure(self, seconds: float) -> dict[str, Any]:
        from jaxrunner._src import bench

        cpu, wall = time.process_time(), time.perf_counter()
        rate = bench.timed(self._rollout, seconds)
        cpu_s, wall_s = time.process_time() - cpu, time.perf_counter() - wall
        return {"steps_per_s": rate, "cpu_s": cpu_s, "wall_s": wall_s}

    def close(self) -> None:
        for env in self.envs:
            env.close()


def cpu_model() -> str | None:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def per_system(row: dict[str, Any], num_agents: int) -> None:
    """Adds each system's median agent steps/s and env steps per CPU second of its
    process to ``row``; on the sync backend (one process per system) also the ratios
    per CPU second, which move less with other sessions' load than the wall's."""
    for name, system in row["systems"].items():
        system["env_steps_per_cpu_s"] = statistics.median(
            r["steps_per_s"] * r["wall_s"] / r["cpu_s"] for r in system["all_rounds"]
        )
        if name == "jaxrunner" and row["backend"] != "sync":
            system["env_steps_per_cpu_s"] = None  # its env workers' CPU is not counted
    if row["backend"] == "sync" and "jaxrunner" in row["systems"]:
        ours = row["systems"]["jaxrunner"]["env_steps_per_cpu_s"]
        row["ratios_per_cpu_s"] = {
            name: ours / system["env_steps_per_cpu_s"]
            for name, system in row["systems"].items()
            if name != "jaxrunner"
        }
    for name, system in row["systems"].items():
        if name == "rllib":
            rates = [r["agent_steps_per_s"] for r in system["all_rounds"]]
            system["agent_steps_per_s"] = statistics.median(rates)
            system["agents_per_env_step"] = system["agent_steps_per_s"] / system["median"]
        else:
            system["agent_steps_per_s"] = num_agents * system["median"]


def summary(rows: list[dict[str, Any]]) -> tuple[list[str], str]:
    """A markdown table of the rows and the verdict on issue 28's target."""
    table = [
        "| backend | envs | jaxrunner env steps/s | RLlib env steps/s | hand loop | env floor "
        "| jaxrunner / RLlib [min-max] | floor / RLlib | jaxrunner / RLlib per CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    verdicts = []
    for row in rows:
        systems, ratio = row["systems"], row["ratios"].get("rllib")

        def rate(name: str, systems: dict[str, Any] = systems) -> str:
            return f"{systems[name]['median']:,.0f}" if name in systems else "-"

        cell = f"{ratio['median']:.2f} [{ratio['min']:.2f}-{ratio['max']:.2f}]" if ratio else "-"
        bound, per_cpu = "-", "-"
        if "rllib" in row.get("ratios_per_cpu_s", {}):
            per_cpu = f"{row['ratios_per_cpu_s']['rllib']:.2f}"
        if "floor" in systems and "rllib" in systems:
            bound = f"{systems['floor']['median'] / systems['rllib']['median']:.2f}"
        table.append(
            f"| {row['backend']} | {row['num_envs']} | {rate('jaxrunner')} | {rate('rllib')} "
            f"| {rate('hand')} | {rate('floor')} | {cell} | {bound} | {per_cpu} |"
        )
        if ratio:
            holds = "holds" if ratio["median"] >= TARGET else "does not hold"
            line = f"{row['backend']} x{row['num_envs']}: {ratio['median']:.2f}x ({holds}"
            if per_cpu != "-":
                line += f"; {per_cpu}x per CPU second"
            verdicts.append(line + ")")
    verdict = (
        f"jaxrunner / RLlib MultiAgentEnvRunner, target >= {TARGET:g}x: " + "; ".join(verdicts)
        if verdicts
        else "no verdict: RLlib was not measured"
    )
    return table, verdict


def run(args: argparse.Namespace) -> None:
    from jaxrunner._src import bench
    from jaxrunner._src.bench.child import Child
    from jaxrunner._src.bench.multi_agent import describe

    started = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.0f} s] {message}", file=sys.stderr, flush=True)

    load_before = os.getloadavg()
    num_agents = len(describe(ENV)["agents"])
    skipped: dict[str, str] = {}
    rows: list[dict[str, Any]] = []
    rllib = rllib_info = None
    if args.no_rllib:
        skipped["rllib"] = "off (--no-rllib)"
    else:
        command = [args.rllib_python, __file__, "--serve-rllib"]
        command += ["--torch-threads", str(args.torch_threads)]
        rllib = Child("rllib", jax_defaults=False, command=command)
    try:
        if rllib is not None:
            rllib_info = rllib.request("info")
        with bench.Harness() as harness:
            children = harness.info()
            for width in args.widths:
                length = QUICK_LENGTH if args.quick else bench.rollout_length(width)
                floor = EnvFloor(width, length, args.seed)
                local: dict[str, Any] = {"floor": floor}
                if rllib is not None:
                    spec = {"num_envs": width, "rollout_length": length, "seed": args.seed}
                    build = rllib.request("build", name="rllib", spec=spec)
                    log(f"rllib x{width} built in {build['build_s']:.1f} s")
                    local["rllib"] = RLlibProxy(rllib)
                for backend in args.backends:
                    row = bench.measure_width(
                        harness,
                        bench.MULTI_AGENT_PLANS[backend],
                        ENV,
                        width,
                        rounds=args.rounds,
                        seconds=args.seconds,
                        seed=args.seed,
                        ceiling=False,
                        local=local,
                        log=log,
                        rollout_length=length,
                    )
                    per_system(row, num_agents)
                    if rllib is not None:
                        row["rllib_build"] = build
                    rows.append(row)
                floor.close()
                if rllib is not None:
                    rllib.request("close", name="rllib")
    finally:
        if rllib is not None:
            rllib.close()
    table, verdict = summary(rows)
    machine = children["jaxrunner"]["machine"]
    report = {
        "benchmark": "multi_agent_rllib",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "python_executable": sys.executable,
        "config": {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()},
        "env": f"{ENV} parallel_env() at its defaults ({num_agents} agents)",
        "policy": f"one shared {HIDDEN} tanh MLP, stochastic actions, on every side",
        "rollout_length": f"{QUICK_LENGTH} (--quick)"
        if args.quick
        else "max(8, 2048 // width) for every system",
        "machine": {
            **machine,
            "cpu_model": cpu_model(),
            **versions(JAXRUNNER_VERSIONS),
            "rllib_venv": rllib_info,
        },
        "children": {
            k: {n: v for n, v in c.items() if n != "machine"} for k, c in children.items()
        },
        "autogroup": bench.autogroup(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "wall_s": time.perf_counter() - started,
        "skipped": skipped,
        "results": rows,
        "verdict": verdict,
        "markdown_table": "\n".join(table),
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        log(f"wrote {args.out}")
    print("\n".join(table))
    print(verdict)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--backends", nargs="+", default=["sync", "process"])
    parser.add_argument("--seconds", type=float, default=2.0, help="per system per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; median kept")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rllib-python",
        default="/work/venv-rllib/bin/python",
        help="the interpreter of a venv with ray[rllib], torch, pettingzoo and mpe2 "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch threads in the RLlib child; 0: torch's default (default: %(default)s, "
        "as Ray sets for an EnvRunner actor)",
    )
    parser.add_argument("--no-rllib", action="store_true", help="the jaxrunner half alone")
    parser.add_argument(
        "--quick", action="store_true", help=f"8 envs, sync, 2 short rounds, T={QUICK_LENGTH}"
    )
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--serve-rllib", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_rllib:
        serve_rllib(args.torch_threads)
        return
    if args.quick:
        args.widths, args.backends, args.rounds, args.seconds = [8], ["sync"], 2, 0.05
    unknown = [b for b in args.backends if b not in ("sync", "process")]
    if unknown:
        parser.error(f"--backends {unknown}: expected sync and/or process")
    if not args.no_rllib and not os.access(args.rllib_python, os.X_OK):
        parser.error(
            f"--rllib-python {args.rllib_python}: no such interpreter. Make RLlib's venv "
            "(python3 -m venv /work/venv-rllib && /work/venv-rllib/bin/pip install "
            '"ray[rllib]" torch pettingzoo mpe2), name another with --rllib-python, or '
            "pass --no-rllib for the jaxrunner half alone."
        )
    run(args)


if __name__ == "__main__":
    main()
