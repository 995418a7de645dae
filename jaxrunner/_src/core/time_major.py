"""What every trajectory shares: ``[T, B, ...]`` fields sliced and joined along time or
envs, numpy conversion, ``.npz`` files, and ``next_obs`` stored in full or compact."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Self, TypeVar

import jax
import numpy as np

from jaxrunner._src.arg_checks import check_int, check_path
from jaxrunner._src.core import next_obs_store
from jaxrunner._src.core.next_obs_store import FinalObs
from jaxrunner._src.core.npz_file import write_npz
from jaxrunner._src.core.trajectory_file import VERSION, encode_tree
from jaxrunner.errors import InvalidArgumentError

MAX_LOAD_BYTES = 1 << 33
"""The ``load`` methods' default cap on the arrays' memory (8 GiB)."""

HostOrDevice = np.ndarray | jax.Array
"""A field's arrays: numpy from host samplers, jax.Array from the on-device scan (and
inside its compiled functions)."""


class TimeMajor:
    """What every trajectory has: fields ``[T, B, ...]`` (the ``_lead`` field exactly
    ``[T, B]``), sliced and joined along time, converted to numpy, saved to ``.npz``."""

    _lead: ClassVar[str] = "reward"
    _FORMAT: ClassVar[str]
    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def num_steps(self) -> int:
        """T, the length of the time axis."""
        return int(getattr(self, self._lead).shape[0])

    @property
    def num_envs(self) -> int:
        """B, the length of the env axis."""
        return int(getattr(self, self._lead).shape[1])

    @property
    def is_compact(self) -> bool:
        """Only the next observations that are not the next step's are stored."""
        return False

    def dense(self) -> Self:
        """This trajectory with ``next_obs`` stored in full (itself if it is)."""
        return self

    def to_numpy(self) -> Self:
        """The same trajectory with every leaf a numpy array (device -> host)."""
        return jax.tree.map(np.asarray, jax.device_get(self))

    def time_slice(self, start: int, stop: int) -> Self:
        """Steps ``start:stop`` of every field (as a Python slice: negative ints count
        from the end)."""
        where = f"{type(self).__name__}.time_slice"
        for name, value in (("start", start), ("stop", stop)):
            check_int(where, name, value, low=-math.inf)
        return self._time_slice(int(start), int(stop))

    def _time_slice(self, start: int, stop: int) -> Self:
        return jax.tree.map(lambda x: x[start:stop], self)

    @classmethod
    def _aligned(cls, parts: Sequence[Self]) -> Sequence[Self]:
        """``parts`` with the same optional fields, so their trees can be joined."""
        return parts

    @classmethod
    def _joined(cls, parts: Sequence[Self], axis: int) -> Self:
        """``parts`` joined leaf by leaf along ``axis`` (0: time, 1: envs)."""
        return concatenate_leaves([p.dense() for p in parts], axis)

    def _save(
        self, path: str | os.PathLike[str], names: Sequence[str], **more: Callable[..., Any]
    ) -> None:
        """Writes the fields ``names`` to one ``.npz``, then each entry ``more[key](arrays)``
        of the spec (its arrays added to ``arrays``, after the fields')."""
        where = f"{type(self).__name__}.save"
        path = check_path(where, "path", path)
        arrays: dict[str, np.ndarray] = {}
        fields = {name: encode_tree(getattr(self, name), arrays) for name in names}
        spec = {"format": self._FORMAT, "version": VERSION, "fields": fields}
        spec |= {key: entry(arrays) for key, entry in more.items()}
        write_npz(path, {"__spec__": np.array(json.dumps(spec)), **arrays}, where)


TrajectoryT = TypeVar("TrajectoryT", bound=TimeMajor)


