"""How fast is a policy in batch-invariant chunks of each size?

One jitted call of a ``jr.models`` policy on ``--rows`` random observations: plain (one
batch, no chunks) and through ``chunked_apply`` in chunks of each ``--chunks`` size, as
the samplers compute it (``jaxrunner._src.samplers.batch_invariance``; a chunk of all
``--rows`` is the one call behind optimization barriers of an accelerator's default). Median
milliseconds per call over ``--blocks`` timed blocks, in one process. What
``default_chunk_rows`` trades: a bigger chunk computes faster, a block smaller than a
chunk is padded to it.

Usage::

    python benchmarks/chunk_sizes.py --policy nature_cnn --rows 32 --chunks 4 8 16 32
    taskset -c 0 python benchmarks/chunk_sizes.py --policy gaussian_mlp --rows 32
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time
from typing import Any

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
from script_report import parse_args, write_report

from jaxrunner._src.samplers.batch_invariance import chunked_apply, policy_flops_per_row
from jaxrunner.models import gaussian_mlp_policy, mlp_policy, nature_cnn_policy

SPACES = {
    "nature_cnn": (
        gymnasium.spaces.Box(0, 255, (4, 84, 84), np.uint8),
        gymnasium.spaces.Discrete(6),
    ),
    "gaussian_mlp": (  # HalfCheetah's
        gymnasium.spaces.Box(-np.inf, np.inf, (17,), np.float64),
        gymnasium.spaces.Box(-1.0, 1.0, (6,), np.float32),
    ),
    "mlp": (  # CartPole's
        gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32),
        gymnasium.spaces.Discrete(2),
    ),
}


def make_policy(name: str) -> Any:
    obs_space, action_space = SPACES[name]
    if name == "nature_cnn":
        return nature_cnn_policy(obs_space, action_space)
    return (gaussian_mlp_policy if name == "gaussian_mlp" else mlp_policy)(action_space)


def ms_per_call(call: Any, args: tuple, blocks: int, calls: int) -> float:
    jax.block_until_ready(call(*args))  # compiles
    times = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(calls):
            jax.block_until_ready(call(*args))
        times.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", choices=tuple(SPACES), default="nature_cnn")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--chunks", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--blocks", type=int, default=9)
    parser.add_argument("--calls", type=int, default=20, help="calls per timed block")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parse_args(parser)
    obs_space, _ = SPACES[args.policy]
    policy = make_policy(args.policy)
    params = policy.init(jax.random.key(0), obs_space)
    rng = np.random.default_rng(0)
    obs = np.stack([obs_space.sample() for _ in range(args.rows)])
    if obs.dtype == np.float64:  # the envs' float observations, not Box's infinities
        obs = rng.normal(size=obs.shape)
    keys = jax.random.split(jax.random.key(0), args.rows)
    inputs = (params, obs, policy.batched_carry(args.rows), keys)
    result = {
        "policy": args.policy,
        "rows": args.rows,
        "flops_per_row": policy_flops_per_row(policy, params, obs_space),
        "plain_ms": ms_per_call(jax.jit(policy.apply_fn), inputs, args.blocks, args.calls),
        "chunked_ms": {},
    }
    for size in args.chunks:
        if args.rows % size:  # chunked_apply takes whole chunks
            raise SystemExit(f"--chunks {size}: --rows {args.rows} is not a multiple of it")
        call = jax.jit(chunked_apply(policy.apply_fn, size, args.rows))
        chunked = ms_per_call(call, (*inputs, jnp.int32(args.rows)), args.blocks, args.calls)
        result["chunked_ms"][str(size)] = chunked
    print(
        f"{args.policy}, {args.rows} rows: plain {result['plain_ms']:.2f} ms; chunks "
        + ", ".join(f"{k}: {v:.2f}" for k, v in result["chunked_ms"].items())
    )
    write_report("chunk_sizes", args, [result])


if __name__ == "__main__":
    main()
