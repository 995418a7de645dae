"""FrameStack: the last ``num_frames`` observations of each env, every leaf stacked."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces

from jaxrunner._src.arg_checks import check_int
from jaxrunner._src.connectors.base import ConnectorState, ObsConnector
from jaxrunner._src.connectors.structured_spaces import map_space
from jaxrunner._src.space_arrays.buffers import leaf_spec
from jaxrunner.errors import InvalidArgumentError


def _stacked_space(leaf: spaces.Space, k: int) -> spaces.Box:
    """The space of ``k`` stacked observations of a leaf space (a Box of its bounds)."""
    shape, dtype = leaf_spec(leaf)
    if isinstance(leaf, spaces.Box):
        low, high = leaf.low, leaf.high
    elif isinstance(leaf, spaces.Discrete):
        low, high = np.asarray(leaf.start), np.asarray(leaf.start + leaf.n - 1)
    elif isinstance(leaf, spaces.MultiDiscrete):
        low, high = np.asarray(leaf.start), np.asarray(leaf.start + leaf.nvec - 1)
    else:  # MultiBinary
        low, high = np.zeros(shape), np.ones(shape)
    low = np.broadcast_to(np.asarray(low, dtype), shape)
    high = np.broadcast_to(np.asarray(high, dtype), shape)
    return spaces.Box(np.repeat(low[None], k, 0), np.repeat(high[None], k, 0), dtype=dtype)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FrameStack(ObsConnector):
    """The last ``num_frames`` observations of each env, oldest first: ``[k, *shape]``.
    At an episode start the stack is filled with the first observation (never frames of
    the previous episode, never another env's; for an agent group, never another
    agent's).

    ``Dict`` and ``Tuple`` observations are stacked leaf by leaf (each leaf
    ``[k, *shape]``); a ``Discrete``, ``MultiBinary`` or ``MultiDiscrete`` leaf becomes a
    ``Box`` of its bounds and dtype (``k`` values of a ``Discrete``: ``Box`` of shape
    ``(k,)``).
    """

    num_frames: int = 4

    def __post_init__(self) -> None:
        check_int("FrameStack", "num_frames", self.num_frames)

    def init(self, num_envs: int, obs_space: spaces.Space) -> ConnectorState:
        def zeros(leaf: spaces.Space) -> jax.Array:
            shape, dtype = leaf_spec(leaf)
            dtype = jax.dtypes.canonicalize_dtype(dtype)  # int64 -> int32 without x64
            return jnp.zeros((num_envs, self.num_frames, *shape), dtype)

        return ConnectorState(per_env=map_space("FrameStack", obs_space, zeros))

    def observation_space(self, space: spaces.Space) -> spaces.Space:
        k = self.num_frames
        return map_space("FrameStack", space, lambda s: _stacked_space(s, k), as_space=True)

    def __call__(
        self, state: ConnectorState, obs: Any, episode_start: jax.Array, active: jax.Array
    ) -> tuple[Any, ConnectorState]:
        def one(old: jax.Array, leaf: Any) -> jax.Array:
            leaf = jnp.asarray(leaf, old.dtype)
            rolled = jnp.concatenate([old[:, 1:], leaf[:, None]], axis=1)
            filled = jnp.broadcast_to(leaf[:, None], rolled.shape)
            start = episode_start.reshape(-1, *([1] * (rolled.ndim - 1)))
            return jnp.where(start, filled, rolled)

        stack = jax.tree.map(one, state.per_env, obs)
        return stack, state.replace(per_env=stack)

    def follow(self, state: ConnectorState, seen: Any, next_obs: Any) -> Any:
        if seen is None:
            raise InvalidArgumentError(
                "FrameStack.follow: the stack of the next observation needs the stack the "
                "policy saw; put FrameStack last in Connectors(obs=...)."
            )

        def one(stack: jax.Array, leaf: Any) -> jax.Array:
            leaf = jnp.asarray(leaf, stack.dtype)
            return jnp.concatenate([stack[:, :, 1:], leaf[:, :, None]], axis=2)

        return jax.tree.map(one, seen, next_obs)
