"""Where one host-loop step's time goes, at small widths: microseconds per step of
the runner and of its parts, next to the hand-written loop and its parts.

The env is a null one (its ``step`` does nothing), so what is left is the sampler's
own cost. Parts, each timed alone in 64-step blocks, interleaved round by round
(median and minimum of the rounds kept):

* ``runner``: ``EnvRunner.sample()``.
* ``runner_policy``: the runner's policy call alone (``CompiledPolicyStep`` dispatch
  and collect: staging, the compiled call, ``np.asarray``).
* ``runner_step_batch``: the vector env's ``step_batch`` alone.
* ``hand_loop``: the recording hand loop over gymnasium ``SyncVectorEnv``
  (``jaxrunner._src.bench.hand_loop``).
* ``hand_policy``: the hand loop's jitted call and numpy conversion alone.
* ``gym_step``: gymnasium ``SyncVectorEnv.step`` alone.
* ``warm_call``: the compiled policy step called back to back with nothing between
  (no staging, one ``np.asarray``: the floor of any loop with one policy call per step).

``--cpu-dispatch`` (``script_report.parse_args``; inline by default).

Usage::

    python benchmarks/step_costs.py --out benchmarks/results/step_costs_cpu.json
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time
from collections.abc import Callable

import gymnasium
import jax
import numpy as np
from script_report import parse_args, write_report

import jaxrunner as jr
from jaxrunner._src import bench
from jaxrunner._src.samplers.policy_step import CompiledPolicyStep, host_actor_state

STEPS = 64


class NullEnv(gymnasium.Env):
    """CartPole's spaces, a step that does nothing, 200-step episodes."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self) -> None:
        self._obs = np.zeros(4, np.float32)
        self._t = 0

    def reset(self, *, seed=None, options=None):
        self._t = 0
        return self._obs, {}

    def step(self, action):
        self._t += 1
        return self._obs, 1.0, False, self._t >= 200, {}


def parts(num_envs: int) -> tuple[dict[str, Callable[[], object]], Callable[[], None]]:
    """The timed blocks (each does ``STEPS`` steps) and a function closing the envs."""
    envs = jr.make_vec(NullEnv, num_envs)
    policy = bench.mlp_policy(envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    runner = jr.EnvRunner(envs, policy, params, STEPS, 0, num_splits=1)
    gym_envs = gymnasium.vector.SyncVectorEnv(
        [NullEnv] * num_envs, autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP
    )
    hand = bench.RecordingHandLoop(gym_envs, STEPS, 0).rollout
    act = bench.hand_act(policy, num_envs)
    obs, _ = gym_envs.reset(seed=0)
    actions = np.zeros(num_envs, np.int64)
    # The runner's compiled policy step, built as its lockstep sampler builds it.
    state, _ = host_actor_state(policy, 0, num_envs, None, envs.single_observation_space)
    call = CompiledPolicyStep(policy, params, state, num_envs, obs)
    stage = call.new_stage()
    stage.env_index[:] = np.arange(num_envs)
    key = jax.random.key(0)

    def repeat(step: Callable[[], object]) -> Callable[[], None]:
        def block() -> None:
            for _ in range(STEPS):
                step()

        return block

    def hand_policy() -> None:
        nonlocal key
        action, extras, key = act(params, obs, key)
        np.asarray(action)
        jax.tree.map(np.asarray, extras)

    def runner_policy() -> None:
        nonlocal state
        stage.obs[:] = obs
        pending, state = call.dispatch(params, state, stage)
        call.collect(pending)

    def warm_call() -> None:
        nonlocal state
        pending, state = call.dispatch(params, state, stage)
        np.asarray(pending)

    blocks = {
        "runner": runner.sample,
        "runner_policy": repeat(runner_policy),
        "runner_step_batch": repeat(lambda: envs.step_batch(actions)),
        "hand_loop": hand,
        "hand_policy": repeat(hand_policy),
        "gym_step": repeat(lambda: gym_envs.step(actions)),
        "warm_call": repeat(warm_call),
    }

    def close() -> None:
        runner.stop()
        gym_envs.close()

    return blocks, close


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--blocks", type=int, default=5, help="64-step blocks per round")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parse_args(parser)

    rows = []
    for num_envs in args.num_envs:
        blocks, close = parts(num_envs)
        try:
            for block in blocks.values():  # warm-up: compiles, first resets
                block()
            us: dict[str, list[float]] = {name: [] for name in blocks}
            for _ in range(args.rounds):
                for name, block in blocks.items():
                    start = time.perf_counter()
                    for _ in range(args.blocks):
                        block()
                    us[name].append((time.perf_counter() - start) / (args.blocks * STEPS) * 1e6)
        finally:
            close()
        row = {"num_envs": num_envs}
        row.update({f"{k}_us_median": statistics.median(v) for k, v in us.items()})
        row.update({f"{k}_us_min": min(v) for k, v in us.items()})
        rows.append(row)
        print(
            f"{num_envs:>4} envs, us per step (median): "
            + "  ".join(f"{k}={statistics.median(v):.1f}" for k, v in us.items())
        )
    write_report("step_costs", args, rows)


if __name__ == "__main__":
    main()
