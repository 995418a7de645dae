"""Trajectory ([T, B] transitions), with split into episodes, concatenate, save and load."""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import numpy as np

from jaxrunner._src.core import next_obs_store
from jaxrunner._src.core.episode import Episode, cut_steps
from jaxrunner._src.core.next_obs_store import FinalObs, FinalObsRecorder
from jaxrunner._src.core.trajectory_file import (
    TrajectoryFile,
    check_fields,
    encode_tree,
    lead_shape,
    write_file,
)
from jaxrunner.errors import InvalidArgumentError

_FILE_FIELDS = (
    "obs", "action", "reward", "terminated", "truncated", "next_obs",
    "extras", "env_id", "episode_id", "step", "valid",
)  # fmt: skip
"""The fields of a trajectory file: ``next_obs`` always dense."""
_FORMAT = "jaxrunner.Trajectory"
_VERSION = 1
MAX_LOAD_BYTES = 1 << 33
""":meth:`Trajectory.load`'s default cap on the arrays' memory (8 GiB)."""

HostOrDevice = np.ndarray | jax.Array
"""A field's arrays: numpy from host samplers, jax.Array from the on-device scan (and
inside its compiled functions)."""


class Trajectory(flax.struct.PyTreeNode):
    """``T`` steps of ``B`` envs. Every field is ``[T, B, ...]``; row ``[t, b]`` of
    every field comes from the same ``env.step`` call of env ``b``.

    Attributes:
        obs: observations acted on (pytree shaped by the observation space).
        action: actions as sampled by the policy (Box actions unclipped).
        reward: float64 rewards.
        terminated: the episode ended in a terminal state.
        truncated: the episode was cut (time limit...); bootstrap from ``next_obs``.
        next_obs: the true next observation: the final one where an episode ended,
            never the observation of the reset that followed. A property: a compact
            trajectory (``EnvRunner(..., compact_next_obs=True)``) stores only the rows
            that are not the next step's ``obs`` (``next_obs_store``, a
            :class:`FinalObs`) and builds the array on demand.
        extras: dict of policy outputs per step (``log_prob``, ``value``, ...).
        env_id: index of the env (global across workers).
        episode_id: unique per runner; the same for every step of an episode.
        step: index of the step within its episode (0 at the first).
        valid: False where the slot holds no transition: the env's step failed and
            the env was restarted (``make_vec(..., restart_policy=...)``). Such
            a slot ends its episode (``episode_id``) at the step before it, which is
            then bootstrapped like a truncation (``jr.gae`` does); its reward is 0.
            Also False at an env's own reset step, kept by EnvPool's
            ``keep_reset_steps=True``: the slot after an episode end, with ``step``
            -1 and the next episode's id, whose ``next_obs`` is that episode's first
            observation (no fault: it cuts nothing). All True when omitted.
    """

    obs: Any
    action: Any
    reward: HostOrDevice
    terminated: HostOrDevice
    truncated: HostOrDevice
    next_obs_store: Any
    """The dense ``[T, B]`` next observations, or a compact trajectory's
    :class:`FinalObs` (see ``next_obs``)."""
    extras: dict[str, Any]
    env_id: HostOrDevice
    episode_id: HostOrDevice
    step: HostOrDevice
    valid: Any = None

    def __init__(
        self,
        obs: Any,
        action: Any,
        reward: HostOrDevice,
        terminated: HostOrDevice,
        truncated: HostOrDevice,
        next_obs: Any = None,
        extras: dict[str, Any] | None = None,
        env_id: HostOrDevice | None = None,
        episode_id: HostOrDevice | None = None,
        step: HostOrDevice | None = None,
        valid: Any = None,
        *,
        next_obs_store: Any = None,
    ) -> None:
        # next_obs (dense) is how users build one; next_obs_store is the field itself
        # (what pytree unflattening and replace() pass).
        if next_obs is not None and next_obs_store is not None:
            raise InvalidArgumentError(
                "Trajectory(next_obs=..., next_obs_store=...): give one of them (next_obs: "
                "the dense [T, B] next observations)."
            )
        if valid is None and hasattr(reward, "shape"):
            ones = np.ones if isinstance(reward, np.ndarray) else jax.numpy.ones
            valid = ones(reward.shape, np.bool_)
        values = {
            "obs": obs,
            "action": action,
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "next_obs_store": next_obs if next_obs_store is None else next_obs_store,
            "extras": {} if extras is None else extras,
            "env_id": env_id,
            "episode_id": episode_id,
            "step": step,
            "valid": valid,
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @property
    def is_compact(self) -> bool:
        """Only the next observations that are not the next step's are stored."""
        return isinstance(self.next_obs_store, (FinalObs, FinalObsRecorder))

    @property
    def next_obs(self) -> Any:
        """``[T, B]`` next observations (see the class docstring). On a compact
        trajectory each access builds a new array of ``obs``'s size; take what you
        need of it once, or use :meth:`next_value`."""
        store = self.next_obs_store
        if isinstance(store, FinalObsRecorder):  # a sample still running (callbacks)
            store = store.finish()
        if isinstance(store, FinalObs):
            return next_obs_store.materialize(self.obs, store, self.num_envs)
        return store

    def env_rows(self, name: str, steps: slice, env: int) -> Any:
        """A copy of field ``name``'s steps ``steps`` of env ``env`` (``next_obs``
        included, built from the stored rows of a compact trajectory)."""
        if name == "next_obs" and self.is_compact:
            return next_obs_store.slot_rows(
                self.obs, self.next_obs_store, self.num_envs, steps, env
            )
        return jax.tree.map(lambda x: np.array(x[steps, env]), getattr(self, name))

    def dense(self) -> Trajectory:
        """This trajectory with ``next_obs`` stored in full (itself if it is)."""
        return self.replace(next_obs_store=self.next_obs) if self.is_compact else self

    def next_value(self, value: Any, value_fn: Any) -> Any:
        """``V(next_obs)`` as ``[T, B]``, from ``value`` = ``V(obs)`` (``[T, B]``, which
        a learner computes anyway) and ``value_fn``, called on a batch of observations
        (``[N, ...]`` per leaf): only on the stored rows of a compact trajectory (padded
        with zero observations to a power of two, at least 16, so a jitted ``value_fn``
        compiles for a few shapes), on every row of a dense one. The input
        :func:`jaxrunner.gae` takes as ``next_value``."""
        store = self.next_obs_store
        if not isinstance(store, FinalObs):
            flat = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), self.next_obs)
            return jax.numpy.reshape(value_fn(flat), np.shape(self.reward))
        num_steps, num_envs = np.shape(self.reward)
        shifted = jax.numpy.concatenate([value[1:], value[-1:]])
        rows = len(store.index)
        if not rows:
            return shifted
        # The stored rows padded to a power of two, so a jitted critic compiles for a few
        # shapes (log2 T*B at most), not for each new number of episode ends.
        bucket = min(max(16, 1 << (rows - 1).bit_length()), num_steps * num_envs)
        padded = jax.tree.map(
            lambda x: np.concatenate([x, np.zeros((bucket - rows, *x.shape[1:]), x.dtype)]),
            jax.tree.map(np.asarray, store.obs),
        )
        stored = jax.numpy.reshape(value_fn(padded), (bucket,))[:rows]
        return shifted.reshape(-1).at[store.index].set(stored).reshape(num_steps, num_envs)

    @property
    def num_steps(self) -> int:
        """T, the length of the time axis."""
        return int(self.reward.shape[0])

    @property
    def num_envs(self) -> int:
        """B, the length of the env axis."""
        return int(self.reward.shape[1])

    @property
    def done(self) -> np.ndarray:
        """``terminated | truncated``: where an episode ended."""
        return np.logical_or(self.terminated, self.truncated)

    def to_numpy(self) -> Trajectory:
        """The same trajectory with every leaf a numpy array (device -> host)."""
        return jax.tree.map(np.asarray, jax.device_get(self))

    def time_slice(self, start: int, stop: int) -> Trajectory:
        """Steps ``start:stop`` of every field."""
        if not self.is_compact:
            return jax.tree.map(lambda x: x[start:stop], self)
        start, stop, _ = slice(start, stop).indices(self.num_steps)
        if stop <= start:
            return self.dense().time_slice(start, stop)
        store = self.next_obs_store
        if isinstance(store, FinalObsRecorder):  # the steps of a failed sample
            store = store.finish(stop)
        sliced = next_obs_store.time_slice(self.obs, store, self.num_envs, start, stop)
        rest = self.replace(next_obs_store=None)
        return jax.tree.map(lambda x: x[start:stop], rest).replace(next_obs_store=sliced)

    def split_episodes(self) -> list[Episode]:
        """Splits into episodes, env by env, in time order.

        Episodes that end inside the trajectory are ``is_done``; the trailing ones
        still running at its end are not. An episode that began before the first
        step (continued from an earlier ``sample()``) has ``start_step > 0``;
        ``is_complete`` is true only for episodes seen from first to last step.
        """
        host = self.dense().to_numpy()
        episodes: list[Episode] = []
        if host.num_steps == 0:
            return episodes
        for b in range(host.num_envs):
            ids = host.episode_id[:, b]
            cuts = [0, *(np.flatnonzero(ids[1:] != ids[:-1]) + 1).tolist(), host.num_steps]
            for start, stop in itertools.pairwise(cuts):
                if host.step[start, b] < 0:  # an env's reset step: no transition
                    start += 1
                    if start == stop:
                        continue
                # An invalid slot can only close its episode (a restart starts a new id).
                if host.valid[stop - 1, b]:
                    episodes.append(_episode_from(host, b, start, stop))
                else:
                    episodes.append(_faulty_episode_from(host, b, start, stop - 1))
        return episodes

    def save(self, path: str | os.PathLike[str]) -> None:
        """Saves to one ``.npz`` file (no pickle); :meth:`load` restores it exactly (a
        compact trajectory is saved, and loads, dense)."""
        arrays: dict[str, np.ndarray] = {}
        fields = {n: encode_tree(getattr(self, n), arrays) for n in _FILE_FIELDS}
        write_file(path, {"format": _FORMAT, "version": _VERSION, "fields": fields}, arrays)

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], *, max_bytes: int | None = MAX_LOAD_BYTES
    ) -> Trajectory:
        """Loads a file written by :meth:`save`, trusting nothing in it.

        Only the members its spec names are read (never pickle), each checked against
        its own header before any memory is allocated; fields must have the keys,
        ``[T, B]`` leading shapes and dtype kinds a trajectory has.

        Args:
            path: the file.
            max_bytes: the most bytes the arrays may take in memory (None: no cap).

        Raises:
            InvalidArgumentError: the file is not a valid trajectory file; the message
                names the field (or member) at fault and what is wrong with it.
        """
        return _load(cls, path, max_bytes)


