"""Compact next observations (``compact_next_obs=True``): ``next_obs`` kept only at the rows
where it is not the next step's ``obs`` (an episode end, a failed or reset sub-env, the
last step), and rebuilt from ``obs`` on demand."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces

from jaxrunner._src import space_arrays


class FinalObs(flax.struct.PyTreeNode):
    """The rows of ``next_obs`` that differ from the next step's ``obs``.

    Attributes:
        index: ``[K]`` int64, the flat slots ``t * B + b``, ascending; every slot of
            the last step is among them.
        obs: the observations of those slots, ``[K, ...]`` per leaf.
    """

    index: Any
    obs: Any


def materialize(obs: Any, store: FinalObs, num_envs: int) -> Any:
    """The dense ``[T, B]`` next observations of a compact trajectory: ``obs`` moved up
    one step, with the stored rows written over it (numpy or jax, as ``obs`` is)."""

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


def slot_rows(
    obs: Any, store: FinalObs | FinalObsRecorder, num_envs: int, steps: slice, env: int
) -> Any:
    """``next_obs[steps, env]`` of a compact trajectory (a copy), without building the
    rest; ``store`` may be the recorder of a sample still running."""
    if isinstance(store, FinalObsRecorder):

        def row(t: int) -> Any:
            stored = store.row(t * num_envs + env)
            return jax.tree.map(lambda o: o[t + 1, env], obs) if stored is None else stored

        rows = [row(t) for t in range(steps.start, steps.stop)]
        return jax.tree.map(lambda *xs: np.stack(xs), *rows)
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


def time_slice(obs: Any, store: FinalObs, num_envs: int, start: int, stop: int) -> FinalObs:
    """The store of steps ``start:stop``: the stored rows among them, and every env's
    row at ``stop - 1`` (taken from ``obs[stop]`` where it was not stored)."""
    index = np.asarray(store.index)
    lo, hi = np.searchsorted(index, [start * num_envs, stop * num_envs])
    last = np.arange((stop - 1) * num_envs, stop * num_envs)
    missing = last[~np.isin(last, index[lo:hi])]
    kept = index[lo:hi] - start * num_envs
    new_index = np.concatenate([kept, missing - start * num_envs])
    order = np.argsort(new_index, kind="stable")

    def one(o: np.ndarray, s: np.ndarray) -> np.ndarray:
        extra = o[stop, missing - (stop - 1) * num_envs] if len(missing) else s[:0]
        return np.concatenate([np.asarray(s[lo:hi]), np.asarray(extra)])[order]

    return FinalObs(index=new_index[order], obs=jax.tree.map(one, obs, store.obs))


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


class FinalObsRecorder:
    """Collects a sample's stored rows while it runs, then builds its :class:`FinalObs`.

    ``record`` is called with every recorded env step; it keeps the rows that need
    storing and writes the next observation into ``obs[t + 1]`` at once, so that the
    rows built from ``obs`` are complete as soon as a step is recorded (partial
    trajectories after an error, callbacks' live episodes)."""

    def __init__(self, obs_space: spaces.Space, num_steps: int, num_envs: int) -> None:
        self._space, self.num_steps, self.num_envs = obs_space, num_steps, num_envs
        self._rows: dict[int, Any] = {}

    def record(
        self,
        buf_obs: Any,
        steps: Any,
        envs: Any,
        next_obs: Any,
        obs: Any,
        sel: Any,
        differs: np.ndarray,
    ) -> None:
        """Steps ``steps`` of envs ``envs``, whose next and following observations are
        rows ``sel`` of ``next_obs`` and ``obs``; ``differs``: where an episode ended,
        failed or reset (the next step's observation is another). Lockstep: ``steps``
        an int, ``envs`` a slice and ``sel`` None (every row, in order), written as one
        block; else arrays, one entry per env."""
        block = isinstance(envs, slice)
        if block:
            last = steps == self.num_steps - 1
            keep = np.ones_like(differs) if last else differs
            env_ids = range(envs.start, envs.stop)
        else:
            last = steps == self.num_steps - 1
            keep = differs | last
            env_ids = envs
        for j in np.flatnonzero(keep).tolist():
            t = steps if block else int(steps[j])
            row = space_arrays.take(self._space, next_obs, j if block else int(sel[j]))
            slot = int(t) * self.num_envs + int(env_ids[j])
            self._rows[slot] = jax.tree.map(np.array, row)
        if block:
            if not last:
                space_arrays.copy_into(self._space, buf_obs, obs, (steps + 1, envs))
            return
        go_on = ~last
        if go_on.any():
            space_arrays.copy_into(
                self._space,
                buf_obs,
                space_arrays.take(self._space, obs, sel[go_on]),
                (steps[go_on] + 1, envs[go_on]),
            )

    def row(self, slot: int) -> Any | None:
        return self._rows.get(slot)

    def finish(self, num_steps: int | None = None) -> FinalObs:
        """The store of the first ``num_steps`` steps (default all), in slot order."""
        limit = (self.num_steps if num_steps is None else num_steps) * self.num_envs
        index = np.array(sorted(k for k in self._rows if k < limit), dtype=np.int64)
        rows = [self._rows[k] for k in index.tolist()]
        empty = space_arrays.allocate(self._space, (0,))
        obs = jax.tree.map(lambda *xs: np.stack(xs), *rows) if rows else empty
        return FinalObs(index=index, obs=obs)
