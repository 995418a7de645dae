"""The runner's random keys: JAX's threefry2x32 written out so XLA's CPU backend fuses it.
See docs/design.md."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.random import define_prng_impl

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def _rotate_left(x: jax.Array, bits: int) -> jax.Array:
    return lax.shift_left(x, np.uint32(bits)) | lax.shift_right_logical(x, np.uint32(32 - bits))


# Traced once per shape (inline=True: the same program as the ops written in place); a
# runner traces several policy steps, and the 20 rounds cost more to trace than to run.
@functools.partial(jax.jit, inline=True)
def threefry2x32(
    key1: jax.Array, key2: jax.Array, count1: jax.Array, count2: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32 with 20 rounds (Salmon et al. 2011; JAX's ``threefry2x32_p``):
    hashes the counter pairs ``(count1, count2)`` (uint32, broadcast together) under
    the key ``(key1, key2)``."""
    ks = (key1, key2, key1 ^ key2 ^ _PARITY)
    x0, x1 = count1 + ks[0], count2 + ks[1]
    for block in range(5):
        for bits in _ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = _rotate_left(x1, bits) ^ x0
        x0 = x0 + ks[(block + 1) % 3]
        x1 = x1 + ks[(block + 2) % 3] + np.uint32(block + 1)
    return x0, x1


def _hash_counters(key: jax.Array, shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """The hash of the 64-bit counters ``0..prod(shape)-1`` (as (high, low) uint32
    words) under ``key``: how JAX's partitionable threefry numbers its draws."""
    if int(np.prod(shape)) >= 2**32:
        raise NotImplementedError(f"jaxrunner keys draw fewer than 2**32 values, not {shape}.")
    low = lax.iota(np.uint32, int(np.prod(shape))).reshape(shape)
    return threefry2x32(key[0], key[1], jnp.zeros(shape, np.uint32), low)


def _seed(seed: jax.Array) -> jax.Array:
    # Seeding runs once per runner: JAX's own threefry seeding, whatever the default impl.
    return jax.random.key_data(jax.random.key(seed, impl="threefry2x32"))


def _split(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    return jnp.stack(_hash_counters(key, shape), axis=len(shape))


def _fold_in(key: jax.Array, data: int | jax.Array) -> jax.Array:
    # threefry2x32 takes any array-like; its annotation says jax.Array.
    y0, y1 = threefry2x32(key[0], key[1], np.uint32(0), jnp.asarray(data, np.uint32))  # type: ignore[arg-type]
    return jnp.stack([y0, y1])


def _random_bits(key: jax.Array, bit_width: int, shape: tuple[int, ...]) -> jax.Array:
    if bit_width not in (8, 16, 32, 64):
        raise TypeError(f"random bits of width {bit_width}: expected 8, 16, 32 or 64.")
    bits1, bits2 = _hash_counters(key, shape)
    if bit_width == 64:
        return lax.shift_left(bits1.astype(np.uint64), np.uint64(32)) | bits2.astype(np.uint64)
    bits = bits1 ^ bits2
    return bits if bit_width == 32 else bits.astype(np.dtype(f"uint{bit_width}"))


IMPL = define_prng_impl(
    key_shape=(2,),
    seed=_seed,
    split=_split,
    random_bits=_random_bits,
    fold_in=_fold_in,
    name="jaxrunner_threefry2x32",
    tag="jrfry",
)
"""JAX's threefry2x32 key implementation, written out so XLA's CPU
backend fuses it; draws what JAX's default threefry key with the same data draws."""


def key(seed: int) -> jax.Array:
    """The root of a runner's keys, of :data:`IMPL`: ``jax.random.key(seed)``'s words as
    JAX makes them from a 64-bit seed, ``(seed >> 32, seed & 0xFFFFFFFF)``, with or
    without ``jax_enable_x64`` (without, JAX would keep the low 32 bits only)."""
    seed = int(seed)
    return wrap(jnp.asarray([seed >> 32, seed & 0xFFFFFFFF], np.uint32))


def wrap(data: jax.Array) -> jax.Array:
    """Typed keys of :data:`IMPL` from their raw data (``[..., 2]`` uint32), which is
    how samplers keep keys in their state (``jax.random.key_data``)."""
    return jax.random.wrap_key_data(data, impl=IMPL)