def _replace(self: Trajectory, **updates: Any) -> Trajectory:
    """A copy with the given fields replaced (``next_obs=`` replaces the store)."""
    if "next_obs" in updates:
        updates["next_obs_store"] = updates.pop("next_obs")
    return dataclasses.replace(self, **updates)


# After the class: flax's dataclass transform sets its own replace on the class.
Trajectory.replace = _replace  # type: ignore[method-assign]


def _episode_from(traj: Trajectory, b: int, start: int, stop: int) -> Episode:
    last = stop - 1
    return Episode(
        **cut_steps(traj, (slice(start, stop), b), (last, b)),
        terminated=bool(traj.terminated[last, b]),
        truncated=bool(traj.truncated[last, b]),
        episode_id=int(traj.episode_id[start, b]),
        env_id=int(traj.env_id[start, b]),
        start_step=int(traj.step[start, b]),
    )


def _faulty_episode_from(traj: Trajectory, b: int, start: int, failed: int) -> Episode:
    """Steps ``start:failed`` of env ``b``, cut at slot ``failed`` (its failed step).
    The last observation is ``obs[failed]``: the one after the last good step."""

    def cut(x: Any) -> Any:
        return np.array(x[start:failed, b])

    return Episode(
        obs=jax.tree.map(lambda o: np.array(o[start : failed + 1, b]), traj.obs),
        action=jax.tree.map(cut, traj.action),
        reward=cut(traj.reward),
        extras=jax.tree.map(cut, traj.extras),
        terminated=False,
        truncated=True,
        episode_id=int(traj.episode_id[failed, b]),
        env_id=int(traj.env_id[failed, b]),
        start_step=int(traj.step[start, b]),
        faulty=True,
    )


