"""The EnvPool backend's two modes against EnvPool by hand: its default (EnvPool's reset
steps kept as ``valid=False`` slots) and ``keep_reset_steps=False`` (``same_step``).

Per width, three systems on CartPole-v1 with the 64-64 MLP of ``jr.models`` (or another
workload of ``jaxrunner bench``'s, ``--workload pong``: EnvPool's Pong-v5 and a NatureCNN), in one
process, timed in interleaved rounds (the order alternates each round): jaxrunner's
EnvPool backend at its default (EnvPool's own NEXT_STEP autoreset, its reset steps
recorded as invalid slots), the same with ``keep_reset_steps=False`` (a second call into
EnvPool for the reset steps after each step that ended an episode, the default before
2026-11-29), and the recording hand loop over
EnvPool (``jaxrunner bench``'s: sync mode stepped by hand; or CleanRL's async loop, in
``peer_loops.py``, with ``--async-mode``). Steps/s count real transitions only (the runner's
``num_env_steps``; the hand loops leave EnvPool's reset steps out). Reports the median
of each system over the rounds and the ratios of those medians, with the load average.

Usage (needs the ``envpool`` extra)::

    python benchmarks/envpool_reset_steps.py --num-envs 8 64 256 --rounds 15
    python benchmarks/envpool_reset_steps.py --async-mode --out /tmp/envpool_async.json
    python benchmarks/envpool_reset_steps.py --workload pong --async-mode --num-envs 8 \
        --rollout-length 32 --reps 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import jax
from peer_loops import EnvPoolAsyncLoop

import jaxrunner as jr
from jaxrunner._src.bench import machine_info
from jaxrunner._src.bench.hand_loop import RecordingHandLoop
from jaxrunner._src.bench.workloads import WORKLOADS, Workload

SEED = 0


def _runner(
    work: Workload, num_envs: int, length: int, keep: bool, async_mode: bool
) -> Callable[[], int]:
    batch = {"batch_size": num_envs // 2} if async_mode else {}
    envs = jr.make_vec(
        work.envpool_id, num_envs, backend="envpool", keep_reset_steps=keep,
        **batch, **work.envpool_kwargs,
    )  # fmt: skip
    policy = work.policy(envs.single_observation_space, envs.single_action_space)
    params = policy.init(jax.random.key(SEED), envs.single_observation_space)
    runner = jr.EnvRunner(envs, policy, params, rollout_length=length, seed=SEED)

    def sample() -> int:  # real transitions of one sample
        before = runner.get_metrics()["num_env_steps"]
        runner.sample()
        return runner.get_metrics()["num_env_steps"] - before

    return sample


def _hand(work: Workload, num_envs: int, length: int, async_mode: bool) -> Callable[[], int]:
    import envpool  # type: ignore[import-not-found]  # the optional extra

    if async_mode:  # recvs of num_envs // 2 envs: twice the rounds for as many steps
        loop = EnvPoolAsyncLoop(
            work.envpool_id, work.envpool_kwargs, num_envs, 2 * length, SEED, work.policy
        )
        return loop.rollout
    envs = envpool.make_gymnasium(
        work.envpool_id, num_envs=num_envs, batch_size=num_envs, seed=SEED, **work.envpool_kwargs
    )
    obs_space, action_space = envs.observation_space, envs.action_space
    return RecordingHandLoop(
        envs, length, SEED, seeded_reset=False, next_step_reset=True,
        policy=work.policy(obs_space, action_space),
    ).rollout  # fmt: skip


def measure(
    work: Workload, num_envs: int, length: int, rounds: int, async_mode: bool, reps: int | None
) -> dict:
    systems = {
        "default": _runner(work, num_envs, length, True, async_mode),
        "same_step": _runner(work, num_envs, length, False, async_mode),
        "hand": _hand(work, num_envs, length, async_mode),
    }
    for run in systems.values():  # compile and warm up
        run()
        run()
    if reps is None:  # CartPole rounds of about 0.2 s: one preemption weighs less
        reps = max(1, 512 // num_envs)
    rates: dict[str, list[float]] = {name: [] for name in systems}
    for k in range(rounds):
        for name in list(systems) if k % 2 == 0 else list(reversed(systems)):
            start = time.perf_counter()
            steps = sum(systems[name]() for _ in range(reps))
            rates[name].append(steps / (time.perf_counter() - start))
    med = {name: statistics.median(r) for name, r in rates.items()}
    return {
        "num_envs": num_envs,
        "median_steps_per_s": med,
        "ratios": {
            "default/hand": med["default"] / med["hand"],
            "same_step/hand": med["same_step"] / med["hand"],
            "default/same_step": med["default"] / med["same_step"],
        },
        "reps_per_round": reps,
        "load_average": os.getloadavg(),
        "rounds": rates,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--num-envs", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--rollout-length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--async-mode", action="store_true", help="batch_size = num_envs // 2")
    parser.add_argument("--workload", choices=["cartpole", "pong"], default="cartpole")
    parser.add_argument("--reps", type=int, default=None, help="samples per system per round")
    parser.add_argument("--out", help="write the results here as JSON")
    args = parser.parse_args()
    results = []
    for n in args.num_envs:
        work = WORKLOADS[args.workload]
        row = measure(work, n, args.rollout_length, args.rounds, args.async_mode, args.reps)
        results.append(row)
        med, ratio = row["median_steps_per_s"], row["ratios"]
        print(
            f"{n} envs: " + ", ".join(f"{k} {v:,.0f}" for k, v in med.items()) + " steps/s | "
            + ", ".join(f"{k} {v:.2f}" for k, v in ratio.items())
            + f" | load {row['load_average'][0]:.2f}",
            flush=True,
        )  # fmt: skip
    if args.out:
        import envpool  # type: ignore[import-not-found]  # the benchmark's own venv

        machine = machine_info() | {"envpool": envpool.__version__}
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "machine": machine, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
