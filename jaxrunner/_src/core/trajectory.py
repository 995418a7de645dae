"""Trajectories: a single-agent ``[T, B]`` :class:`Trajectory` and a multi-agent one of
per-group ``[T, B, A_g]`` arrays with masks, sharing slicing, concatenate, numpy
conversion and ``.npz`` files; each splits into its episodes."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Self, TypeVar, cast

import flax.struct
import jax
import numpy as np

from jaxrunner._src.core import next_obs_store
from jaxrunner._src.core.episode import AgentEpisode, Episode, cut_steps
from jaxrunner._src.core.next_obs_store import FinalObs, FinalObsRecorder
from jaxrunner._src.core.trajectory_file import (
    ErrorFn,
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
_VERSION = 1
MAX_LOAD_BYTES = 1 << 33
""":meth:`Trajectory.load`'s default cap on the arrays' memory (8 GiB)."""

HostOrDevice = np.ndarray | jax.Array
"""A field's arrays: numpy from host samplers, jax.Array from the on-device scan (and
inside its compiled functions)."""


class TimeMajor:
    """What every trajectory has: fields ``[T, B, ...]`` (the ``_lead`` field exactly
    ``[T, B]``), sliced and joined along time, converted to numpy, saved to ``.npz``."""

    _lead: ClassVar[str] = "reward"
    _FORMAT: ClassVar[str]

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
        """Steps ``start:stop`` of every field."""
        return jax.tree.map(lambda x: x[start:stop], self)

    def _save(
        self, path: str | os.PathLike[str], names: Sequence[str], **more: Callable[..., Any]
    ) -> None:
        """Writes the fields ``names`` to one ``.npz``, then each entry ``more[key](arrays)``
        of the spec (its arrays added to ``arrays``, after the fields')."""
        arrays: dict[str, np.ndarray] = {}
        fields = {name: encode_tree(getattr(self, name), arrays) for name in names}
        spec = {"format": self._FORMAT, "version": _VERSION, "fields": fields}
        write_file(path, spec | {key: entry(arrays) for key, entry in more.items()}, arrays)


TrajectoryT = TypeVar("TrajectoryT", bound=TimeMajor)


class Transitions(TimeMajor):
    """Trajectory fields that hold transitions (``terminated``, ``truncated``)."""

    terminated: Any
    truncated: Any

    @property
    def done(self) -> np.ndarray:
        """``terminated | truncated``: where an episode ended."""
        return np.logical_or(self.terminated, self.truncated)


class StoredNextObs(Transitions):
    """``next_obs`` as a property over the field ``next_obs_store``: the dense array, or
    a compact trajectory's :class:`FinalObs`, from which it is built on demand."""

    obs: Any
    reward: Any
    next_obs_store: Any

    def _set_fields(self, values: dict[str, Any], next_obs: Any, next_obs_store: Any) -> None:
        # next_obs (dense) is how users build one; next_obs_store is the field itself
        # (what pytree unflattening and replace() pass).
        if next_obs is not None and next_obs_store is not None:
            raise InvalidArgumentError(
                f"{type(self).__name__}(next_obs=..., next_obs_store=...): give one of "
                "them (next_obs: the dense next observations)."
            )
        values["next_obs_store"] = next_obs if next_obs_store is None else next_obs_store
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @property
    def is_compact(self) -> bool:
        return isinstance(self.next_obs_store, (FinalObs, FinalObsRecorder))

    @property
    def next_obs(self) -> Any:
        """The next observations (see the class docstring). On a compact trajectory each
        access builds a new array of ``obs``'s size; take what you need of it once, or
        use :meth:`next_value`."""
        store = self.next_obs_store
        if isinstance(store, FinalObsRecorder):  # a sample still running (callbacks)
            store = store.finish()
        if isinstance(store, FinalObs):
            return self._materialize(store)
        return store

    def _turns(self) -> np.ndarray | None:
        """A group's ``valid``, whose next valid row holds each slot's next observation
        (None: the next step's row does, as for a single-agent trajectory)."""
        return None

    def _materialize(self, store: FinalObs) -> Any:
        return next_obs_store.materialize(self.obs, store, self.num_envs, self._turns())

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
        :func:`jaxrunner.gae` takes as ``next_value``."""
        lead = np.shape(self.reward)
        store = self.next_obs_store
        if not isinstance(store, FinalObs):
            flat = jax.tree.map(lambda x: x.reshape(-1, *x.shape[len(lead) :]), self.next_obs)
            return jax.numpy.reshape(value_fn(flat), lead)
        following = self._following_value(value)
        rows = len(store.index)
        if not rows:
            return following
        # The stored rows padded to a power of two, so a jitted critic compiles for a few
        # shapes (log2 T*B at most), not for each new number of episode ends.
        bucket = min(max(16, 1 << (rows - 1).bit_length()), int(np.prod(lead)))
        padded = jax.tree.map(
            lambda x: np.concatenate([x, np.zeros((bucket - rows, *x.shape[1:]), x.dtype)]),
            jax.tree.map(np.asarray, store.obs),
        )
        stored = jax.numpy.reshape(value_fn(padded), (bucket,))[:rows]
        return following.reshape(-1).at[store.index].set(stored).reshape(lead)

    def time_slice(self, start: int, stop: int) -> Self:
        if not self.is_compact:
            return super().time_slice(start, stop)
        start, stop, _ = slice(start, stop).indices(self.num_steps)
        if stop <= start:
            return self.dense().time_slice(start, stop)
        store = self.next_obs_store
        if isinstance(store, FinalObsRecorder):  # the steps of a failed sample
            store = store.finish(stop)
        rows = int(np.prod(np.shape(self.reward)[1:]))
        sliced = next_obs_store.time_slice(self.obs, store, rows, start, stop, self._turns())
        rest = self.replace(next_obs_store=None)  # type: ignore[attr-defined]
        return jax.tree.map(lambda x: x[start:stop], rest).replace(next_obs_store=sliced)


class Trajectory(StoredNextObs, flax.struct.PyTreeNode):
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

    _FORMAT = "jaxrunner.Trajectory"

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
        if valid is None and hasattr(reward, "shape"):
            ones = np.ones if isinstance(reward, np.ndarray) else jax.numpy.ones
            valid = ones(reward.shape, np.bool_)
        values = {
            "obs": obs,
            "action": action,
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "extras": {} if extras is None else extras,
            "env_id": env_id,
            "episode_id": episode_id,
            "step": step,
            "valid": valid,
        }
        self._set_fields(values, next_obs, next_obs_store)

    def env_rows(self, name: str, steps: slice, env: int) -> Any:
        """A copy of field ``name``'s steps ``steps`` of env ``env`` (``next_obs``
        included, built from the stored rows of a compact trajectory)."""
        if name == "next_obs" and self.is_compact:
            return next_obs_store.slot_rows(
                self.obs, self.next_obs_store, self.num_envs, steps, env
            )
        return jax.tree.map(lambda x: np.array(x[steps, env]), getattr(self, name))

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
        self._save(path, _FILE_FIELDS)

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


def _replace(self: Any, **updates: Any) -> Any:
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


def concatenate(trajectories: Sequence[TrajectoryT]) -> TrajectoryT:
    """Joins trajectories of the same envs along time (``[T1 + T2 + ..., B]``): each a
    :class:`Trajectory` (the result compact if they all are), or each a
    :class:`MultiAgentTrajectory` of the same groups."""
    if not trajectories:
        raise InvalidArgumentError(
            "concatenate() needs at least one Trajectory (or MultiAgentTrajectory), got none."
        )
    if not all(t.is_compact for t in trajectories):
        trajectories = [t.dense() for t in trajectories]
    if any(getattr(t, "valid", True) is None for t in trajectories) and any(
        getattr(t, "valid", None) is not None for t in trajectories
    ):  # multi-agent: a sample without failed steps has no env-level ``valid``
        trajectories = [
            t if t.valid is not None else t.replace(valid=np.ones(t.env_id.shape, np.bool_))
            for t in cast(Sequence[MultiAgentTrajectory], trajectories)
        ]  # type: ignore[assignment]
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
    return cast(TrajectoryT, _join(trajectories, axis=0))


def concatenate_envs(trajectories: Sequence[TrajectoryT]) -> TrajectoryT:
    """Joins trajectories of the same ``T`` along the env axis (``[T, B1 + B2 + ...]``),
    compact where they all are."""
    return cast(TrajectoryT, _join(trajectories, axis=1))


def _join(trajectories: Sequence[Any], axis: int) -> Any:
    """Leaf by leaf along ``axis`` (0: time, 1: envs); the stores of compact parts are
    joined as they are, the rest made dense first."""
    first = trajectories[0]

    def leaves(parts: Sequence[Any]) -> Any:
        return jax.tree.map(lambda *xs: np.concatenate(xs, axis=axis), *parts)

    if isinstance(first, MultiAgentTrajectory):
        groups = {p: _join([t.groups[p] for t in trajectories], axis) for p in first.groups}
        return leaves([t.replace(groups={}) for t in trajectories]).replace(groups=groups)
    if not all(t.is_compact for t in trajectories):
        return leaves([t.dense() for t in trajectories])
    stores = [t.next_obs_store for t in trajectories]
    joined = leaves([t.replace(next_obs_store=None) for t in trajectories])
    rows = [int(np.prod(np.shape(t.reward)[1:])) for t in trajectories]
    if axis == 0:
        lengths = [t.num_steps for t in trajectories]
        store = next_obs_store.concatenate(stores, lengths, rows[0])
    else:
        store = next_obs_store.concatenate_envs(stores, rows)
    return joined.replace(next_obs_store=store)


def _load(cls: type[Trajectory], path: str | os.PathLike[str], max_bytes: int | None) -> Any:
    with TrajectoryFile(path, cls._FORMAT, _VERSION, max_bytes) as file:
        spec = file.read_spec()
        # valid is optional: files saved before it existed load as all valid.
        fields = file.read_fields(spec.get("fields"), _FILE_FIELDS, optional=("valid",))
    check_fields(fields, lead_shape(fields, "reward", "[T, B]", file.error), "reward's", file.error)
    return cls(**fields)


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


class GroupTrajectory(StoredNextObs, flax.struct.PyTreeNode):
    """One group's transitions, every field ``[T, B, A_g, ...]``.

    Attributes:
        obs: the observation the agent acted on.
        action: the action as sampled by the policy (Box actions unclipped).
        reward: float64, every reward the agent received for that action (in an AEC
            env: up to its next turn or the end of its episode).
        terminated: the agent's episode ended in a terminal state.
        truncated: the agent's episode was cut (or the env's episode ended while the
            agent was still in it): bootstrap from ``next_obs``.
        next_obs: the agent's next observation: at its next turn, or its final one
            where its episode ended (never a reset observation). A property: a compact
            trajectory (``EnvRunner(..., compact_next_obs=True)``) stores only the slots
            where it is not the obs at the slot's next valid row (``next_obs_store``, a
            ``FinalObs`` over the flat slots ``(t * B + b) * A_g + a``).
        extras: policy outputs of the action (``log_prob``, ``value``, ...).
        valid: bool, False where the slot holds no transition (the agent was absent,
            had left, or waited for its turn). Every other field is zero there.
        agent_step: index of the transition within the agent's episode.
    """

    obs: Any
    action: Any
    reward: HostOrDevice
    terminated: HostOrDevice
    truncated: HostOrDevice
    next_obs_store: Any
    extras: dict[str, Any]
    valid: HostOrDevice
    agent_step: HostOrDevice

    def __init__(
        self,
        obs: Any,
        action: Any,
        reward: HostOrDevice,
        terminated: HostOrDevice,
        truncated: HostOrDevice,
        next_obs: Any = None,
        extras: dict[str, Any] | None = None,
        valid: HostOrDevice | None = None,
        agent_step: HostOrDevice | None = None,
        *,
        next_obs_store: Any = None,
    ) -> None:
        values = {
            "obs": obs,
            "action": action,
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "extras": {} if extras is None else extras,
            "valid": valid,
            "agent_step": agent_step,
        }
        self._set_fields(values, next_obs, next_obs_store)

    def _turns(self) -> np.ndarray:
        return np.asarray(self.valid)


GroupTrajectory.replace = _replace  # type: ignore[method-assign]


def compact_group(group: GroupTrajectory) -> GroupTrajectory:
    """``group`` (host arrays) with ``next_obs`` stored only where it is not the obs at
    the slot's next valid row."""
    if group.is_compact:
        return group
    store = next_obs_store.compact(group.obs, group.next_obs_store, group._turns())
    return group.replace(next_obs_store=store)


