"""jaxrunner's keys draw exactly what JAX's threefry2x32 keys draw, through every
``jax.random`` function a policy or an env uses, and compile to straight-line code."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxrunner._src.samplers.keys as keys

SHAPES = [(), (1,), (3,), (4, 5), (2, 3, 4)]


@pytest.fixture(autouse=True)
def _partitionable_threefry():
    """JAX's threefry numbers its draws this way by default from jax 0.5 (the reference
    here); jaxrunner's keys always do."""
    old = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", True)
    yield
    jax.config.update("jax_threefry_partitionable", old)


def _pair(seed: int) -> tuple[jax.Array, jax.Array]:
    return jax.random.key(seed, impl="threefry2x32"), keys.key(seed)


def _same(a: jax.Array, b: jax.Array) -> None:
    if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
        a, b = jax.random.key_data(a), jax.random.key_data(b)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), data=st.integers(0, 2**32 - 1))
def test_seed_split_and_fold_in_match_threefry(seed: int, data: int) -> None:
    reference, ours = _pair(seed)
    _same(reference, ours)
    _same(jax.random.fold_in(reference, data), jax.random.fold_in(ours, data))
    for shape in SHAPES[1:]:
        _same(jax.random.split(reference, shape), jax.random.split(ours, shape))


def test_a_seed_keeps_all_64_bits_as_jax_seeds_a_64_bit_int():
    # JAX without jax_enable_x64 keeps only a seed's low 32 bits; a runner's seed reaches
    # 2**63 - 1, so its keys take the (high, low) words JAX makes of a 64-bit seed.
    for seed in (2**32 + 5, 2**40 + 7, 2**63 - 1):
        words = np.asarray(jax.random.key_data(keys.key(seed)))
        assert words.tolist() == [seed >> 32, seed & 0xFFFFFFFF]
    assert not np.array_equal(
        jax.random.normal(keys.key(2**32 + 5), (4,)), jax.random.normal(keys.key(5), (4,))
    )


@functools.partial(jax.jit, static_argnums=1)
def _draws(key: jax.Array, shape: tuple[int, ...]) -> list[jax.Array]:
    # One program per shape and key kind: a compile per draw costs seconds (each
    # jax.random function is compiled on its own when called eagerly).
    bits = [jax.random.bits(key, shape, dtype) for dtype in (jnp.uint8, jnp.uint16, jnp.uint32)]
    floats = [
        draw(key, shape) for draw in (jax.random.uniform, jax.random.normal, jax.random.gumbel)
    ]
    logits = jax.random.normal(key, (*shape, 6))
    return [
        *bits,
        *floats,
        jax.random.randint(key, shape, 0, 1000),
        logits,
        jax.random.categorical(key, logits),
    ]


@pytest.mark.parametrize("shape", SHAPES)
def test_draws_match_threefry(shape: tuple[int, ...]) -> None:
    reference, ours = _pair(7)
    for a, b in zip(_draws(reference, shape), _draws(ours, shape), strict=True):
        _same(a, b)


def test_batched_keys_match_under_vmap_and_jit() -> None:
    """The samplers' pattern: per-env keys folded with step counts, drawn under vmap."""
    reference, ours = _pair(3)
    ids = jnp.arange(64, dtype=jnp.uint32)
    steps = jnp.arange(64, dtype=jnp.uint32) * 7

    @jax.jit
    def draw(root: jax.Array) -> tuple[jax.Array, jax.Array]:
        env_keys = jax.vmap(lambda i: jax.random.fold_in(root, i))(ids)
        step_keys = jax.vmap(jax.random.fold_in)(env_keys, steps)
        logits = jnp.linspace(-1.0, 1.0, 64 * 3).reshape(64, 3)
        actions = jax.vmap(jax.random.categorical)(step_keys, logits)
        return actions, jax.vmap(lambda k: jax.random.normal(k, (2,)))(step_keys)

    for a, b in zip(draw(reference), draw(ours)):
        _same(a, b)


def test_wrap_round_trips_key_data() -> None:
    root = keys.key(11)
    data = jax.random.key_data(jax.random.split(root, 5))
    wrapped = keys.wrap(data)
    assert jax.random.key_impl(wrapped) == jax.random.key_impl(root)
    _same(jax.random.key_data(wrapped), data)


def test_compiled_hash_has_no_loop() -> None:
    """The point of the module: no while loop for XLA to stop fusing at (JAX's own CPU
    lowering of threefry has one)."""
    batch = jax.vmap(lambda k: jax.random.uniform(k, (2,)))

    def hlo(root: jax.Array) -> str:
        return jax.jit(batch).lower(jax.random.split(root, 128)).as_text()

    reference, ours = _pair(0)
    if jax.default_backend() == "cpu":
        assert "while" in hlo(reference)  # the contrast this module exists for
    assert "while" not in hlo(ours)
