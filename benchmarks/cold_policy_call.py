"""A policy call right after an EnvPool step, against the same call back to back.

Beside EnvPool, the compiled policy step of the runner and the hand loop's jitted policy
both take two to three times what they take called back to back. This times, in one process,
each call on its own (``back_to_back``), right after a sleep of ``--sleep-us``
(``after_sleep``: the CPU idled) and right after a sync EnvPool step of ``--num-envs``
CartPoles (``after_envpool_step``), ``--calls`` times each, in interleaved rounds:

* ``tiny``: a jitted ``x + 1`` of 8 floats (the dispatch alone);
* ``hand_policy``: the hand loop's jitted policy step (``hand_act``) for the envs;
* ``runner_step``: the runner's compiled policy step (``CompiledPolicyStep``, its default
  chunk) for the envs, its result read back;
* ``numpy_mlp``: the benchmark MLP's layers in numpy (no JAX).

Per case and call: the median microseconds over all rounds' calls.

Usage (needs the ``envpool`` extra)::

    python benchmarks/cold_policy_call.py --num-envs 64 \\
        --out benchmarks/results/cold_policy_call_cpu.json
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from script_report import parse_args, write_report

from jaxrunner._src.bench.hand_loop import hand_act, single_spaces
from jaxrunner._src.samplers.batch_invariance import policy_chunk_rows
from jaxrunner._src.samplers.policy_step import CompiledPolicyStep, host_actor_state
from jaxrunner.models import mlp_policy

CASES = ("back_to_back", "after_sleep", "after_envpool_step")


def calls(num_envs: int, obs_space: Any, action_space: Any) -> dict[str, Callable[[], Any]]:
    """Each call of the module's docstring, built and warmed up."""
    policy = mlp_policy(action_space)
    params = policy.init(jax.random.key(0), obs_space)
    obs = np.zeros((num_envs, *obs_space.shape), obs_space.dtype)
    act, key = hand_act(policy, num_envs), [jax.random.key(0)]

    def hand_policy() -> Any:
        action, extras, key[0] = act(params, obs, key[0])
        return np.asarray(action), np.asarray(extras["log_prob"])

    state, _ = host_actor_state(policy, 0, num_envs, None, obs_space)
    chunk = policy_chunk_rows(policy, params, obs_space, num_envs)
    step = CompiledPolicyStep(policy, params, state, num_envs, obs, chunk_rows=chunk)
    stage, held = step.new_stage(), [state]

    def runner_step() -> Any:
        pending, held[0] = step.dispatch(params, held[0], stage)
        return step.collect(pending)

    tiny_fn, eight = jax.jit(lambda x: x + 1), np.zeros(8, np.float32)
    layers = [
        (np.asarray(p["kernel"]), np.asarray(p["bias"]))
        for p in jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, dict) and "kernel" in x)
    ]

    def numpy_mlp() -> Any:
        h = obs
        for kernel, bias in layers:
            h = np.tanh(h @ kernel + bias)
        return h

    built = {
        "tiny": lambda: np.asarray(tiny_fn(eight)),
        "hand_policy": hand_policy,
        "runner_step": runner_step,
        "numpy_mlp": numpy_mlp,
    }
    for call in built.values():
        for _ in range(20):
            call()
    return built


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import envpool  # type: ignore[import-not-found]  # an optional extra

    pool = envpool.make_gymnasium("CartPole-v1", num_envs=args.num_envs, seed=0)
    pool.reset()
    actions = np.zeros(args.num_envs, np.int32)
    before = {
        "back_to_back": lambda: None,
        "after_sleep": lambda: time.sleep(args.sleep_us * 1e-6),
        "after_envpool_step": lambda: pool.step(actions),
    }
    built = calls(args.num_envs, *single_spaces(pool))
    times: dict[str, dict[str, list[float]]] = {c: {n: [] for n in built} for c in CASES}
    for r in range(args.rounds):
        for case in CASES if r % 2 == 0 else CASES[::-1]:
            for name, call in built.items():
                wait, kept = before[case], times[case][name]
                for _ in range(args.calls):
                    wait()
                    clock = time.perf_counter_ns()
                    call()
                    kept.append((time.perf_counter_ns() - clock) / 1e3)
    pool.close()
    median_us = {c: {n: statistics.median(t) for n, t in ts.items()} for c, ts in times.items()}
    over = {
        c: {n: median_us[c][n] / median_us["back_to_back"][n] for n in built} for c in CASES[1:]
    }
    return {"num_envs": args.num_envs, "median_us": median_us, "over_back_to_back": over}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--calls", type=int, default=500, help="calls per case, round and call")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--sleep-us", type=float, default=100.0)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parse_args(parser)
    write_report("cold_policy_call", args, [measure(args)])


if __name__ == "__main__":
    main()