class MultiAgentTrajectory(TimeMajor, flax.struct.PyTreeNode):
    """``T`` env steps of ``B`` multi-agent envs.

    Attributes:
        groups: policy id -> :class:`GroupTrajectory` (``[T, B, A_g, ...]``).
        env_id: ``[T, B]`` index of the env.
        episode_id: ``[T, B]`` the env's episode (unique per runner); an agent's
            episode is identified by this id and its agent id.
        step: ``[T, B]`` index of the env step within the env's episode.
        env_done: ``[T, B]`` bool, the env's episode ended at this step (it was reset).
        agents: policy id -> the agent ids of its group's slots (static).
        valid: ``[T, B]`` bool, False where the env's step failed (its sub-env was
            restarted): no agent has a transition there, and the agent episodes it cut
            end as faults (None: no step failed).
    """

    _lead = "env_id"
    _FORMAT = "jaxrunner.MultiAgentTrajectory"

    groups: dict[str, GroupTrajectory]
    env_id: np.ndarray
    episode_id: np.ndarray
    step: np.ndarray
    env_done: np.ndarray
    agents: dict[str, tuple[str, ...]] = flax.struct.field(pytree_node=False)
    valid: np.ndarray | None = None

    @property
    def is_compact(self) -> bool:
        return any(g.is_compact for g in self.groups.values())

    def dense(self) -> MultiAgentTrajectory:
        if not self.is_compact:
            return self
        return self.replace(groups={p: g.dense() for p, g in self.groups.items()})

    def time_slice(self, start: int, stop: int) -> MultiAgentTrajectory:
        env_level = super(MultiAgentTrajectory, self.replace(groups={})).time_slice(start, stop)
        groups = {p: g.time_slice(start, stop) for p, g in self.groups.items()}
        return env_level.replace(groups=groups)

    def env_rows(self, name: str, steps: slice, env: int) -> dict[str, Any]:
        """Policy id -> a copy of its group's field ``name`` at steps ``steps`` of env
        ``env``, ``[len, A_g, ...]`` (as ``Trajectory.env_rows``, for live episodes)."""
        return {
            pid: jax.tree.map(lambda x: np.array(x[steps, env]), getattr(group, name))
            for pid, group in self.groups.items()
        }

    def agent(self, agent_id: str) -> tuple[str, int]:
        """``(policy_id, slot)`` of ``agent_id``."""
        for policy_id, agents in self.agents.items():
            if agent_id in agents:
                return policy_id, agents.index(agent_id)
        raise InvalidArgumentError(
            f"MultiAgentTrajectory.agent({agent_id!r}): no such agent; the agents are "
            f"{[a for agents in self.agents.values() for a in agents]}."
        )

    def save(self, path: str | os.PathLike[str]) -> None:
        """Saves to one ``.npz`` file (no pickle); :meth:`load` restores it exactly.

        The spec holds the env-level fields and, per policy id, the group's agent ids
        and its fields; every array is one member of the file.
        """

        def groups(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
            return {
                pid: {
                    "agents": list(self.agents[pid]),
                    "fields": {n: encode_tree(getattr(g, n), arrays) for n in _GROUP_FIELDS},
                }
                for pid, g in self.groups.items()
            }

        self._save(path, [n for n in _ENV_FIELDS if getattr(self, n) is not None], groups=groups)

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], *, max_bytes: int | None = MAX_LOAD_BYTES
    ) -> MultiAgentTrajectory:
        """Loads a file written by :meth:`save`, trusting nothing in it: the bounded
        reader of :meth:`jaxrunner.Trajectory.load`, with its limits.

        Only the members its spec names are read (never pickle), each once and checked
        against its own header before any memory is allocated. The env-level fields
        must be ``[T, B]``; each group's ``[T, B, A_g, ...]`` with ``A_g`` its number of
        agents; flags and ``valid`` bool, ids and steps integer, rewards float;
        ``next_obs`` shaped like ``obs``; agent ids unique strings.

        Args:
            path: the file.
            max_bytes: the most bytes the arrays may take in memory (None: no cap).

        Raises:
            InvalidArgumentError: the file is not a valid multi-agent trajectory file;
                the message names the field (or member) at fault and what is wrong.
        """
        with TrajectoryFile(path, cls._FORMAT, _VERSION, max_bytes, cls.__name__) as file:
            spec = file.read_spec()
            env = file.read_fields(spec.get("fields"), _ENV_FIELDS, optional=("valid",))
            lead = lead_shape(env, "env_id", "[T, B]", file.error)
            check_fields(env, lead, "env_id's", file.error)
            agents = _agents_of(spec.get("groups"), file.error)
            groups = {}
            for pid, ids in agents.items():
                where = f"groups.{pid}."
                fields = file.read_fields(spec["groups"][pid].get("fields"), _GROUP_FIELDS, where)
                source = f"env_id's [T, B] and the group's {len(ids)} agents"
                check_fields(fields, (*lead, len(ids)), source, file.error, where)
                groups[pid] = GroupTrajectory(**fields)
        return cls(groups=groups, **env, agents=agents)

    def split_episodes(self) -> list[AgentEpisode]:
        """Per-agent episodes, env by env, agent by agent, in time order. Episodes
        still running at the end are not ``is_done``; those begun before the first
        step (``start_step > 0``) are not ``is_complete``; those a failed step of their
        env cut (``valid``) end there, ``faulty`` and ``truncated``."""
        host = self.dense().to_numpy()
        episodes = []
        failed = [
            np.zeros(0, np.int64) if host.valid is None else np.flatnonzero(~host.valid[:, b])
            for b in range(host.num_envs)
        ]
        for policy_id, group in host.groups.items():
            done = group.done
            for b, (a, agent) in itertools.product(
                range(host.num_envs), enumerate(host.agents[policy_id])
            ):
                steps = np.flatnonzero(group.valid[:, b, a])
                if steps.size == 0:
                    continue
                ends = set((np.flatnonzero(done[steps, b, a]) + 1).tolist())
                # A failed step cuts the episode of the agent's transitions before it.
                cuts = set(np.searchsorted(steps, failed[b]).tolist()) - ends - {0}
                for lo, hi in itertools.pairwise([0, *sorted(ends | cuts), steps.size]):
                    if lo < hi:
                        rows = steps[lo:hi]
                        episodes.append(_episode(host, policy_id, agent, b, a, rows, hi in cuts))
        return episodes


