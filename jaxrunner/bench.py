"""Throughput measurement: the main job of the ``jaxrunner bench`` command.

Each measurement runs for a fixed wall time after a warm-up (compilation and the
first resets are excluded) and reports env steps per second. Two references,
both with random actions drawn ahead of time and no policy:

* ``raw``: the same vector env stepped through gymnasium's ``envs.step(actions)``
  (autoreset and observation stacking included): what the envs themselves cost.
* ``bare_loop``: the same sub-envs in a bare Python loop, ``env.step`` and
  ``env.reset`` only: a floor no vectorized sampler can beat in one process.

The ratio jaxrunner / raw shows how much of the sampler's own cost (policy,
transfers, trajectory) hides under the env's.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import gymnasium
import jax
import numpy as np

from jaxrunner.cpu_dispatch import (
    inline_cpu_dispatch,
    use_async_cpu_dispatch,
    use_inline_cpu_dispatch,
)
from jaxrunner.envs import make_vec
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.metrics import PERF_KEYS
from jaxrunner.policy import Policy
from jaxrunner.sampling import EnvRunner


class MLP(nn.Module):
    """The benchmark's policy network: a tanh MLP emitting distribution parameters."""

    num_outputs: int
    hidden: tuple[int, ...] = (64, 64)

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = obs.reshape(obs.shape[0], -1).astype(np.float32)
        for width in self.hidden:
            x = nn.tanh(nn.Dense(width)(x))
        return nn.Dense(self.num_outputs)(x)


def mlp_policy(action_space: gymnasium.Space, hidden: tuple[int, ...] = (64, 64)) -> Policy:
    """A stochastic MLP policy for a Discrete, MultiDiscrete, MultiBinary or Box space."""
    if isinstance(action_space, gymnasium.spaces.Discrete):
        outputs = int(action_space.n)
    elif isinstance(action_space, gymnasium.spaces.MultiDiscrete):
        outputs = int(np.sum(action_space.nvec))
    else:
        outputs = int(np.prod(action_space.shape))
    return Policy.from_linen(MLP(outputs, hidden), action_space)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """What ``jaxrunner bench`` measures."""

    env: str = "CartPole-v1"
    """A gymnasium id."""
    widths: tuple[int, ...] = (1, 8, 64, 256)
    """Numbers of sub-envs to measure."""
    backend: str = "sync"
    """jaxrunner backend."""
    seconds: float = 2.0
    """Wall time of each measurement (after warm-up)."""
    rollout_length: int = 64
    """Steps per ``sample()`` call."""
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.widths or any(w < 1 for w in self.widths):
            raise InvalidArgumentError(f"BenchConfig(widths={self.widths}): expected ints >= 1.")
        if self.seconds <= 0:
            raise InvalidArgumentError(f"BenchConfig(seconds={self.seconds}): expected > 0.")


def timed(step: Callable[[], int], seconds: float) -> float:
    """Calls ``step`` (returning env steps done) for ``seconds``; returns steps/s."""
    steps, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        steps += step()
    return steps / elapsed


def measure_jaxrunner(
    config: BenchConfig,
    num_envs: int,
    costs: dict[str, float] | None = None,
    layout: dict[str, Any] | None = None,
) -> float:
    """Steps/s of ``EnvRunner.sample()`` with the benchmark MLP. Given ``costs``, also
    fills it with the loop's perf timers over the timed samples, in microseconds per
    vector step (``env_wait_us``, ``inference_us``, ...). Given ``layout``, fills in
    ``num_workers`` (worker processes; 0 when the sub-envs step in this process) and
    ``num_groups`` (pipelining groups; None where the runner does not say)."""
    envs = make_vec(config.env, num_envs, backend=config.backend)
    policy = mlp_policy(envs.single_action_space)
    params = policy.init(jax.random.key(config.seed), envs.single_observation_space)
    with EnvRunner(envs, policy, params, config.rollout_length, config.seed) as runner:
        if layout is not None:
            layout["num_workers"] = getattr(envs, "num_workers", 0)
            layout["num_groups"] = runner.num_groups
        runner.sample()  # warm-up
        before = runner.get_metrics()
        steps_per_s = timed(lambda: runner.sample().reward.size, config.seconds)
        after = runner.get_metrics()
    if costs is not None:
        # The timers are running means (ms per vector step): take the warm-up out.
        n0, n1 = before["num_env_steps"] / num_envs, after["num_env_steps"] / num_envs
        for key in PERF_KEYS:
            total_ms = after["perf"][key] * n1 - before["perf"][key] * n0
            costs[key.replace("_ms", "_us")] = 1000.0 * total_ms / (n1 - n0)
    return steps_per_s


