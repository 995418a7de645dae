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

With ``--bound``, also the machine's limit: the process CPU each system used (cores, and
CPU-us a step), and, timed apart, EnvPool stepping alone (random actions, the same
batches) and the policy alone (the hand loop's jitted step on one batch of zeros). Every
core busy with those two costs and nothing else gives ``bound_steps_per_s =
cpu_count / (env + policy CPU-us a step)``; each system's share of it says how much a
better overlap of the policy with EnvPool's threads could still gain.

Usage (needs the ``envpool`` extra)::

    python benchmarks/envpool_reset_steps.py --num-envs 8 64 256 --rounds 15
    python benchmarks/envpool_reset_steps.py --async-mode --out /tmp/envpool_async.json
    python benchmarks/envpool_reset_steps.py --workload pong --async-mode --num-envs 8 \
        --rollout-length 32 --reps 1
    python benchmarks/envpool_reset_steps.py --workload pong --async-mode --num-envs 32 \
        --rollout-length 32 --reps 2 --rounds 5 --bound
    python benchmarks/envpool_reset_steps.py --num-threads 1  # EnvPool's threads: one
    python benchmarks/envpool_reset_steps.py --workload pong --async-mode --per-recv \
        --num-envs 8 32 --rollout-length 32 --reps 2 --rounds 5

``--per-recv`` adds the runner with ``chunk_rows`` the recv batch: each half acts as it
comes (the default gathers both halves into one chunk of every env, where a chunk is
every env: an accelerator's, or a CNN's at 8 envs on a CPU host).

``--lean`` (async mode) adds the bound of a leaner recording: the hand loop's shape, but
acting through jaxrunner's own compiled policy step (per-env keys, actor state) and doing
the least a runner must per ``recv``: EnvPool's reset steps flagged, the env ids checked
against those in flight, the actions' range checked, every ``recv`` staged in arrival
order and put into ``[T, B]`` with one reorder per sample. ``lean/hand`` is what that
recording costs against the hand loop's; ``default/lean`` what the runner's own
structure costs beyond it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable

import jax
import numpy as np
from peer_loops import EnvPoolAsyncLoop

import jaxrunner as jr
from jaxrunner._src.bench import machine_info
from jaxrunner._src.bench.hand_loop import RecordingHandLoop, hand_act, single_spaces
from jaxrunner._src.bench.workloads import WORKLOADS, Workload

SEED = 0


def _runner(
    work: Workload,
    num_envs: int,
    length: int,
    keep: bool,
    async_mode: bool,
    chunk_rows: int | None = None,
) -> Callable[[], int]:
    batch = {"batch_size": num_envs // 2} if async_mode else {}
    envs = jr.make_vec(
        work.envpool_id, num_envs, backend="envpool", keep_reset_steps=keep,
        **batch, **work.envpool_kwargs,
    )  # fmt: skip
    policy = work.policy(envs.single_observation_space, envs.single_action_space)
    params = policy.init(jax.random.key(SEED), envs.single_observation_space)
    runner = jr.EnvRunner(
        envs, policy, params, rollout_length=length, seed=SEED, chunk_rows=chunk_rows
    )

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


class _LeanLoop:
    """The ``--lean`` bound (async mode): see the module's docstring. Its rollout is
    ``2 * length`` recvs of half the envs, the reorder included; returns real transitions.
    Each env's answers of a rollout fill its first ``counts[env]`` slots of ``traj`` (a
    cost bound: it holds no env back, so an env may answer fewer or more than ``length``
    times, where the runner holds it to ``length``)."""

    def __init__(self, work: Workload, num_envs: int, length: int) -> None:
        import envpool  # type: ignore[import-not-found]  # the optional extra

        from jaxrunner._src.backends.envpool_calls import EnvPoolCalls
        from jaxrunner._src.core.seeds import env_seeds
        from jaxrunner._src.samplers.policy_step import CompiledPolicyStep, host_actor_state
        from jaxrunner._src.space_arrays.actions import passing_batch_test

        self.batch, self.num_envs, self.length = num_envs // 2, num_envs, length
        self.pool = envpool.make_gymnasium(
            work.envpool_id, num_envs=num_envs, batch_size=self.batch,
            env_seed=env_seeds(SEED, num_envs),  # as a runner of seed SEED resets its envs
            **work.envpool_kwargs,
        )  # fmt: skip
        obs_space, action_space = single_spaces(self.pool)
        policy = work.policy(obs_space, action_space)
        self.params = policy.init(jax.random.key(SEED), obs_space)
        self.state, _ = host_actor_state(policy, SEED, num_envs, None, obs_space)
        example = np.zeros((self.batch, *obs_space.shape), obs_space.dtype)
        self.call = CompiledPolicyStep(
            policy, self.params, self.state, self.batch, example, chunk_rows=self.batch
        )
        self.stage = self.call.new_stage()
        self.calls, self.passes = (
            EnvPoolCalls(self.pool),
            passing_batch_test(action_space, (self.batch,)),
        )
        rounds, shape = 2 * length, (2 * length, self.batch)
        self.obs = np.zeros((*shape, *obs_space.shape), obs_space.dtype)
        self.action = np.zeros((*shape, *action_space.shape), action_space.dtype)
        self.log_prob, self.reward = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        self.terminated, self.truncated = np.zeros(shape, np.bool_), np.zeros(shape, np.bool_)
        self.env_id, self.invalid = np.zeros(shape, np.int64), np.zeros(shape, np.bool_)
        self.traj = [np.zeros((length, num_envs, *x.shape[2:]), x.dtype) for x in self._staged()]
        self.ended, self.in_flight = np.zeros(num_envs, np.bool_), np.zeros(num_envs, np.bool_)
        self.rounds = rounds
        self.pool.async_reset()

    def _staged(self) -> list[np.ndarray]:
        return [self.obs, self.action, self.log_prob, self.reward, self.terminated,
                self.truncated, self.invalid]  # fmt: skip

    def rollout(self) -> int:
        calls, call, stage, params, n = self.calls, self.call, self.stage, self.params, self.batch
        state, ended, in_flight = self.state, self.ended, self.in_flight
        for r in range(self.rounds):
            step = calls.recv()
            ids = step.env_id
            reset = ended[ids]  # a reset's first obs: its carry restarts
            done = step.terminated | step.truncated  # a final obs: no transition from it
            ended[ids] = done
            in_flight[ids] = False
            stage.obs[:n], stage.episode_start[:n], stage.env_index[:n] = step.obs, reset, ids
            pending, state = call.dispatch(params, state, stage)
            action, _, extras, _ = call.collect(pending)
            action, log_prob = action[:n], extras[0][:n]
            if not self.passes(action) or in_flight[ids].any():
                raise RuntimeError("lean loop: an action out of range or an env in flight")
            in_flight[ids] = True
            calls.send(action, ids)
            self.obs[r], self.action[r], self.log_prob[r] = step.obs, action, log_prob
            self.reward[r], self.terminated[r] = step.reward, step.terminated
            self.truncated[r], self.env_id[r], self.invalid[r] = step.truncated, ids, done
        self.state = state
        # One reorder: each env's k-th answer of this rollout goes to its step k.
        flat = self.env_id.ravel()
        order = np.argsort(flat, kind="stable")
        counts = self.counts = np.bincount(flat, minlength=self.num_envs)
        t = np.empty_like(flat)
        t[order] = np.arange(len(flat)) - np.repeat(np.cumsum(counts) - counts, counts)
        kept = t < self.length
        at = (t[kept], flat[kept])
        for dst, src in zip(self.traj, self._staged()):
            dst[at] = src.reshape(len(flat), *src.shape[2:])[kept]
        return int(self.rounds * n - np.count_nonzero(self.invalid))


def measure(
    work: Workload,
    num_envs: int,
    length: int,
    rounds: int,
    async_mode: bool,
    reps: int | None,
    bound: bool = False,
    per_recv: bool = False,
    lean: bool = False,
) -> dict:
    systems = {
        "default": _runner(work, num_envs, length, True, async_mode),
        "same_step": _runner(work, num_envs, length, False, async_mode),
        "hand": _hand(work, num_envs, length, async_mode),
    }
    if per_recv:  # a chunk of one recv: each half acts as it comes, as the hand loop's
        systems["per_recv"] = _runner(work, num_envs, length, True, async_mode, num_envs // 2)
    if lean:
        systems["lean"] = _LeanLoop(work, num_envs, length).rollout
    for run in systems.values():  # compile and warm up
        run()
        run()
    if reps is None:  # CartPole rounds of about 0.2 s: one preemption weighs less
        reps = max(1, 512 // num_envs)
    rates: dict[str, list[float]] = {name: [] for name in systems}
    cpu: dict[str, list[tuple[float, float, int]]] = {name: [] for name in systems}
    for k in range(rounds):
        for name in list(systems) if k % 2 == 0 else list(reversed(systems)):
            # process_time: every thread's CPU, EnvPool's and XLA's included.
            cpu_start, start = time.process_time(), time.perf_counter()
            steps = sum(systems[name]() for _ in range(reps))
            wall = time.perf_counter() - start
            rates[name].append(steps / wall)
            cpu[name].append((time.process_time() - cpu_start, wall, steps))
    med = {name: statistics.median(r) for name, r in rates.items()}
    row = {
        "num_envs": num_envs,
        "median_steps_per_s": med,
        "ratios": {
            "default/hand": med["default"] / med["hand"],
            "same_step/hand": med["same_step"] / med["hand"],
            "default/same_step": med["default"] / med["same_step"],
            **({"per_recv/default": med["per_recv"] / med["default"]} if per_recv else {}),
            **(
                {
                    "lean/hand": med["lean"] / med["hand"],
                    "default/lean": med["default"] / med["lean"],
                }
                if lean
                else {}
            ),
        },
        "reps_per_round": reps,
        "load_average": os.getloadavg(),
        "rounds": rates,
    }
    if bound:
        row["cpu"] = {name: _cpu_use(c) for name, c in cpu.items()}
        row["bound"] = _bound(work, num_envs, async_mode)
        limit = row["bound"]["bound_steps_per_s"]
        row["share_of_bound"] = {name: m / limit for name, m in med.items()}
    return row


def _cpu_use(rounds: list[tuple[float, float, int]]) -> dict[str, float]:
    """Cores busy and CPU-us per step, medians over rounds of (cpu_s, wall_s, steps)."""
    return {
        "cores": statistics.median(c / w for c, w, _ in rounds),
        "cpu_us_per_step": statistics.median(1e6 * c / n for c, _, n in rounds),
    }


def _bound(work: Workload, num_envs: int, async_mode: bool, seconds: float = 5.0) -> dict:
    """EnvPool alone and the policy alone, each timed for ``seconds``: their CPU-us a
    step, and the steps/s of every core busy with exactly that work."""
    import envpool  # type: ignore[import-not-found]  # the optional extra

    batch = num_envs // 2 if async_mode else num_envs
    envs = envpool.make_gymnasium(
        work.envpool_id, num_envs=num_envs, batch_size=batch, seed=SEED, **work.envpool_kwargs
    )
    obs_space, action_space = single_spaces(envs)
    action_space.seed(SEED)
    actions = np.stack([action_space.sample() for _ in range(batch)])
    envs.async_reset()

    def env_step() -> int:
        _, _, _, _, info = envs.recv()
        envs.send(actions, info["env_id"])
        return batch

    policy = work.policy(obs_space, action_space)
    params = policy.init(jax.random.key(SEED), obs_space)
    act, obs = hand_act(policy, batch), np.zeros((batch, *obs_space.shape), obs_space.dtype)
    key = jax.random.key(SEED)

    def policy_step() -> int:
        nonlocal key
        action, extras, key = act(params, obs, key)
        np.asarray(action), np.asarray(extras["log_prob"])
        return batch

    parts = {}
    for name, step in (("env", env_step), ("policy", policy_step)):
        for _ in range(10):  # warm up: resets, compile
            step()
        cpu_start, start, steps = time.process_time(), time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            steps += step()
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        parts[name] = {
            "steps_per_s": steps / wall,
            "cores": cpu / wall,
            "cpu_us_per_step": 1e6 * cpu / steps,
        }
    envs.close()
    cores = os.cpu_count() or 1
    per_step = parts["env"]["cpu_us_per_step"] + parts["policy"]["cpu_us_per_step"]
    return {"parts": parts, "cpu_count": cores, "bound_steps_per_s": 1e6 * cores / per_step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--num-envs", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--rollout-length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--async-mode", action="store_true", help="batch_size = num_envs // 2")
    parser.add_argument("--workload", choices=["cartpole", "pong"], default="cartpole")
    parser.add_argument("--reps", type=int, default=None, help="samples per system per round")
    parser.add_argument(
        "--bound", action="store_true", help="CPU use, and EnvPool and the policy timed apart"
    )
    parser.add_argument(
        "--num-threads",
        type=int,
        default=None,
        help="EnvPool's num_threads in every pool (default: EnvPool's own, one per core "
        "up to the batch size)",
    )
    parser.add_argument(
        "--per-recv",
        action="store_true",
        help="with --async-mode: also the runner with chunk_rows = the recv batch (each "
        "half acts as it comes; the default gathers both into one chunk of every env)",
    )
    parser.add_argument(
        "--lean",
        action="store_true",
        help="with --async-mode: also the bound of a leaner recording (the module's docstring)",
    )
    parser.add_argument("--out", help="write the results here as JSON")
    args = parser.parse_args()
    if (args.per_recv or args.lean) and not args.async_mode:
        parser.error("--per-recv and --lean need --async-mode (recvs of half the envs)")
    work = WORKLOADS[args.workload]
    if args.num_threads is not None:
        threads = {"num_threads": args.num_threads}
        work = dataclasses.replace(work, envpool_kwargs={**work.envpool_kwargs, **threads})
    results = []
    for n in args.num_envs:
        row = measure(
            work, n, args.rollout_length, args.rounds, args.async_mode, args.reps, args.bound,
            args.per_recv, args.lean,
        )  # fmt: skip
        results.append(row)
        med, ratio = row["median_steps_per_s"], row["ratios"]
        print(
            f"{n} envs: " + ", ".join(f"{k} {v:,.0f}" for k, v in med.items()) + " steps/s | "
            + ", ".join(f"{k} {v:.2f}" for k, v in ratio.items())
            + f" | load {row['load_average'][0]:.2f}",
            flush=True,
        )  # fmt: skip
        if args.bound:
            parts = row["bound"]["parts"]
            print(
                f"  bound {row['bound']['bound_steps_per_s']:,.0f} steps/s (env "
                f"{parts['env']['cpu_us_per_step']:.0f} + policy "
                f"{parts['policy']['cpu_us_per_step']:.0f} CPU-us a step); "
                + ", ".join(
                    f"{k} {v:.2f} of it on {row['cpu'][k]['cores']:.2f} cores"
                    for k, v in row["share_of_bound"].items()
                ),
                flush=True,
            )  # fmt: skip
    if args.out:
        import envpool  # type: ignore[import-not-found]  # the benchmark's own venv

        machine = machine_info() | {"envpool": envpool.__version__}
        with open(args.out, "w") as f:
            report = {"args": vars(args), "envpool_kwargs": work.envpool_kwargs}
            json.dump(report | {"machine": machine, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
