"""The host loop's trajectory buffers, reused once the caller releases a sample or
holds nothing of it any more."""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.core.multi_agent_trajectory import MultiAgentTrajectory
from jaxrunner._src.samplers.group_step import GroupSampler
from jaxrunner._src.samplers.info_arrays import INFOS, INFOS_PRESENT, policy_extras
from jaxrunner._src.samplers.transfer import HOST_ALIGN, aligned_start, aligned_zeros
from jaxrunner.errors import InvalidArgumentError

NOT_OUT = (
    "EnvRunner.release(traj): traj is not a trajectory this runner's sample() returned and "
    "that is still out (it may be another runner's, a slice, a copy or a replace() of one, "
    "or released already). Pass the sample() result itself, once, before the next sample()."
)
CHANGED = (
    "EnvRunner.release(traj): traj's arrays are not those sample() handed out (an extras "
    "entry replaced, an array resized or made read-only); the next sample would write into "
    "them. Release only an unmodified sample() result; this one stays yours (the runner "
    "allocates new buffers)."
)


class HandedOut:
    """Trajectories handed out and not taken back yet, each with the arrays the next
    sample would write into (as handed out, with shape and dtype) and what the owner
    keeps with it. An entry goes when its trajectory does (a weak reference)."""

    def __init__(self) -> None:
        self._out: dict[int, tuple[weakref.ref, list[tuple[np.ndarray, Any, Any]], Any]] = {}

    def add(self, traj: Any, arrays: list[Any], kept: Any = None) -> None:
        """Records ``traj`` as out, with its reused ``arrays`` and ``kept``."""
        key, out = id(traj), self._out

        def forget(ref: weakref.ref) -> None:  # the caller dropped it unreleased
            if out.get(key, (None,))[0] is ref:
                del out[key]

        out[key] = (weakref.ref(traj, forget), [(a, a.shape, a.dtype) for a in arrays], kept)

    def take_back(self, traj: Any, arrays_of: Callable[[Any], list[Any]]) -> Any:
        """``traj``'s ``kept``, once it is checked to be out (not another runner's, a
        copy, or released already) with the very arrays it was handed out with
        (``arrays_of(traj)``), unchanged and writable."""
        entry = self._out.get(id(traj))
        if entry is None or entry[0]() is not traj:
            raise InvalidArgumentError(NOT_OUT)
        arrays, handed_out = arrays_of(traj), entry[1]
        changed = len(arrays) != len(handed_out) or any(
            now is not array or now.shape != shape or now.dtype != dtype
            or not now.flags.writeable
            for now, (array, shape, dtype) in zip(arrays, handed_out)
        )  # fmt: skip
        if changed:
            raise InvalidArgumentError(CHANGED)
        del self._out[id(traj)]
        return entry[2]


def _refs(blocks: list[np.ndarray], i: int) -> int:
    return sys.getrefcount(blocks[i])


_SOLE = _refs([np.empty(0)], 0)
"""What :func:`_refs` gives for a block that only its list holds (calibrated, not assumed:
interpreters count a call's argument differently)."""