def hand_act(policy: Policy, num_envs: int) -> Callable[[Any, Any, jax.Array], Any]:
    """The jitted policy step a user would write: one key split per step, no per-env
    keys; ``(params, obs, key) -> (action, extras, key)``."""

    @jax.jit
    def act(params: Any, obs: Any, key: jax.Array) -> tuple[Any, Any, jax.Array]:
        key, sub = jax.random.split(key)
        action, extras, _ = policy.apply_fn(params, obs, None, jax.random.split(sub, num_envs))
        return action, extras, key

    return act


def hand_loop(
    envs: Any, num_envs: int, rollout_length: int, seed: int, seeded_reset: bool = True
) -> Callable[[], int]:
    """The reference a sampler must beat: any gymnasium-style vector env driven by the
    benchmark MLP through :func:`hand_act`, actions and extras converted to numpy,
    collecting nothing. Returns ``rollout() -> env steps done``. ``seeded_reset=False``
    for envs seeded when built (EnvPool ignores ``reset(seed=...)``)."""
    obs_space = getattr(envs, "single_observation_space", None) or envs.observation_space
    policy = mlp_policy(envs.single_action_space)
    params = policy.init(jax.random.key(seed), obs_space)
    act = hand_act(policy, num_envs)
    obs, _ = envs.reset(seed=seed) if seeded_reset else envs.reset()
    key = jax.random.key(seed)

    def rollout() -> int:
        nonlocal obs, key
        for _ in range(rollout_length):
            action, extras, key = act(params, obs, key)
            action, extras = np.asarray(action), jax.tree.map(np.asarray, extras)
            obs, *_ = envs.step(action)  # rewards, flags and infos as a user would get them
        return rollout_length * num_envs

    return rollout


def _action_pool(space: gymnasium.Space, seed: int, size: int = 97) -> list[Any]:
    """Random actions drawn ahead of time, so drawing them costs nothing while timed."""
    space.seed(seed)
    return [space.sample() for _ in range(size)]


def measure_raw(config: BenchConfig, num_envs: int) -> float:
    """Steps/s of the same vector env stepped with random actions (``envs.step``),
    no policy: what the envs cost, stacking of observations included."""
    envs = make_vec(config.env, num_envs, backend=config.backend, seed=config.seed)
    try:
        pool = _action_pool(envs.action_space, config.seed)
        cursor = 0

        def step() -> int:
            nonlocal cursor
            envs.step(pool[cursor])
            cursor = (cursor + 1) % len(pool)
            return num_envs

        step()  # warm-up
        return timed(lambda: sum(step() for _ in range(config.rollout_length)), config.seconds)
    finally:
        envs.close()


def measure_bare_loop(config: BenchConfig, num_envs: int) -> float:
    """Steps/s of the same sub-envs in a bare Python loop: ``env.step`` with random
    actions and ``env.reset`` at episode ends, nothing else (no stacking at all)."""
    envs = make_vec(config.env, num_envs, backend="sync", seed=config.seed)
    try:
        subs = envs.get_sub_environments()
        pool = _action_pool(envs.single_action_space, config.seed)
        cursor = 0

        def step_all() -> int:
            nonlocal cursor
            for env in subs:
                _, _, terminated, truncated, _ = env.step(pool[cursor])
                cursor = (cursor + 1) % len(pool)
                if terminated or truncated:
                    env.reset()
            return num_envs

        step_all()  # warm-up
        return timed(lambda: sum(step_all() for _ in range(config.rollout_length)), config.seconds)
    finally:
        envs.close()


