"""Running moments (count, mean, sum of squared deviations) with an exact parallel merge.

:class:`Moments` is Chan et al.'s parallel-variance state: two sets of moments merge into
the moments of their union, so statistics gathered by different envs, samples or
runners combine exactly (up to float rounding), in any grouping of the data.
:class:`RunningMoments` is what a connector keeps: the statistics it uses, and the
``delta`` gathered since an :class:`~jaxrunner.EnvRunnerGroup` last collected it.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.struct
import jax
import jax.numpy as jnp


def _expand(count: jax.Array, like: jax.Array) -> jax.Array:
    """``count`` (``[...]``) shaped to broadcast over ``like`` (``[..., *shape]``)."""
    return count.reshape(count.shape + (1,) * (like.ndim - count.ndim))


@flax.struct.dataclass
class Moments:
    """Moments of a set of samples of shape ``shape`` (optionally one set per env).

    Attributes:
        count: ``[]`` (or ``[B]``) float32, the number of samples.
        mean: ``[*shape]`` (or ``[B, *shape]``) their mean.
        m2: the same shape: the sum of squared deviations from the mean.
    """

    count: jax.Array
    mean: jax.Array
    m2: jax.Array

    @classmethod
    def zeros(cls, shape: Sequence[int], batch: Sequence[int] = ()) -> Moments:
        """Empty moments: ``batch`` sets of samples of shape ``shape``."""
        full = (*batch, *shape)
        return cls(jnp.zeros(tuple(batch), jnp.float32), jnp.zeros(full), jnp.zeros(full))

    @classmethod
    def of(cls, x: jax.Array, mask: jax.Array | None = None) -> Moments:
        """The moments of the rows of ``x`` (``[N, *shape]``) where ``mask`` ([N]) is true."""
        x = jnp.asarray(x, jnp.float32)
        w = jnp.ones(x.shape[0], jnp.float32) if mask is None else mask.astype(jnp.float32)
        count = w.sum()
        wx = _expand(w, x)
        mean = (wx * x).sum(0) / jnp.maximum(count, 1.0)
        return cls(count, mean, (wx * (x - mean) ** 2).sum(0))

    @property
    def var(self) -> jax.Array:
        """Population variance (``m2 / count``); 1 where fewer than 2 samples."""
        count = _expand(self.count, self.m2)
        return jnp.where(count > 1, self.m2 / jnp.maximum(count, 1.0), 1.0)

    def merge(self, other: Moments) -> Moments:
        """The moments of both sets of samples (Chan et al.'s parallel update)."""
        count = self.count + other.count
        na, nb = _expand(self.count, self.mean), _expand(other.count, other.mean)
        n = jnp.maximum(na + nb, 1.0)
        delta = other.mean - self.mean
        mean = self.mean + delta * (nb / n)
        m2 = self.m2 + other.m2 + delta**2 * (na * nb / n)
        return Moments(count, mean, m2)

    def add(self, x: jax.Array) -> Moments:
        """Welford's update of per-env moments (``[B]`` counts) with one row per env."""
        x = jnp.asarray(x, jnp.float32)
        count = self.count + 1.0
        delta = x - self.mean
        mean = self.mean + delta / _expand(count, delta)
        return Moments(count, mean, self.m2 + delta * (x - mean))

    def total(self) -> Moments:
        """Per-env moments (``[B]`` counts) merged into one set, in one fixed reduction
        (so the result depends on the envs' data only, never on how they were batched)."""
        count = self.count.sum()
        w = _expand(self.count, self.mean)
        mean = (w * self.mean).sum(0) / jnp.maximum(count, 1.0)
        m2 = self.m2.sum(0) + (w * (self.mean - mean) ** 2).sum(0)
        return Moments(count, mean, m2)


@flax.struct.dataclass
class RunningMoments:
    """A connector's shared statistics.

    Attributes:
        stats: the moments the connector uses (all samples it knows of).
        delta: the moments added to ``stats`` since an
            :class:`~jaxrunner.EnvRunnerGroup` last took them (:func:`take_deltas`).
    """

    stats: Moments
    delta: Moments

    @classmethod
    def zeros(cls, shape: Sequence[int]) -> RunningMoments:
        return cls(Moments.zeros(shape), Moments.zeros(shape))

    def add(self, batch: Moments) -> RunningMoments:
        return RunningMoments(self.stats.merge(batch), self.delta.merge(batch))


def _is_running(x: object) -> bool:
    return isinstance(x, RunningMoments)


def take_deltas(state: object) -> tuple[object, list[Moments]]:
    """Every :class:`RunningMoments`' ``delta`` in ``state`` (a connector state pytree),
    and the state with those deltas emptied: what a runner reports to its group."""
    found = [x for x in jax.tree.leaves(state, is_leaf=_is_running) if _is_running(x)]
    deltas = [x.delta for x in found]

    def empty(x: object) -> object:
        if not _is_running(x):
            return x
        return x.replace(delta=jax.tree.map(jnp.zeros_like, x.delta))  # type: ignore[attr-defined]

    return jax.tree.map(empty, state, is_leaf=_is_running), deltas


def set_statistics(state: object, stats: Sequence[Moments]) -> object:
    """``state`` with each :class:`RunningMoments`' ``stats`` replaced, in
    :func:`take_deltas` order, and its delta emptied: what a group broadcasts."""
    queue = list(stats)

    def put(x: object) -> object:
        if not _is_running(x):
            return x
        new = queue.pop(0)
        return RunningMoments(new, jax.tree.map(jnp.zeros_like, new))

    return jax.tree.map(put, state, is_leaf=_is_running)


def merge_all(parts: Sequence[Sequence[Moments]]) -> list[Moments]:
    """Merges lists of moments position by position, in the order given."""
    out = list(parts[0])
    for part in parts[1:]:
        out = [a.merge(b) for a, b in zip(out, part)]
    return out


__all__ = ["Moments", "RunningMoments", "merge_all", "set_statistics", "take_deltas"]