def concatenate(trajectories: Sequence[Trajectory]) -> Trajectory:
    """Joins trajectories of the same envs along time (``[T1 + T2 + ..., B]``); compact
    if they all are."""
    if not trajectories:
        raise InvalidArgumentError("concatenate() needs at least one Trajectory, got none.")
    compact = all(t.is_compact for t in trajectories)
    if not compact:
        trajectories = [t.dense() for t in trajectories]
    first = trajectories[0]
    structure = jax.tree.structure(first)
    for i, traj in enumerate(trajectories):
        if jax.tree.structure(traj) != structure:
            raise InvalidArgumentError(
                f"concatenate(): trajectory {i} has a different structure (observation or "
                "extras fields) than trajectory 0; only trajectories of the same runner or "
                f"spaces can be joined.{_structure_difference(first, traj, i)}"
            )
        if traj.num_envs != first.num_envs:
            raise InvalidArgumentError(
                f"concatenate(): trajectory {i} has {traj.num_envs} envs, trajectory 0 has "
                f"{first.num_envs}; concatenation is along time and needs equal env axes."
            )
    if not compact:
        return jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *trajectories)
    stores = [t.next_obs_store for t in trajectories]
    lengths = [t.num_steps for t in trajectories]
    rest = [t.replace(next_obs_store=None) for t in trajectories]
    joined = jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *rest)
    return joined.replace(
        next_obs_store=next_obs_store.concatenate(stores, lengths, first.num_envs)
    )


def _load(cls: type[Trajectory], path: str | os.PathLike[str], max_bytes: int | None) -> Any:
    with TrajectoryFile(path, _FORMAT, _VERSION, max_bytes) as file:
        spec = file.read_spec()
        # valid is optional: files saved before it existed load as all valid.
        fields = file.read_fields(spec.get("fields"), _FILE_FIELDS, optional=("valid",))
    check_fields(fields, lead_shape(fields, "reward", "[T, B]", file.error), "reward's", file.error)
    return cls(**fields)


def _structure_difference(first: Trajectory, other: Trajectory, i: int) -> str:
    """The leaves only one of two trajectories has, for :func:`concatenate`'s error."""

    def paths(traj: Trajectory) -> set[str]:
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
