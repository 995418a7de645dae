"""Batch-invariant policy calls: the policy run in fixed chunks of rows, so a row's result
never depends on its batch. See docs/concepts.md and docs/design.md."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from gymnasium import spaces

import jaxrunner._src.samplers.keys as keys
from jaxrunner._src import space_arrays
from jaxrunner._src.core.policy import Carry, Params, Policy
from jaxrunner._src.samplers.kept_programs import avals, kept_for
from jaxrunner.errors import InvalidArgumentError

MIN_CHUNK_ROWS = 8
"""The smallest default chunk on a CPU host (fewer rows when there are fewer envs)."""
CHUNK_FLOPS = 2**21
"""Target work of one chunk on a CPU host: a cheap policy takes more rows per chunk."""
MAX_CHUNK_ROWS = 256
"""The largest default chunk on a CPU host."""
ONE_CALL_ROWS = 512
"""Up to this many rows, an accelerator's default chunk is every row (one call, no loop);
above, the largest power of two up to half of them (a chunk's compute then outweighs a
loop trip's read-back, and a small ready-first call pads to that, not to every row)."""


def _pow2_floor(x: float) -> int:
    """The largest power of two ``<= max(x, 1)``."""
    return 1 << (max(int(x), 1).bit_length() - 1)


def compute_platform() -> str:
    """The platform new arrays and calls go to: the default device's (``jax.default_device``,
    e.g. the CPU on a GPU machine) where one is set, else JAX's default backend."""
    device = jax.config.jax_default_device  # type: ignore[attr-defined]
    return jax.default_backend() if device is None else getattr(device, "platform", device)


def default_chunk_rows(
    num_rows: int,
    flops_per_row: float | None = None,
    platform: str | None = None,
    *,
    small_calls: bool = False,
) -> int:
    """Rows per policy chunk for ``num_rows`` envs of a policy costing ``flops_per_row``
    (None: unknown, taken as costly) on ``platform`` (default: :func:`compute_platform`).
    A function of these only, never of the backend or grouping: every mode of a runner
    computes the same chunks (the determinism guarantee). Why these sizes on CPU:
    docs/performance.md."""
    platform = platform or compute_platform()
    if platform != "cpu":  # one call: a loop's trip costs a device->host sync there
        return num_rows if num_rows <= ONE_CALL_ROWS else _pow2_floor(num_rows // 2)
    by_work = 0 if not flops_per_row or flops_per_row <= 0 else CHUNK_FLOPS / flops_per_row
    half = _pow2_floor(num_rows // 2)
    rows = min(MAX_CHUNK_ROWS, half)
    if by_work >= MIN_CHUNK_ROWS or small_calls:  # about CHUNK_FLOPS of work a chunk
        rows = min(rows, _pow2_floor(by_work))
    return min(_pow2_floor(num_rows), max(MIN_CHUNK_ROWS, rows))


def policy_flops_per_row(policy: Policy, params: Params, obs_space: spaces.Space) -> float | None:
    """XLA's estimate of ``policy``'s flops per row of ``obs_space`` (what the policy
    sees), from its HLO for one row (nothing runs); None where there is none or the
    policy does not trace on a dummy row."""
    one_row = jax.tree.map(jnp.asarray, space_arrays.allocate(obs_space, (1,)))
    args = (params, one_row, policy.batched_carry(1), jax.random.split(keys.key(0), 1))

    def estimate() -> float | None:
        try:
            # Lowered for the CPU on any platform: a GPU's lowering has no cost analysis
            # (nor has JAX 0.11's lowering_platforms=("cpu",) there), and the work per
            # row is the policy's, not the device's.
            shapes = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), args
            )
            with jax.default_device(jax.devices("cpu")[0]):
                lowered = jax.jit(policy.apply_fn).lower(*shapes)
            flops = (lowered.cost_analysis() or {}).get("flops")
        except Exception:  # an estimate only: the runner's own compile reports real errors
            flops = None
        return float(flops) if flops else None

    # Kept per policy and argument shapes: a runner rebuilt with it does not lower it again.
    return kept_for(policy, None, ("flops", avals(args)), estimate)


def policy_chunk_rows(
    policy: Policy,
    params: Params,
    obs_space: spaces.Space,
    num_rows: int,
    *,
    small_calls: bool = False,
) -> int:
    """:func:`default_chunk_rows` for ``num_rows`` envs of ``policy`` (observations of
    ``obs_space`` as the policy sees them): what every sampler of a runner uses."""
    flops = policy_flops_per_row(policy, params, obs_space)
    return default_chunk_rows(num_rows, flops, small_calls=small_calls)


R = TypeVar("R")


def is_one_call(chunk_rows: int, max_rows: int) -> bool:
    """Whether every call is one chunk computed with no loop: on an accelerator, where one
    chunk holds the ``max_rows`` of the largest call (a CPU host keeps the loop: XLA CPU
    removes the optimization barriers that would isolate the chunk)."""
    return chunk_rows >= max_rows and compute_platform() != "cpu"


def padded_rows(size: int, chunk_rows: int, max_rows: int) -> int:
    """The rows a call of ``size`` rows computes, for a policy chunk of ``chunk_rows`` where
    no call holds more than ``max_rows``: one chunk where :func:`is_one_call` (every call
    is then the same program), else whole chunks, at least two (with one, XLA drops the
    loop's dynamic slice and fuses the chunk differently, 1 ulp apart)."""
    if is_one_call(chunk_rows, max_rows):
        return chunk_rows
    return max(2, -(-size // chunk_rows)) * chunk_rows


def chunked_apply(
    apply_fn: Callable[[Params, Any, Carry, Any], R], chunk_rows: int, max_rows: int
) -> Callable[..., R]:
    """``apply_fn`` (row-wise, ``(params, obs, carry, keys)``, or the like, e.g. a
    ``log_prob_fn``) computed ``chunk_rows`` rows at a time in a ``lax.while_loop``, so a
    row's result is the same bits whatever the call's size (docs/design.md).

    Returns ``apply(params, obs, carry, keys, num_rows)`` (traceable) for ``N`` rows, a
    multiple of ``chunk_rows`` padded on the host, computing the chunks that hold the
    first ``num_rows`` (traced, not a constant XLA could inline; the later chunks'
    outputs are zeros). Raises InvalidArgumentError while tracing for a bad ``N`` or an
    output leaf without one row per input row.

    Where :func:`is_one_call` (``max_rows``: the rows of the largest call), every call is
    one chunk: ``apply_fn`` itself between optimization barriers, so that XLA compiles
    its rows the same way whatever the program around it (a loop's trip would read its
    condition back to the host)."""
    one_call = is_one_call(chunk_rows, max_rows)

    def check_rows(keys: Any) -> int:
        rows = jax.tree.leaves(keys)[0].shape[0]
        if rows % chunk_rows or (one_call and rows != chunk_rows):
            expected = "exactly" if one_call else "a multiple of"
            raise InvalidArgumentError(
                f"chunked_apply: {rows} rows, expected {expected} chunk_rows={chunk_rows}. "
                "Pad the rows on the host (padding XLA can see through, a broadcast or a "
                "constant gather, changes how it compiles the chunk)."
            )
        return rows

    if one_call:

        def whole(params: Params, obs: Any, carry: Carry, keys: Any, num_rows: Any) -> R:
            del num_rows  # every row is computed: the call is one chunk
            check_rows(keys)
            inputs = jax.lax.optimization_barrier((params, obs, carry, keys))
            outputs = apply_fn(*inputs)
            check_output_rows(outputs, chunk_rows)
            return jax.lax.optimization_barrier(outputs)

        return whole

    def apply(params: Params, obs: Any, carry: Carry, keys: Any, num_rows: jax.Array) -> R:
        rows = check_rows(keys)
        inputs = (obs, carry, keys)

        def traced_chunk(start: jax.Array) -> Any:
            chunk = lambda x: jax.lax.dynamic_slice_in_dim(x, start, chunk_rows)  # noqa: E731
            return apply_fn(params, *jax.tree.map(chunk, inputs))

        # The policy is traced once (a runner counts its traces); the loop replays it.
        converted, consts = jax.closure_convert(traced_chunk, jnp.int32(0))

        def one_chunk(start: jax.Array) -> Any:
            return converted(start, *consts)

        spec = jax.eval_shape(one_chunk, jnp.int32(0))
        check_output_rows(spec, chunk_rows)
        outputs = jax.tree.map(lambda s: jnp.zeros((rows, *s.shape[1:]), s.dtype), spec)
        num_chunks = (jnp.asarray(num_rows, jnp.int32) + chunk_rows - 1) // chunk_rows

        def body(state: tuple[jax.Array, Any]) -> tuple[jax.Array, Any]:
            i, outputs = state
            start = i * chunk_rows
            out = one_chunk(start)
            put = lambda buf, o: jax.lax.dynamic_update_slice_in_dim(buf, o, start, 0)  # noqa: E731
            return i + 1, jax.tree.map(put, outputs, out)

        _, outputs = jax.lax.while_loop(
            lambda state: state[0] < num_chunks, body, (jnp.int32(0), outputs)
        )
        return outputs

    return apply


def check_output_rows(outputs: Any, chunk_rows: int) -> None:
    """Refuses a policy output leaf without one row per observation of a chunk."""
    for leaf in jax.tree.leaves(outputs):
        if leaf.ndim == 0 or leaf.shape[0] != chunk_rows:
            raise InvalidArgumentError(
                f"policy apply_fn: every output leaf must have one row per observation "
                f"([{chunk_rows}, ...] for {chunk_rows} rows), got shape "
                f"{tuple(leaf.shape)}. Return per-row actions, extras and carries (no "
                "batch statistics, no scalars)."
            )
