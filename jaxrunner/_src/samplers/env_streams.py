"""The envs' random streams in a scan, and their resets (the scan of
:mod:`jaxrunner._src.samplers.scan`, whose loop states the key rule)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import jaxrunner._src.samplers.keys as keys

ENV_STEP_STREAM = 0xFFFFFFFF
"""Folded into the seed's key to root the envs' step keys (the policy's stream folds
in env ids, which never reach these values)."""
ENV_RESET_STREAM = 0xFFFFFFFE
"""Roots the keys of the resets that follow ended episodes."""
ENV_FIRST_RESET_STREAM = 0xFFFFFFFD
"""Roots the keys of the envs' first resets."""


def first_reset_keys(seed: int, env_ids: jax.Array) -> jax.Array:
    """``[B]`` keys of the envs' first resets."""
    return env_step_keys(keys.key(seed), ENV_FIRST_RESET_STREAM, env_ids)


def env_roots(seed: int) -> jax.Array:
    """``[2]`` keys: the roots of the step keys and of the reset keys."""
    key = keys.key(seed)
    return jnp.stack(
        [jax.random.fold_in(key, ENV_STEP_STREAM), jax.random.fold_in(key, ENV_RESET_STREAM)]
    )


def env_step_keys(root: jax.Array, step: int | jax.Array, env_ids: jax.Array) -> jax.Array:
    """``[B]`` keys of the envs' ``step``-th step (or reset) under ``root``: one shared
    key, ``fold_in(root, step)``, hashed with each env id."""
    shared = jax.random.fold_in(root, step)
    return jax.vmap(lambda i: jax.random.fold_in(shared, i))(env_ids.astype(jnp.uint32))


def reset_where_done(
    done: jax.Array,
    stepped: Any,
    reset: Callable[[jax.Array], Any],
    reset_root: jax.Array,
    step: jax.Array,
    env_ids: jax.Array,
) -> Any:
    """``stepped`` (a pytree of ``[B, ...]`` leaves) with the rows where ``done`` replaced
    by ``reset(keys)``'s (a reset of ``len(keys)`` envs), env ``i`` reset with
    ``fold_in(fold_in(reset_root, step), i)``.

    Only the done envs are reset (up to ``B // 8`` gathered into a small batch, else
    all at once), where gymnax's and JaxMARL's ``step`` reset all ``B`` every step."""
    num_envs = done.shape[0]
    few = max(num_envs // 8, 1)

    def pick(new: jax.Array, old: jax.Array) -> jax.Array:  # ``done`` over trailing axes
        return jnp.where(done.reshape(-1, *([1] * (jnp.ndim(old) - 1))), new, old)

    def all_rows() -> Any:
        return jax.tree.map(pick, reset(env_step_keys(reset_root, step, env_ids)), stepped)

    def some_rows() -> Any:
        # The done rows, padded with an index past the end that the scatter drops.
        rows = jnp.nonzero(done, size=few, fill_value=num_envs)[0]
        fresh = reset(env_step_keys(reset_root, step, env_ids[jnp.minimum(rows, num_envs - 1)]))
        return jax.tree.map(lambda old, new: old.at[rows].set(new, mode="drop"), stepped, fresh)

    count = jnp.count_nonzero(done)
    branch = jnp.where(count == 0, 0, jnp.where(count <= few, 1, 2))
    return jax.lax.switch(branch, [lambda: stepped, some_rows, all_rows])
