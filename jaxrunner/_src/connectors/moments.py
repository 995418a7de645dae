"""Running moments (count, mean, sum of squared deviations) with an exact parallel merge
(Chan et al.), so statistics of different envs, samples or runners combine exactly; rows
holding a NaN or an infinity never enter them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner.errors import InvalidArgumentError


def _expand(count: jax.Array, like: jax.Array) -> jax.Array:
    """``count`` (``[...]``) shaped to broadcast over ``like`` (``[..., *shape]``)."""
    return count.reshape(count.shape + (1,) * (like.ndim - count.ndim))


COUNT_DTYPES = ("float32", "int32", "float64", "int64")
"""The dtypes a count may have: float32 counts exactly to 2**24 samples, int32 to
2**31 - 1, float64 and int64 (with ``jax_enable_x64``) far beyond."""


class Moments(flax.struct.PyTreeNode):
    """Moments of a set of samples of shape ``shape`` (optionally one set per env).

    Attributes:
        count: ``[]`` (or ``[B]``), the number of samples (float32 by default, or one of
            :data:`COUNT_DTYPES`; arithmetic on it is done in the mean's dtype).
        mean: ``[*shape]`` (or ``[B, *shape]``) their mean.
        m2: the same shape: the sum of squared deviations from the mean.
    """

    count: jax.Array
    mean: jax.Array
    m2: jax.Array

    @classmethod
    def zeros(
        cls, shape: Sequence[int], batch: Sequence[int] = (), count_dtype: Any = jnp.float32
    ) -> Moments:
        """Empty moments: ``batch`` sets of samples of shape ``shape``."""
        full = (*batch, *shape)
        return cls(jnp.zeros(tuple(batch), count_dtype), jnp.zeros(full), jnp.zeros(full))

    @classmethod
    def of(
        cls, x: jax.Array, mask: jax.Array | None = None, count_dtype: Any = jnp.float32
    ) -> Moments:
        """The moments of the rows of ``x`` (``[N, *shape]``) where ``mask`` ([N]) is true
        and every value is finite (a row with a NaN or an infinity is left out)."""
        x = jnp.asarray(x, jnp.float32)
        finite = jnp.isfinite(x).reshape(x.shape[0], -1).all(axis=1)
        keep = finite if mask is None else finite & mask
        x = jnp.where(_expand(finite, x), x, 0.0)  # 0 * NaN would still be NaN
        w = keep.astype(jnp.float32)
        count = w.sum()
        wx = _expand(w, x)
        mean = (wx * x).sum(0) / jnp.maximum(count, 1.0)
        return cls(keep.sum(dtype=count_dtype), mean, (wx * (x - mean) ** 2).sum(0))

    @property
    def var(self) -> jax.Array:
        """Population variance (``m2 / count``); 1 where fewer than 2 samples."""
        count = _expand(self.count, self.m2).astype(self.m2.dtype)
        return jnp.where(count > 1, self.m2 / jnp.maximum(count, 1.0), 1.0)

    def inverse_std(self, epsilon: float, min_std: float, max_std: float) -> jax.Array:
        """``1 / sqrt(var + epsilon)``, the std clamped to ``[min_std, max_std]``, and 1
        where the variance is 0 (nothing is known of the scale yet)."""
        var = jnp.where(self.m2 > 0, self.var, 1.0)
        # One rsqrt of [*shape], the clamp applied to it: callers then only multiply.
        return jnp.clip(jax.lax.rsqrt(var + epsilon), 1.0 / max_std, 1.0 / min_std)

    def merge(self, other: Moments) -> Moments:
        """The moments of both sets of samples (Chan et al.'s parallel update)."""
        count = self.count + other.count.astype(self.count.dtype)
        na = _expand(self.count, self.mean).astype(self.mean.dtype)
        nb = _expand(other.count, other.mean).astype(self.mean.dtype)
        n = jnp.maximum(na + nb, 1.0)
        delta = other.mean - self.mean
        mean = self.mean + delta * (nb / n)
        m2 = self.m2 + other.m2 + delta**2 * (na * nb / n)
        return Moments(count, mean, m2)

    def add(self, x: jax.Array) -> Moments:
        """Welford's update of per-env moments (``[B]`` counts) with one row per env."""
        x = jnp.asarray(x, jnp.float32)
        count = self.count + jnp.ones((), self.count.dtype)
        delta = x - self.mean
        mean = self.mean + delta / _expand(count, delta).astype(delta.dtype)
        return Moments(count, mean, self.m2 + delta * (x - mean))

    def total(self) -> Moments:
        """Per-env moments (``[B]`` counts) merged into one set, in one fixed reduction
        (so the result depends on the envs' data only, never on how they were batched)."""
        count = self.count.sum(dtype=self.count.dtype)
        w = _expand(self.count, self.mean).astype(self.mean.dtype)
        mean = (w * self.mean).sum(0) / jnp.maximum(count, 1.0)
        m2 = self.m2.sum(0) + (w * (self.mean - mean) ** 2).sum(0)
        return Moments(count, mean, m2)


class RunningMoments(flax.struct.PyTreeNode):
    """A connector's shared statistics.

    Attributes:
        stats: the moments the connector uses (all samples it knows of).
        delta: the moments added to ``stats`` since an
            :class:`~jaxrunner.EnvRunnerGroup` last took them (:func:`take_deltas`).
        frozen: ``[]`` bool: while true, :meth:`add` leaves the moments as they are
            (:func:`freeze`, :func:`unfreeze`).
    """

    stats: Moments
    delta: Moments
    frozen: jax.Array

    @classmethod
    def zeros(
        cls, shape: Sequence[int], count_dtype: Any = jnp.float32, frozen: bool = False
    ) -> RunningMoments:
        stats, delta = (Moments.zeros(shape, count_dtype=count_dtype) for _ in range(2))
        return cls(stats, delta, jnp.asarray(frozen))

    def add(self, batch: Moments, *, force: bool = False) -> RunningMoments:
        """The moments with ``batch`` merged in, unless frozen (``force``: even then)."""
        added = self.replace(stats=self.stats.merge(batch), delta=self.delta.merge(batch))
        if force:
            return added
        return jax.tree.map(lambda old, new: jnp.where(self.frozen, old, new), self, added)


def is_running(x: object) -> bool:
    return isinstance(x, RunningMoments)


def _map_running(state: Any, fn: Callable[[RunningMoments], RunningMoments]) -> Any:
    """``state`` with ``fn`` applied to each :class:`RunningMoments` in it, in leaf order."""
    return jax.tree.map(lambda x: fn(x) if is_running(x) else x, state, is_leaf=is_running)


S = TypeVar("S")
"""A connector state pytree, kept as it is but for its :class:`RunningMoments`."""


def take_deltas(state: S) -> tuple[S, list[Moments]]:
    """Every :class:`RunningMoments`' ``delta`` in ``state`` (a connector state pytree),
    and the state with those deltas emptied: what a runner reports to its group."""
    deltas = [x.delta for x in jax.tree.leaves(state, is_leaf=is_running) if is_running(x)]
    empty = _map_running(state, lambda x: x.replace(delta=jax.tree.map(jnp.zeros_like, x.delta)))
    return empty, deltas


def set_statistics(state: S, stats: Sequence[Moments]) -> S:
    """``state`` with each :class:`RunningMoments`' ``stats`` replaced, in
    :func:`take_deltas` order, and its delta emptied: what a group broadcasts."""
    queue = list(stats)
    wanted = sum(is_running(x) for x in jax.tree.leaves(state, is_leaf=is_running))
    if len(queue) != wanted:
        raise InvalidArgumentError(
            f"set_statistics: the state has {wanted} running statistics, got {len(queue)}; "
            "pass the merged statistics of states of this connector pipeline, in "
            "take_deltas order."
        )

    def put(x: RunningMoments) -> RunningMoments:
        new, i = queue.pop(0), wanted - len(queue) - 1
        shapes = jax.tree.map(jnp.shape, x.stats)
        if not isinstance(new, Moments) or jax.tree.map(jnp.shape, new) != shapes:
            raise InvalidArgumentError(
                f"set_statistics: stats[{i}] must be a Moments of the shapes of the state's "
                f"({shapes}), got {type(new).__name__}; pass merged statistics of this pipeline."
            )
        return x.replace(stats=new, delta=jax.tree.map(jnp.zeros_like, new))

    return _map_running(state, put)


def freeze(state: Any) -> Any:
    """``state`` (a connector state pytree, e.g. ``runner.get_connector_state()``) with
    every statistic frozen until :func:`unfreeze`; hand it back with
    ``runner.set_connector_state(...)`` (nothing recompiles)."""
    return _map_running(state, lambda x: x.replace(frozen=np.asarray(True)))


def unfreeze(state: Any) -> Any:
    """``state`` with every statistic updated again (the inverse of :func:`freeze`)."""
    return _map_running(state, lambda x: x.replace(frozen=np.asarray(False)))


def merge_all(parts: Sequence[Sequence[Moments]]) -> list[Moments]:
    """Merges lists of moments position by position, in the order given."""
    out = list(parts[0])
    for part in parts[1:]:
        out = [a.merge(b) for a, b in zip(out, part)]
    return out