class BufferPool:
    """The host loop's :class:`MultiAgentTrajectory` buffers: new ones, or those of
    samples the caller released (``EnvRunner.release``, checked by :class:`HandedOut`:
    the next sample writes into them), or those of samples nothing holds any more,
    instead of allocating and zeroing them again. A sample's arrays are views of one
    block (their ``base``), and every array made from them (a view, a slice, a JAX array
    on the CPU that uses the memory in place) holds the block too: a block that only
    this pool holds is nobody's. ``compact``: every sample writes its dense ``next_obs``
    into a scratch, one per sample being written (``live``)."""

    def __init__(
        self,
        groups: Mapping[str, GroupSampler],
        agents: dict[str, tuple[str, ...]],
        num_steps: int,
        num_envs: int,
        compact: bool,
        live: int = 1,
    ) -> None:
        self._out = HandedOut()
        self._free: list[MultiAgentTrajectory] = []
        self._groups, self._agents = groups, agents
        self._num_steps, self._num_envs = num_steps, num_envs
        self._own_extras = {  # the extras a sample writes (not the connectors' at its end)
            pid: [*gs.extras_spec, *(() if gs.infos is None else (INFOS, INFOS_PRESENT))]
            for pid, gs in groups.items()
        }
        self._has_infos = any(gs.infos is not None for gs in groups.values())
        # A new buffer's tree and leaves' shapes and dtypes, from the first one.
        self._layout: tuple[Any, list[tuple[tuple[int, ...], np.dtype, int]], int] | None = None
        # The memory of the latest buffers made from the layout (one more than the samples
        # written at once: the last one handed out is still read as the next is written).
        self._blocks: list[np.ndarray] = []
        self._keep = live + 1
        self._scratch: dict[str, Any] | None = None
        self._scratches: list[dict[str, Any]] = []
        if compact:  # the next observations alone, not a whole trajectory; one per live sample
            self._scratches = [
                {
                    pid: space_arrays.allocate(
                        gs.group.observation_space, (num_steps, num_envs, gs.group.num_agents)
                    )
                    for pid, gs in groups.items()
                }
                for _ in range(live)
            ]
            self._scratch = self._scratches[-1]

    @property
    def compact(self) -> bool:
        return self._scratch is not None

    def take(self) -> MultiAgentTrajectory:
        """A buffer for the next sample: a released one or one nobody holds, made
        ready, or a new one."""
        if self._free:
            buf = self._refresh(self._free.pop())
        elif (unheld := self._unheld()) is not None:
            buf = self._refresh(unheld)
        else:
            buf = self._allocate()
        buf.valid.fill(True)  # type: ignore[union-attr]
        buf.env_id[...] = np.arange(self._num_envs)
        if self._scratch is None:
            return buf
        self._scratch = self._scratches.pop(0)  # the oldest one's turn
        self._scratches.append(self._scratch)
        for leaf in jax.tree.leaves(self._scratch):
            leaf.fill(0)
        groups = {
            pid: g.replace(next_obs_store=self._scratch[pid]) for pid, g in buf.groups.items()
        }
        return buf.replace(groups=groups)

    def put_back(self, buf: MultiAgentTrajectory) -> None:
        """Makes ``buf`` (taken, never handed out: a view of it was) the next sample's."""
        self._free.append(buf)

    def hand_out(self, traj: MultiAgentTrajectory) -> None:
        """Records ``traj`` (a sample's result) as out: :meth:`release` may take it back."""
        self._out.add(traj, self._reused_arrays(traj))

    def release(self, traj: MultiAgentTrajectory) -> None:
        """Makes ``traj``'s arrays the next sample's (checked by
        :meth:`HandedOut.take_back`)."""
        self._out.take_back(traj, self._reused_arrays)
        groups = {  # without the extras the connectors added at its end
            pid: g.replace(extras={k: g.extras[k] for k in self._own_extras[pid]})
            for pid, g in traj.groups.items()
        }
        self._free.append(traj.replace(groups=groups))

    def clear(self) -> None:
        """Lets go of every buffer kept for reuse (released ones, and the blocks)."""
        self._free.clear()
        self._blocks = []

    def _allocate(self) -> MultiAgentTrajectory:
        if self._layout is None:  # (the first buffer, for its layout: calloc'd, never touched)
            buf = self._first()
            if self._has_infos:  # (info arrays: their names grow as infos report them)
                return buf
            leaves, treedef = jax.tree.flatten(buf)
            specs, offset = [], 0
            for x in leaves:
                specs.append((x.shape, x.dtype, offset))
                offset += -(-x.nbytes // HOST_ALIGN) * HOST_ALIGN  # (JAX uses each in place)
            self._layout = treedef, specs, offset
        block = aligned_zeros(self._layout[2])
        self._blocks = [*self._blocks[1 - self._keep :], block]  # the oldest: the caller's
        return self._on(block)

    def _first(self) -> MultiAgentTrajectory:
        shape = (self._num_steps, self._num_envs)
        dense = self._scratch is None
        return MultiAgentTrajectory(
            groups={pid: gs.allocate(self._num_steps, dense) for pid, gs in self._groups.items()},
            env_id=np.zeros(shape, np.int64),  # (valid and env_id: filled by take())
            episode_id=np.zeros(shape, np.int64),
            step=np.zeros(shape, np.int64),
            env_done=np.zeros(shape, np.bool_),
            agents=self._agents,
            valid=np.zeros(shape, np.bool_),
        )

    def _on(self, block: np.ndarray) -> MultiAgentTrajectory:
        """A buffer of the layout whose arrays are views of ``block``."""
        assert self._layout is not None
        treedef, specs, _ = self._layout
        start = aligned_start(block)
        return treedef.unflatten(
            [np.ndarray(shape, dtype, block, start + offset) for shape, dtype, offset in specs]
        )

    def _unheld(self) -> MultiAgentTrajectory | None:
        """A buffer on one of the latest blocks that nobody holds (its sample dropped, and
        every array made from it), if any."""
        for i in range(len(self._blocks)):
            if _refs(self._blocks, i) == _SOLE:
                return self._on(self._blocks[i])
        return None

    def _refresh(self, buf: MultiAgentTrajectory) -> MultiAgentTrajectory:
        # A step writes only the acting agents' slots (a single agent's: every slot).
        for pid, group in buf.groups.items():
            infos = self._groups[pid].infos
            if not self._groups[pid].always_acting:
                mine = group.extras if infos is None else policy_extras(group.extras)
                kept = group.replace(extras=mine)
                if self._scratch is not None:  # a compact store: replaced by the scratch
                    kept = kept.replace(next_obs_store=None)
                for leaf in jax.tree.leaves(kept):
                    leaf.fill(0)
            if infos is not None:
                infos.clear(group.extras)
        return buf

    def _reused_arrays(self, traj: MultiAgentTrajectory) -> list[Any]:
        fields: list[Any] = [traj.env_id, traj.episode_id, traj.step, traj.env_done, traj.valid]
        groups = traj.groups if isinstance(traj.groups, dict) else {}
        for pid, keys in self._own_extras.items():
            g = groups.get(pid)
            if g is None:
                fields.append(None)  # a group left out: not the trajectory handed out
                continue
            extras = g.extras if isinstance(g.extras, dict) else {}
            next_obs = None if self._scratch is not None else g.next_obs_store
            fields += [g.obs, g.action, g.reward, g.terminated, g.truncated, next_obs]
            fields += [[extras.get(k) for k in keys], g.valid, g.agent_step]
        return jax.tree.leaves(fields)