class StoredNextObs(TimeMajor):
    """Fields that hold transitions, with ``next_obs`` as a property over the field
    ``next_obs_store``: the dense array, or a compact trajectory's :class:`FinalObs`, from
    which it is built on demand."""

    obs: Any
    reward: Any
    terminated: Any
    truncated: Any
    next_obs_store: Any

    @classmethod
    def _file_fields(cls) -> tuple[str, ...]:
        """The fields of its ``.npz`` file, in order: ``next_obs`` (always dense) for the
        store."""
        return tuple("next_obs" if n == "next_obs_store" else n for n in cls.__dataclass_fields__)

    @property
    def done(self) -> np.ndarray:
        """``terminated | truncated``: where an episode ended."""
        return np.logical_or(self.terminated, self.truncated)

    def _set_fields(self, args: dict[str, Any]) -> None:
        """Sets the fields from ``__init__``'s arguments (its ``locals()``): ``next_obs``
        (dense) is how users build one, ``next_obs_store`` the field itself (what pytree
        unflattening and replace() pass); ``extras`` None is ``{}``."""
        next_obs, store = args["next_obs"], args["next_obs_store"]
        if next_obs is not None and store is not None:
            raise InvalidArgumentError(
                f"{type(self).__name__}(next_obs=..., next_obs_store=...): give one of "
                "them (next_obs: the dense next observations)."
            )
        values = {name: args[name] for name in self.__dataclass_fields__}
        values["next_obs_store"] = next_obs if store is None else store
        values["extras"] = {} if args["extras"] is None else args["extras"]
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @property
    def is_compact(self) -> bool:
        return isinstance(self.next_obs_store, FinalObs)

    @property
    def next_obs(self) -> Any:
        """The next observations (see the class docstring). On a compact trajectory each
        access builds a new array of ``obs``'s size; take what you need of it once, or
        use :meth:`next_value`."""
        store = self.next_obs_store
        if isinstance(store, FinalObs):
            return next_obs_store.materialize(self.obs, store, self.num_envs, self._turns())
        return store

    def env_rows(self, name: str, steps: slice, env: int) -> Any:
        """A copy of field ``name``'s steps ``steps`` of env ``env`` (``next_obs``
        included: of a compact trajectory, built from its stored rows alone)."""
        if name == "next_obs" and self.is_compact and self._turns() is None:
            return next_obs_store.slot_rows(
                self.obs, self.next_obs_store, self.num_envs, steps, env
            )
        return jax.tree.map(lambda x: np.array(x[steps, env]), getattr(self, name))

    def _turns(self) -> np.ndarray | None:
        """A group's ``valid``, whose next valid row holds each slot's next observation
        (None: the next step's row does, as for a single-agent trajectory)."""
        return None

    def _following_value(self, value: Any) -> Any:
        """Each slot's ``value`` at the row whose ``obs`` is its next observation."""
        turns = self._turns()
        if turns is None:
            return jax.numpy.concatenate([value[1:], value[-1:]])
        following = next_obs_store.following(np.asarray(value), turns)
        return jax.numpy.asarray(following.reshape(turns.shape))

    def dense(self) -> Self:
        return self.replace(next_obs_store=self.next_obs) if self.is_compact else self  # type: ignore[attr-defined]

    def next_value(self, value: Any, value_fn: Any) -> Any:
        """``V(next_obs)``, of the reward's shape, from ``value`` = ``V(obs)`` (which a
        learner computes anyway) and ``value_fn``, called on a batch of observations
        (``[N, ...]`` per leaf): only on the stored rows of a compact trajectory (padded
        with zero observations to a power of two, at least 16, so a jitted ``value_fn``
        compiles for a few shapes), on every row of a dense one. The input
        :func:`jaxrunner.gae` takes as ``next_value``. On a compact group, a slot
        without a transition (``valid`` False) gets 0, which ``gae`` never reads."""
        lead = np.shape(self.reward)
        where = f"{type(self).__name__}.next_value"
        if np.shape(value) != lead:  # (a dense trajectory does not read it: checked anyway)
            raise InvalidArgumentError(
                f"{where}(value=...): expected V(obs), of the reward's shape {lead}, got "
                f"shape {np.shape(value)}."
            )
        store = self.next_obs_store
        if not isinstance(store, FinalObs):
            flat = jax.tree.map(lambda x: x.reshape(-1, *x.shape[len(lead) :]), self.next_obs)
            return _values(value_fn, flat, int(np.prod(lead)), where).reshape(lead)
        following = self._following_value(value)
        rows = len(store.index)
        if not rows:
            return following
        # Padded to a power of two: a jitted critic compiles for log2(T*B) shapes at most.
        bucket = min(max(16, 1 << (rows - 1).bit_length()), int(np.prod(lead)))
        padded = jax.tree.map(
            lambda x: np.concatenate([x, np.zeros((bucket - rows, *x.shape[1:]), x.dtype)]),
            jax.tree.map(np.asarray, store.obs),
        )
        stored = _values(value_fn, padded, bucket, where)[:rows]
        return following.reshape(-1).at[store.index].set(stored).reshape(lead)

    @classmethod
    def _joined(cls, parts: Sequence[Self], axis: int) -> Self:
        # Compact parts keep their stores, joined as they are.
        if not all(p.is_compact for p in parts):
            return super()._joined(parts, axis)
        stores = [p.next_obs_store for p in parts]
        joined = concatenate_leaves([p.replace(next_obs_store=None) for p in parts], axis)  # type: ignore[attr-defined]
        rows = [int(np.prod(np.shape(p.reward)[1:])) for p in parts]
        if axis == 0:
            lengths = [p.num_steps for p in parts]
            store = next_obs_store.concatenate(stores, lengths, rows[0])
        else:
            store = next_obs_store.concatenate_envs(stores, rows)
        return joined.replace(next_obs_store=store)

    def _time_slice(self, start: int, stop: int) -> Self:
        if not self.is_compact:
            return super()._time_slice(start, stop)
        start, stop, _ = slice(start, stop).indices(self.num_steps)
        if stop <= start:
            return self.dense()._time_slice(start, stop)
        store = self.next_obs_store
        rows = int(np.prod(np.shape(self.reward)[1:]))
        sliced = next_obs_store.time_slice(self.obs, store, rows, start, stop, self._turns())
        rest = self.replace(next_obs_store=None)  # type: ignore[attr-defined]
        return jax.tree.map(lambda x: x[start:stop], rest).replace(next_obs_store=sliced)