_ENV_FIELDS = ("env_id", "episode_id", "step", "env_done", "valid")
_GROUP_FIELDS = tuple(
    "next_obs" if n == "next_obs_store" else n for n in GroupTrajectory.__dataclass_fields__
)  # the file holds next_obs dense


def _agents_of(groups: Any, error: ErrorFn) -> dict[str, tuple[str, ...]]:
    """Policy id -> agent ids, from a spec's ``groups``: an object of objects, each
    with a non-empty list of agent ids, every id a str and in one group only."""
    if not isinstance(groups, dict):
        raise error("has no 'groups' object in its spec")
    agents: dict[str, tuple[str, ...]] = {}
    seen: set[str] = set()
    for pid, group in groups.items():
        ids = group.get("agents") if isinstance(group, dict) else None
        if not isinstance(ids, list) or not ids or not all(isinstance(a, str) for a in ids):
            raise error(
                f"has field groups.{pid}.agents {ids!r:.80}; expected a non-empty "
                "list of agent ids (str)"
            )
        counts = collections.Counter(ids)
        twice = sorted(seen.intersection(ids) | {a for a, n in counts.items() if n > 1})
        if twice:
            raise error(f"has field groups.{pid}.agents naming {twice} more than once")
        seen.update(ids)
        agents[pid] = tuple(ids)
    return agents


def _episode(
    host: MultiAgentTrajectory,
    policy_id: str,
    agent: str,
    b: int,
    a: int,
    rows: np.ndarray,
    faulty: bool = False,
) -> AgentEpisode:
    group = host.groups[policy_id]
    last = rows[-1]
    return AgentEpisode(
        **cut_steps(group, (rows, b, a), (last, b, a)),
        env_step=host.step[rows, b],
        terminated=bool(group.terminated[last, b, a]),
        truncated=faulty or bool(group.truncated[last, b, a]),
        faulty=faulty,
        agent_id=agent,
        policy_id=policy_id,
        env_id=int(host.env_id[rows[0], b]),
        episode_id=int(host.episode_id[rows[0], b]),
        start_step=int(group.agent_step[rows[0], b, a]),
    )
