"""Compact next observations (``compact_next_obs=True``): ``next_obs`` kept only at the rows
where it is not the next step's ``obs`` (an episode end, a failed or reset sub-env, the
last step), and rebuilt from ``obs`` on demand. An agent group's rows follow each agent
slot's next valid row instead of the next step (``valid`` given)."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


class FinalObs(flax.struct.PyTreeNode):
    """The rows of ``next_obs`` that are not the ``obs`` their slot acts on next
    (every slot with no next row in the trajectory among them): ``index``, their flat
    slots ``t * R + r`` ascending (``[K]`` int64, ``R`` rows per step), and their ``obs``."""

    index: Any
    obs: Any


def materialize(obs: Any, store: FinalObs, num_envs: int, valid: Any = None) -> Any:
    """The dense ``[T, B]`` next observations of a compact trajectory: ``obs`` moved up
    one step, with the stored rows written over it (numpy or jax, as ``obs`` is). With
    a group's ``valid`` (``[T, B, A_g]``, numpy): each slot's obs at its next valid row,
    zero where it has none."""
    if valid is not None:
        index, lead = np.asarray(store.index), np.shape(valid)

        def written(rows: np.ndarray, stored: Any) -> np.ndarray:
            rows.reshape(-1, *rows.shape[2:])[index] = stored
            return rows.reshape(*lead, *rows.shape[2:])

        return jax.tree.map(written, following(obs, valid), store.obs)

    def one(o: Any, stored: Any) -> Any:
        flat_shape = (o.shape[0] * num_envs, *o.shape[2:])
        if isinstance(o, np.ndarray):
            out = np.empty_like(o)
            out[:-1] = o[1:]
            out.reshape(flat_shape)[np.asarray(store.index)] = stored
            return out
        shifted = jnp.concatenate([o[1:], o[-1:]])  # the last step is all stored
        return shifted.reshape(flat_shape).at[store.index].set(stored).reshape(o.shape)

    return jax.tree.map(one, obs, store.obs)


def slot_rows(obs: Any, store: FinalObs, num_envs: int, steps: slice, env: int) -> Any:
    """``next_obs[steps, env]`` of a compact trajectory (a copy), without building the
    rest."""
    ts = np.arange(steps.start, steps.stop)
    flat = ts * num_envs + env
    index = np.asarray(store.index)
    where = np.searchsorted(index, flat)
    stored = where < len(index)
    stored[stored] = index[where[stored]] == flat[stored]

    def one(o: np.ndarray, s: np.ndarray) -> np.ndarray:
        rows = np.array(o[np.minimum(ts + 1, o.shape[0] - 1), env])  # the last is stored
        rows[stored] = s[where[stored]]
        return rows

    return jax.tree.map(one, obs, store.obs)


def time_slice(
    obs: Any, store: FinalObs, num_rows: int, start: int, stop: int, valid: Any = None
) -> FinalObs:
    """The store of steps ``start:stop``: the stored rows among them, and the rows whose
    next row is at ``stop`` or later (every env's row at ``stop - 1``; with a group's
    ``valid``, the slots whose next valid row is), taken from ``obs`` where not stored."""
    index = np.asarray(store.index)
    lo, hi = np.searchsorted(index, [start * num_rows, stop * num_rows])
    if valid is None:
        leaving = np.arange((stop - 1) * num_rows, stop * num_rows)
        source = np.full(num_rows, stop)
    else:
        valid2, after = next_rows(valid)
        leaving = start * num_rows + np.flatnonzero(
            valid2[start:stop] & (after[start:stop] >= stop)
        )
        source = after.reshape(-1)[leaving]  # never T: such rows are stored
    absent = ~np.isin(leaving, index[lo:hi])
    missing, source = leaving[absent], source[absent]
    new_index = np.concatenate([index[lo:hi], missing]) - start * num_rows
    order = np.argsort(new_index, kind="stable")

    def one(o: np.ndarray, s: np.ndarray) -> np.ndarray:
        rows = np.asarray(o).reshape(len(o), num_rows, *s.shape[1:])
        extra = rows[source, missing % num_rows]
        return np.concatenate([np.asarray(s[lo:hi]), extra])[order]

    return FinalObs(index=new_index[order], obs=jax.tree.map(one, obs, store.obs))


def compact(obs: Any, next_obs: Any, valid: np.ndarray) -> FinalObs:
    """The store of a group's dense ``next_obs`` (``[T, B, A_g]`` numpy, as ``obs`` and
    ``valid``): the slots whose next observation is not, bitwise, their obs at their
    next valid row (zero where they have none), and every valid slot with no next row."""
    num_steps, extra = len(valid), valid.ndim
    valid2, after = next_rows(valid)
    stored = valid2 & (after == num_steps)
    pairs = [
        (o.reshape(valid2.shape + o.shape[extra:]), n.reshape(valid2.shape + n.shape[extra:]))
        for o, n in zip(jax.tree.leaves(obs), jax.tree.leaves(next_obs))
    ]
    # A sixteenth of the steps at a time: the temporaries stay small beside the buffers.
    chunk = max(1, num_steps // 16)
    for lo in range(0, num_steps, chunk):
        part = slice(lo, lo + chunk)
        t, r = np.nonzero(valid2[part] & (after[part] < num_steps))
        t += lo
        z, q = np.nonzero(~valid2[part])  # no transition: must be zero
        z += lo
        for o, n in pairs:
            stored[t, r] |= _differs(n[t, r], o[after[t, r], r])
            stored[z, q] |= _differs(n[z, q])
    index = np.flatnonzero(stored)
    rows = jax.tree.map(lambda n: n.reshape(stored.size, *n.shape[extra:])[index], next_obs)
    return FinalObs(index=index, obs=rows)


def next_rows(valid: Any) -> tuple[np.ndarray, np.ndarray]:
    """``valid`` (``[T, ...]``) as ``[T, R]``, and ``[T, R]``: each slot's next valid row
    after it (``T`` where there is none)."""
    valid = np.asarray(valid).reshape(len(valid), -1)
    num_steps = len(valid)
    rows = np.where(valid, np.arange(num_steps)[:, None], num_steps)
    after = np.full_like(rows, num_steps)
    after[:-1] = np.minimum.accumulate(rows[::-1], axis=0)[::-1][1:]
    return valid, after


def following(obs: Any, valid: np.ndarray) -> Any:
    """Per leaf ``[T, R, ...]``: each slot's obs at its next valid row, zero where it
    has none or is not valid itself."""
    valid2, after = next_rows(valid)
    t, r = np.nonzero(valid2 & (after < len(valid)))

    def one(o: np.ndarray) -> np.ndarray:
        rows = o.reshape(valid2.shape + o.shape[valid.ndim :])
        out = np.zeros_like(rows)
        out[t, r] = rows[after[t, r], r]
        return out

    return jax.tree.map(one, obs)


def _differs(a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """``[K]``: the rows of ``a`` (``[K, ...]``) that differ in any bit from those of ``b``
    (None: zeros). Bits, not values: NaNs and -0.0 compare too."""
    if a.size == 0:
        return np.zeros(len(a), np.bool_)
    size = a.dtype.itemsize
    unsigned = np.dtype(f"u{size}") if size in (1, 2, 4, 8) else np.dtype(np.uint8)

    def bits(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x).reshape(len(x), -1).view(unsigned)

    return np.asarray((bits(a) if b is None else bits(a) != bits(b)).any(axis=-1))


def concatenate(stores: list[FinalObs], lengths: list[int], num_envs: int) -> FinalObs:
    """The stores of trajectories joined along time (``lengths``: their ``T``)."""
    offsets = np.cumsum([0, *lengths[:-1]]) * num_envs
    index = np.concatenate([np.asarray(s.index) + o for s, o in zip(stores, offsets)])
    obs = jax.tree.map(lambda *xs: np.concatenate(xs), *(s.obs for s in stores))
    return FinalObs(index=index, obs=obs)


def concatenate_envs(stores: list[FinalObs], widths: list[int]) -> FinalObs:
    """The stores of trajectories of the same ``T`` joined along the env axis
    (``widths``: their ``B``)."""
    total, offsets = sum(widths), np.cumsum([0, *widths[:-1]])
    index = np.concatenate(
        [
            np.asarray(s.index) // b * total + np.asarray(s.index) % b + o
            for s, b, o in zip(stores, widths, offsets)
        ]
    )
    order = np.argsort(index, kind="stable")
    obs = jax.tree.map(lambda *xs: np.concatenate(xs)[order], *(s.obs for s in stores))
    return FinalObs(index=index[order], obs=obs)