def replace_fields(self: Any, **updates: Any) -> Any:
    """A copy with the given fields replaced (``next_obs=`` replaces the store)."""
    no_next_obs = updates.keys().isdisjoint(("next_obs", "next_obs_store"))
    if "obs" in updates and no_next_obs and self.is_compact:
        self = self.dense()  # a compact next_obs is built from obs: keep the one it had
    if "next_obs" in updates:
        updates["next_obs_store"] = updates.pop("next_obs")
    return dataclasses.replace(self, **updates)


def concatenate(trajectories: Sequence[TrajectoryT]) -> TrajectoryT:
    """Joins trajectories of the same envs along time (``[T1 + T2 + ..., B]``): each a
    :class:`Trajectory` (the result compact if they all are), or each a
    :class:`MultiAgentTrajectory` of the same groups."""
    trajectories = _listed("concatenate", trajectories)
    if not all(t.is_compact for t in trajectories):
        trajectories = [t.dense() for t in trajectories]
    trajectories = type(trajectories[0])._aligned(trajectories)
    first = trajectories[0]
    structure = jax.tree.structure(first)
    for i, traj in enumerate(trajectories):
        if jax.tree.structure(traj) != structure:
            raise InvalidArgumentError(
                f"concatenate(): trajectory {i} has a different structure (observation, "
                "extras or group fields) than trajectory 0; only trajectories of the same "
                f"runner or spaces can be joined.{_structure_difference(first, traj, i)}"
            )
        if traj.num_envs != first.num_envs:
            raise InvalidArgumentError(
                f"concatenate(): trajectory {i} has {traj.num_envs} envs, trajectory 0 has "
                f"{first.num_envs}; concatenation is along time and needs equal env axes."
            )
    return type(first)._joined(trajectories, 0)


def concatenate_envs(trajectories: Sequence[TrajectoryT]) -> TrajectoryT:
    """Joins trajectories of the same ``T`` along the env axis (``[T, B1 + B2 + ...]``),
    compact where they all are."""
    trajectories = _listed("concatenate_envs", trajectories)
    return type(trajectories[0])._joined(trajectories, 1)


def _listed(name: str, trajectories: Any) -> list[Any]:
    """``trajectories`` (any iterable) as a non-empty list of trajectories, else an error."""
    if isinstance(trajectories, TimeMajor):
        raise InvalidArgumentError(
            f"{name}() takes a list of trajectories, got one {type(trajectories).__name__}: "
            f"{name}([traj_1, traj_2, ...])."
        )
    trajectories = list(trajectories)
    bad = [i for i, t in enumerate(trajectories) if not isinstance(t, TimeMajor)]
    if not trajectories or bad:
        got = (
            "none" if not trajectories else f"item {bad[0]} a {type(trajectories[bad[0]]).__name__}"
        )
        raise InvalidArgumentError(
            f"{name}() needs Trajectory (or MultiAgentTrajectory) objects, got {got}."
        )
    return trajectories


def concatenate_leaves(parts: Sequence[Any], axis: int) -> Any:
    """Pytrees of the same structure joined leaf by leaf along ``axis``."""
    return jax.tree.map(lambda *xs: np.concatenate(xs, axis=axis), *parts)


def _structure_difference(first: TimeMajor, other: TimeMajor, i: int) -> str:
    """The leaves only one of two trajectories has, for :func:`concatenate`'s error."""

    def paths(traj: TimeMajor) -> set[str]:
        return {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(traj)[0]}

    ours, theirs = paths(first), paths(other)
    only = sorted(theirs - ours)[:3], sorted(ours - theirs)[:3]
    text = (f" Only in trajectory {i}: {only[0]}." if only[0] else "") + (
        f" Only in trajectory 0: {only[1]}." if only[1] else ""
    )
    if any("infos" in path for path in (*only[0], *only[1])):
        text += (
            " With info_keys='all' a runner records an info entry from the sample where an "
            "env first reports it: list the entries in info_keys for the same set in every "
            "sample."
        )
    return text


def _values(value_fn: Callable[[Any], Any], obs: Any, count: int, where: str) -> jax.Array:
    """``value_fn(obs)`` for ``count`` observations, as ``[count]``: refused unless it
    gives one value per observation."""
    out = value_fn(obs)
    if np.size(out) != count:
        raise InvalidArgumentError(
            f"{where}(value_fn=...): returned shape {np.shape(out)} for {count} observations; "
            f"expected one value per observation, shape ({count},) or ({count}, 1)."
        )
    return jax.numpy.reshape(out, (count,))
