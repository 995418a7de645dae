"""Multi-agent sampling benchmark: jaxrunner against the loops a user writes by hand.

Two parts (``--part``). Each system runs in its own persistent child process, at its
own defaults: the hand-written references with ``JAX_CPU_ENABLE_ASYNC_DISPATCH=true``
(JAX's default, which a user who never imports jaxrunner gets), jaxrunner as
``import jaxrunner`` leaves it. Rounds interleave: the parent asks each child in turn
to measure for ``--seconds``; the figures are medians over the rounds, the ratio the
median of the per-round ratios. Each child's dispatch mode is in the report.

* ``host``: MPE ``simple_spread_v3`` (3 agents, PettingZoo parallel API) at widths
  1, 8, 64, 256. ``jaxrunner``: ``EnvRunner.sample()`` on the sync backend
  (the default); ``jaxrunner_process``: the same on ``backend="process"`` at its
  defaults (one worker per CPU, two pipelining splits from 2 envs);
  ``jaxrunner_process_2splits``: the process backend with ``num_splits=2`` named
  (one split's policy steps while the other's envs step: the default since
  ``multi_agent_host_quiet_cpu.json``, kept to compare with that run);
  ``jaxrunner_auto``: ``EnvRunner.from_env(make_env, ...)`` at its defaults, the layout
  its trial of the policy keeps (the trial is in the child's build, not its rates).
  ``hand_loop``: ``jaxrunner._src.bench.MultiAgentHandLoop``, a list of the same PettingZoo
  envs; per step the agents' observations stacked into one ``[B * 3, 18]`` array, one
  jitted policy call (the benchmark MLP: actions and log-probs), ``np.asarray``,
  obs/action/log-prob/reward/flags written into preallocated ``[T, B, 3]`` arrays, each
  env stepped with its action dict and reset where no agent is left. The same
  comparison, at ``jaxrunner bench``'s rollout lengths and with its report, is
  ``jaxrunner bench --env mpe2:simple_spread_v3 --backend all``.
  With ``--peers-python`` (a venv with ``pufferlib-core``, jaxrunner's dependencies,
  ``pettingzoo`` and ``mpe2``): ``puffer_serial`` and ``puffer_mp``, PufferLib's
  PettingZoo emulation by hand (``PettingZooPufferEnv``, its agents as rows, vectorized by
  ``Serial`` or ``Multiprocessing`` as ``peer_loops.puffer_envs`` does), the same jitted
  policy once per step on every row, obs/action/log-prob/reward/flags/mask written into
  ``[T, B * 3]`` arrays; each jaxrunner system's ratio to each of them is reported too.
* ``jaxmarl``: JaxMARL's ``MPE_simple_spread_v3`` at 4096 envs. ``jaxrunner``:
  ``EnvRunner` (multi-agent)` on a ``JaxMultiAgentVectorEnv`` (one jitted scan per sample,
  true final observations, episode bookkeeping and metrics included). ``hand_scan``:
  one jitted ``lax.scan`` of the same policy and ``env.step`` (JaxMARL's own
  autoreset) under ``vmap``, the transitions stacked as outputs. Needs ``jaxmarl``
  (the ``[jaxmarl]`` extra, beside gymnax: gymnasium<1.4).

Figures are env steps/s and agent steps/s (3 agents per env step).

Usage::

    python benchmarks/multi_agent.py --part host \
        --out benchmarks/results/multi_agent_host_cpu.json
    python benchmarks/multi_agent.py --part jaxmarl \
        --out benchmarks/results/multi_agent_jaxmarl_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from script_report import write_report

import jaxrunner as jr
from jaxrunner._src import bench

NUM_AGENTS = 3
LAYOUTS: dict[str, str] = {}
"""What ``EnvRunner.from_env`` chose in this child, and why (``jaxrunner_auto``)."""
ASYNC_DISPATCH_ENV = "JAX_CPU_ENABLE_ASYNC_DISPATCH"


def make_env() -> Any:
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=NUM_AGENTS, max_cycles=25)


def _policy() -> tuple[jr.Policy, Any]:
    from gymnasium import spaces

    policy = bench.mlp_policy(spaces.Discrete(5))
    obs_space = spaces.Box(-np.inf, np.inf, (18,), np.float32)
    return policy, policy.init(jax.random.key(0), obs_space)


def jaxrunner_host(
    num_envs: int, rollout: int, backend: str = "sync", num_splits: int | None = None
) -> tuple[Callable[[], int], Callable[[], None]]:
    envs = jr.make_vec(make_env, num_envs, backend)
    policy, params = _policy()
    runner = jr.EnvRunner(envs, policy, params, rollout, seed=0, num_splits=num_splits)
    runner.sample()  # warm-up

    def step() -> int:
        runner.sample()
        return rollout * num_envs

    return step, runner.stop


def jaxrunner_auto_host(
    num_envs: int, rollout: int
) -> tuple[Callable[[], int], Callable[[], None]]:
    policy, params = _policy()
    runner = jr.EnvRunner.from_env(make_env, num_envs, policy, params, rollout, seed=0)
    LAYOUTS["jaxrunner_auto"] = runner.envs.layout_choice.reason
    runner.sample()  # warm-up

    def step() -> int:
        runner.sample()
        return rollout * num_envs

    return step, runner.stop


def hand_loop_host(num_envs: int, rollout: int) -> tuple[Callable[[], int], Callable[[], None]]:
    loop = bench.MultiAgentHandLoop(make_env, num_envs, rollout, seed=0)
    loop.rollout()  # warm-up (compiles the policy)
    return loop.rollout, loop.close


def puffer_host(
    reference: str, num_envs: int, rollout: int
) -> tuple[Callable[[], int], Callable[[], None]]:
    from peer_loops import puffer_envs

    vecenv = puffer_envs(reference, make_env, num_envs, seed=0, pettingzoo=True)
    policy, params = _policy()
    rows = num_envs * NUM_AGENTS
    act = bench.hand_act(policy, rows)
    shape = (rollout, rows)
    buf = {
        "obs": np.zeros((*shape, 18), np.float32),
        "action": np.zeros(shape, np.int64),
        "log_prob": np.zeros(shape, np.float32),
        "reward": np.zeros(shape, np.float32),
        "terminal": np.zeros(shape, np.bool_),
        "truncation": np.zeros(shape, np.bool_),
        "mask": np.zeros(shape, np.bool_),
    }
    vecenv.async_reset(0)
    obs = vecenv.recv()[0]
    state = {"obs": obs, "key": jax.random.key(0)}

    def step() -> int:
        obs, key = state["obs"], state["key"]
        for t in range(rollout):
            buf["obs"][t] = obs
            action, extras, key = act(params, obs, key)
            action = np.asarray(action)
            buf["action"][t] = action
            buf["log_prob"][t] = np.asarray(extras["log_prob"])
            vecenv.send(action)  # PufferLib's own loop: send, then recv with the masks
            obs, reward, terminal, truncation, _, _, _, mask = vecenv.recv()
            buf["reward"][t], buf["terminal"][t], buf["truncation"][t] = (
                reward,
                terminal,
                truncation,
            )
            buf["mask"][t] = mask
        state.update(obs=obs, key=key)
        return rollout * num_envs

    step()  # warm-up (compiles the policy)
    return step, vecenv.close


def jaxrunner_scan(env: Any, num_envs: int, rollout: int) -> tuple[Callable[[], int], Any]:
    envs = jr.multi_agent.JaxMultiAgentVectorEnv(env, num_envs, dones_are_truncations=True)
    policy, params = _policy()
    runner = jr.EnvRunner(envs, policy, params, rollout, seed=0)
    jax.block_until_ready(runner.sample().groups)

    def step() -> int:
        jax.block_until_ready(runner.sample().groups)
        return rollout * num_envs

    return step, runner.stop


def hand_scan(env: Any, num_envs: int, rollout: int) -> tuple[Callable[[], int], Any]:
    policy, params = _policy()
    agents = env.agents
    obs, state = jax.vmap(env.reset)(jax.random.split(jax.random.key(0), num_envs))

    def one(carry: Any, _: Any) -> Any:
        obs, state, key = carry
        key, k_act, k_env = jax.random.split(key, 3)
        stacked = jnp.stack([obs[a] for a in agents], axis=1).reshape(-1, 18)
        keys = jax.random.split(k_act, num_envs * NUM_AGENTS)
        action, extras, _ = policy.apply_fn(params, stacked, None, keys)
        action = action.reshape(num_envs, NUM_AGENTS)
        actions = {a: action[:, k] for k, a in enumerate(agents)}
        new_obs, state, reward, done, _ = jax.vmap(env.step)(
            jax.random.split(k_env, num_envs), state, actions
        )
        out = (
            stacked.reshape(num_envs, NUM_AGENTS, 18),
            action,
            extras["log_prob"].reshape(num_envs, NUM_AGENTS),
            jnp.stack([reward[a] for a in agents], 1),
            jnp.stack([done[a] for a in agents], 1),
        )
        return (new_obs, state, key), out

    @jax.jit
    def rollout_fn(carry: Any) -> Any:
        return jax.lax.scan(one, carry, None, rollout)

    carry = (obs, state, jax.random.key(1))
    carry, out = rollout_fn(carry)
    jax.block_until_ready(out)

    def step() -> int:
        nonlocal carry
        carry, out = rollout_fn(carry)
        jax.block_until_ready(out)
        return rollout * num_envs

    return step, lambda: None


def build(part: str, name: str, width: int, rollout: int) -> tuple[Callable[[], int], Any]:
    """One system, warmed up: ``(step, stop)``."""
    if part == "host":
        if name == "hand_loop":
            return hand_loop_host(width, rollout)
        if name.startswith("puffer"):
            return puffer_host(name, width, rollout)
        if name == "jaxrunner_auto":
            return jaxrunner_auto_host(width, rollout)
        backend, num_splits = {
            "jaxrunner": ("sync", None),
            "jaxrunner_process": ("process", None),
            "jaxrunner_process_2splits": ("process", min(2, width)),  # 1 env: one split
        }[name]
        return jaxrunner_host(width, rollout, backend, num_splits)
    import jaxmarl

    env = jaxmarl.make("MPE_simple_spread_v3")
    return {"jaxrunner": jaxrunner_scan, "hand_scan": hand_scan}[name](env, width, rollout)


def child(part: str, name: str, width: int, rollout: int) -> None:
    """A system's process: builds it, then answers each ``seconds`` line on stdin with
    a JSON line ``{"rate": env steps/s}`` until stdin closes."""
    # Replies need a clean stdout: keep it for them, anything else printed goes to stderr.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    step, stop = build(part, name, width, rollout)
    reply = {
        "ready": True,
        "cpu_dispatch": "inline" if jr.cpu_dispatch.inline_cpu_dispatch() else "async",
        "layout": LAYOUTS.get(name),
    }
    print(json.dumps(reply), file=replies, flush=True)
    for line in sys.stdin:
        print(json.dumps({"rate": bench.timed(step, float(line))}), file=replies, flush=True)
    stop()


class Child:
    """The parent's handle on one system's process."""

    def __init__(
        self,
        part: str,
        name: str,
        width: int,
        rollout: int,
        reference: bool,
        python: str | None = None,
    ) -> None:
        env = dict(os.environ)
        if reference:  # JAX's default, as for a user who never imports jaxrunner
            env[ASYNC_DISPATCH_ENV] = "true"
        else:  # jaxrunner's own default
            env.pop(ASYNC_DISPATCH_ENV, None)
        command = [python or sys.executable, __file__, "--child", name, "--part", part]
        command += ["--widths", str(width), "--rollout", str(rollout)]
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        ready = self._read()
        self.cpu_dispatch, self.layout = ready["cpu_dispatch"], ready.get("layout")

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"benchmark child {self.proc.args} exited ({self.proc.wait()})")
        return json.loads(line)

    def measure(self, seconds: float) -> float:
        self.proc.stdin.write(f"{seconds}\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return float(self._read()["rate"])

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait()


def interleaved(
    part: str,
    names: tuple[str, ...],
    width: int,
    rollout: int,
    seconds: float,
    rounds: int,
    peers_python: str | None = None,
) -> dict[str, Any]:
    """Rounds of each system in turn (the reference last), each in its child (PufferLib's
    in ``peers_python``); medians, each system's ratio to the reference, and each
    jaxrunner system's to each PufferLib one."""
    children = {
        name: Child(
            part,
            name,
            width,
            rollout,
            reference=not name.startswith("jaxrunner"),
            python=peers_python if name.startswith("puffer") else None,
        )
        for name in names
    }
    rates: dict[str, list[float]] = {name: [] for name in names}
    try:
        for _ in range(rounds):
            for name, c in children.items():
                rates[name].append(c.measure(seconds))
    finally:
        for c in children.values():
            c.close()
    ref = rates[names[-1]]
    ratios = {name: [a / b for a, b in zip(rates[name], ref)] for name in names[:-1]}
    peers = [n for n in names if n.startswith("puffer")]
    vs_peers = {
        f"{name}_ratio_vs_{peer}": statistics.median(
            a / b for a, b in zip(rates[name], rates[peer])
        )
        for name in names
        if name.startswith("jaxrunner")
        for peer in peers
    }
    return {
        "vs_peers": vs_peers,
        "median": {name: statistics.median(r) for name, r in rates.items()},
        "ratio": {name: statistics.median(r) for name, r in ratios.items()},
        "ratios": ratios,
        "cpu_dispatch": {name: c.cpu_dispatch for name, c in children.items()},
        "layouts": {name: c.layout for name, c in children.items() if c.layout},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("host", "jaxmarl"), default="host")
    parser.add_argument("--widths", type=int, nargs="+", default=None)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rollout", type=int, default=None)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--peers-python", default=None, help="a venv's python with pufferlib-core (host part)"
    )
    args = parser.parse_args()
    host = args.part == "host"
    rollout = args.rollout or (64 if host else 128)
    if args.child:
        child(args.part, args.child, args.widths[0], rollout)
        return
    names: tuple[str, ...] = (
        (
            "jaxrunner",
            "jaxrunner_process",
            "jaxrunner_process_2splits",
            "jaxrunner_auto",
            "hand_loop",
        )
        if host
        else ("jaxrunner", "hand_scan")
    )
    if host and args.peers_python:
        names = (*names[:-1], "puffer_serial", "puffer_mp", names[-1])
    dispatch: dict[str, str] = {}
    results = []
    for width in args.widths or ((1, 8, 64, 256) if host else (4096,)):
        out = interleaved(
            args.part, names, width, rollout, args.seconds, args.rounds, args.peers_python
        )
        dispatch = out["cpu_dispatch"]
        results.append(_row(width, out, names[-1]))
        print(results[-1], flush=True)
    machine = {**bench.machine_info(), "jax_cpu_dispatch": dispatch}
    write_report(f"multi_agent_{args.part}", args, results, machine)


def _row(width: int, out: dict[str, Any], reference: str) -> dict[str, Any]:
    med = out["median"]
    return {
        "num_envs": width,
        "num_agents": NUM_AGENTS,
        **{f"{name}_env_steps_per_s": rate for name, rate in med.items()},
        **{f"{name}_agent_steps_per_s": NUM_AGENTS * rate for name, rate in med.items()},
        **{f"{name}_ratio_vs_{reference}": r for name, r in out["ratio"].items()},
        **{f"{name}_ratios_vs_{reference}_per_round": r for name, r in out["ratios"].items()},
        **out["vs_peers"],
        **{f"{name}_layout": layout for name, layout in out["layouts"].items()},
    }


if __name__ == "__main__":
    main()
