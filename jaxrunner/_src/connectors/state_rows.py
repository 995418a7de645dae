"""The per-env rows of a :class:`ConnectorsState`: taken, put back and kept where inactive."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxrunner._src.connectors.base import ConnectorState
from jaxrunner._src.connectors.pipeline import ConnectorsState


def take_rows(state: ConnectorsState, index: jax.Array) -> ConnectorsState:
    """The per-env rows ``index`` of every connector (shared parts as they are)."""
    return _map_rows(state, lambda x: x[index])


def put_rows(state: ConnectorsState, part: ConnectorsState, index: jax.Array) -> ConnectorsState:
    """``state`` with per-env rows ``index`` from ``part`` (index ``num_envs``: dropped) and
    the shared parts from ``part``."""
    return _zip_rows(state, part, lambda full, p: full.at[index].set(p, mode="drop"))


def keep_active(new: ConnectorsState, old: ConnectorsState, active: jax.Array) -> ConnectorsState:
    """``new`` with the inactive rows' per-env state from ``old``."""

    def pick(n: jax.Array, o: jax.Array) -> jax.Array:
        return jnp.where(active.reshape(-1, *([1] * (n.ndim - 1))), n, o)

    return _zip_rows(old, new, lambda o, n: pick(n, o))


def _map_rows(state: ConnectorsState, fn: Any) -> ConnectorsState:
    def one(s: ConnectorState) -> ConnectorState:
        return s.replace(per_env=jax.tree.map(fn, s.per_env))

    return ConnectorsState(tuple(one(s) for s in state.obs), state.reward)


def _zip_rows(full: ConnectorsState, part: ConnectorsState, fn: Any) -> ConnectorsState:
    obs = tuple(
        p.replace(per_env=jax.tree.map(fn, f.per_env, p.per_env))
        for f, p in zip(full.obs, part.obs)
    )
    return ConnectorsState(obs, part.reward)


def device_copy(state: ConnectorsState) -> ConnectorsState:
    """A device copy of ``state`` that the runner owns: its compiled step donates its
    state, so a caller's arrays must never be the runner's."""
    return jax.device_put(jax.device_get(state))
