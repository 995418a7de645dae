"""Clipping Box actions to their bounds, for the env only (trajectories keep the actions as
sampled, so log-probs stay exact): numpy batches in the host loop, traced ones in the scan."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces

Clip = Callable[[Any], Any]


def _clipper(space: spaces.Space, clip_box: Callable[[spaces.Box], Clip]) -> Clip | None:
    """A function clipping every bounded Box leaf with ``clip_box(leaf_space)``, or None
    if no part of ``space`` is a bounded Box."""
    if isinstance(space, spaces.Box):
        if not (np.isfinite(space.low).any() or np.isfinite(space.high).any()):
            return None
        return clip_box(space)
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        is_dict = isinstance(space, spaces.Dict)
        items = list(space.items()) if is_dict else list(enumerate(space))
        clippers = {key: _clipper(sub, clip_box) for key, sub in items}
        if all(c is None for c in clippers.values()):
            return None

        def clip_tree(actions: Any) -> Any:
            out = {k: (actions[k] if c is None else c(actions[k])) for k, c in clippers.items()}
            return out if is_dict else tuple(out[j] for j in range(len(out)))

        return clip_tree
    return None


def _numpy_box(space: spaces.Box) -> Clip:
    low, high = space.low, space.high
    # An infinite action stays as it is, for the backend's check to refuse (clipped, it
    # would reach the env as a bound while the trajectory recorded inf).
    return lambda actions: actions if np.isinf(actions).any() else np.clip(actions, low, high)


def _jax_box(space: spaces.Box) -> Clip:
    import jax.numpy as jnp  # here, not at the top: a Ray actor's import of this skips JAX

    low, high = space.low, space.high
    # Bounds in the actions' dtype: a float64 bound must not promote float32 actions.
    return lambda actions: jnp.clip(actions, low.astype(actions.dtype), high.astype(actions.dtype))


def clip_box_actions(space: spaces.Space) -> Clip | None:
    """Returns a function clipping a numpy batch of actions to the Box bounds of
    ``space`` (Box leaves of Dict/Tuple spaces included), or None if no part of
    ``space`` is a bounded Box (then there is nothing to clip)."""
    return _clipper(space, _numpy_box)


def clip_box_actions_jax(space: spaces.Space) -> Clip:
    """Like :func:`clip_box_actions`, with ``jnp.clip`` for traced batches; the identity
    where there is nothing to clip (inside a jitted function it costs nothing)."""
    return _clipper(space, _jax_box) or (lambda actions: actions)
