"""The per-env rows of a :class:`ConnectorsState`: taken, put back and kept where inactive."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxrunner._src.connectors.pipeline import ConnectorsState


def take_rows(state: ConnectorsState, index: jax.Array) -> ConnectorsState:
    """The per-env rows ``index`` of every connector (shared parts as they are)."""
    return _zip_rows(state, state, lambda _, x: x[index])


def put_rows(state: ConnectorsState, part: ConnectorsState, index: jax.Array) -> ConnectorsState:
    """``state`` with per-env rows ``index`` from ``part`` (index ``num_envs``: dropped) and
    the shared parts from ``part``."""
    return _zip_rows(state, part, lambda full, p: full.at[index].set(p, mode="drop"))


def keep_active(new: ConnectorsState, old: ConnectorsState, active: jax.Array) -> ConnectorsState:
    """``new`` with the inactive rows' per-env state from ``old``."""
    return _zip_rows(
        old, new, lambda o, n: jnp.where(active.reshape(-1, *([1] * (n.ndim - 1))), n, o)
    )


def _zip_rows(full: ConnectorsState, part: ConnectorsState, fn: Any) -> ConnectorsState:
    """``part`` with each per-env leaf ``fn(full's leaf, part's leaf)``."""
    obs = tuple(
        p.replace(per_env=jax.tree.map(fn, f.per_env, p.per_env))
        for f, p in zip(full.obs, part.obs)
    )
    return ConnectorsState(obs, part.reward)