SYSTEMS: dict[str, Callable[[BenchConfig, int], float]] = {
    "jaxrunner": measure_jaxrunner,
    "raw": measure_raw,
    "bare_loop": measure_bare_loop,
}


def run(config: BenchConfig, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Measures every system at each width, side by side in one process."""
    rows = []
    for num_envs in config.widths:
        row: dict[str, Any] = {"num_envs": num_envs}
        for name, measure in SYSTEMS.items():
            if progress:
                progress(f"{name} x{num_envs}")
            if measure is measure_jaxrunner:
                row[f"{name}_steps_per_s"] = measure_jaxrunner(config, num_envs, layout=row)
            else:
                row[f"{name}_steps_per_s"] = measure(config, num_envs)
        row["ratio_vs_raw"] = row["jaxrunner_steps_per_s"] / row["raw_steps_per_s"]
        row["ratio_vs_bare_loop"] = row["jaxrunner_steps_per_s"] / row["bare_loop_steps_per_s"]
        rows.append(row)
    return rows


def machine_info() -> dict[str, Any]:
    """What a benchmark figure depends on: hardware and library versions."""
    import flax
    import gymnasium
    import jaxlib

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "flax": flax.__version__,
        "gymnasium": gymnasium.__version__,
        "numpy": np.__version__,
        "jax_devices": [str(d) for d in jax.devices()],
        "jax_cpu_dispatch": "inline" if inline_cpu_dispatch() else "async",
    }


def autogroup() -> str | None:
    """This session's scheduling group and its nice (Linux autogroup), which decide
    its share of the CPUs on a machine shared with other sessions."""
    try:
        return pathlib.Path("/proc/self/autogroup").read_text().strip()
    except OSError:
        return None


def add_cpu_dispatch_option(parser: argparse.ArgumentParser) -> None:
    """``--cpu-dispatch {inline,async}`` (default inline): how JAX runs CPU
    computations while the benchmark runs (:func:`jaxrunner.use_inline_cpu_dispatch`)."""
    parser.add_argument(
        "--cpu-dispatch",
        choices=("inline", "async"),
        default="inline",
        help="how JAX runs CPU computations: inline in the calling thread "
        "(jaxrunner.use_inline_cpu_dispatch) or JAX's default asynchronous dispatch "
        "(default: %(default)s)",
    )


def parse_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """A benchmark's command line: adds ``--cpu-dispatch``, parses, and switches JAX
    to inline CPU dispatch unless told otherwise (before any JAX computation)."""
    add_cpu_dispatch_option(parser)
    args = parser.parse_args()
    if args.cpu_dispatch == "inline":
        use_inline_cpu_dispatch()
    else:
        use_async_cpu_dispatch()
    return args


def write_report(
    benchmark: str,
    args: argparse.Namespace,
    results: list[dict[str, Any]],
    machine: dict[str, Any] | None = None,
) -> None:
    """Prints a benchmark's JSON report (its name, date, command line, options,
    ``machine`` or :func:`machine_info`, results) and writes it to ``args.out`` if set."""
    report = {
        "benchmark": benchmark,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "config": {**vars(args), "out": str(args.out)},
        "machine": machine_info() if machine is None else machine,
        "results": results,
    }
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a text table; ``workers`` and ``groups`` are the runner's layout
    (``-`` where unknown)."""
    header = ("num_envs", "jaxrunner", "raw", "ratio", "bare loop", "ratio", "workers", "groups")
    lines = ["{:>8}  {:>11}  {:>11}  {:>5}  {:>11}  {:>5}  {:>7}  {:>6}".format(*header)]
    for row in rows:
        workers, groups = (
            "-" if row.get(key) is None else str(row[key]) for key in ("num_workers", "num_groups")
        )
        lines.append(
            f"{row['num_envs']:>8}  {row['jaxrunner_steps_per_s']:>11,.0f}  "
            f"{row['raw_steps_per_s']:>11,.0f}  {row['ratio_vs_raw']:>5.2f}  "
            f"{row['bare_loop_steps_per_s']:>11,.0f}  {row['ratio_vs_bare_loop']:>5.2f}  "
            f"{workers:>7}  {groups:>6}"
        )
    return "\n".join(lines)
