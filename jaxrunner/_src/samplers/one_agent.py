"""A single-agent env sampled by the one host loop as its one group of one agent; what
a single-agent runner sees of it: ``[T, B]`` trajectories and its own state's shape."""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from jaxrunner._src.backends.one_agent import OneAgentSteps
from jaxrunner._src.connectors.pipeline import POLICY_OBS
from jaxrunner._src.core import next_obs_store
from jaxrunner._src.core.multi_agent_trajectory import MultiAgentTrajectory
from jaxrunner._src.core.policy import Params
from jaxrunner._src.core.trajectory import Trajectory
from jaxrunner._src.samplers.buffer_pool import HandedOut
from jaxrunner._src.samplers.callbacks import Callbacks, LiveEpisode
from jaxrunner._src.samplers.host_loop import HostLoop
from jaxrunner._src.samplers.multi_agent_state import GroupState, MultiAgentSamplerState
from jaxrunner._src.samplers.sampler import SamplerSetup, StepProgress


def _one(tree: Any) -> Any:
    """``[T, B, 1, ...]`` leaves as ``[T, B, ...]`` views."""
    return jax.tree.map(lambda x: x[:, :, 0], tree)


class OneAgentSampler:
    """Samples a single-agent vector env (just reset; ``obs`` its first observations)
    through :class:`HostLoop`, as a :class:`OneAgentSteps`."""

    on_device = False  # host rollouts (see ScanSampler.on_device)

    def __init__(
        self,
        envs: Any,
        obs: Any,
        setup: SamplerSetup,
        *,
        num_splits: int | None = None,
        callbacks: Callbacks | None = None,
        runner: Any = None,
    ) -> None:
        self.envs, self.metrics = envs, setup.metrics
        steps = OneAgentSteps(envs)
        self._loop = loop = HostLoop(
            steps, steps.first_step(obs), setup, num_splits=num_splits, callbacks=callbacks,
            runner=runner,
        )  # fmt: skip
        loop.rows_view = self._view
        ((self._pid, self._group),) = loop.groups.items()
        self.splits = loop.splits
        self.groups = loop.groups  # the one agent's group sampler
        self.ready_first = loop.ready_first  # None: lockstep
        self._book = loop._book
        self._compact = setup.compact_next_obs
        self._released: dict[int, Trajectory] = {}  # [T, B] views by their reward's id
        self._out = HandedOut()  # the samples out, each with the loop's buffers it views
        self.live_episodes = loop.live_episodes  # the loop's own, as they are
        self.info_names = loop.info_names
        self.set_info_names = loop.set_info_names
        self.restart_episodes = loop.restart_episodes

    @property
    def saved_as(self) -> str:
        """The sampler a checkpoint names (those of version 4 and before were saved by
        these two, in this state's format)."""
        return "ReadyFirstSampler" if self.ready_first else "LockstepSampler"

    @property
    def block_sizes(self) -> list[int]:
        """The sizes of the blocks of envs acted on so far (each worker's envs, or each
        pipelining split)."""
        return sorted({hi - lo for lo, hi in self._group._blocks})

    def sample(self, params: Params, progress: StepProgress | None = None) -> Trajectory:
        try:
            group_traj = self._loop.sample({self._pid: params}, progress)
        except BaseException as err:
            partial = getattr(err, "partial_trajectory", None)
            if isinstance(partial, MultiAgentTrajectory):  # as a sample's, connectors' too
                err.partial_trajectory = self._finish(self._stored(partial))  # type: ignore[attr-defined]
            raise
        traj = self._finish(self._stored(group_traj))
        self._out.add(traj, self._reused(traj), group_traj)  # dropped: the loop's stay out
        return traj

    def _finish(self, traj: Trajectory) -> Trajectory:
        """The connectors' per-sample part, on ``[T, B]`` (a sample, or the steps before a
        failure), timed as sampling."""
        gs = self._group
        if gs.sample_end is not None:
            clock = time.perf_counter()
            traj, connectors = gs.sample_end(gs.state.connectors, traj)
            seen = traj.extras.get(POLICY_OBS)
            if seen is not None and not np.all(traj.valid):  # as the other extras: zero
                invalid = ~np.asarray(traj.valid)  # (a failed step, EnvPool's reset step)
                for leaf in jax.tree.leaves(seen):
                    leaf[invalid] = 0
            gs.state = gs.state.replace(connectors=connectors)  # type: ignore[union-attr]
            self.metrics.sample_time_s += time.perf_counter() - clock
        return traj

    def free_buffers(self) -> None:
        """Lets go of the buffers kept for later samples (the runner stopped)."""
        self._released.clear()
        self._loop.free_buffers()

    def release(self, traj: Trajectory) -> None:
        """Takes back ``traj`` (a sample's result the caller is done with) for reuse."""
        group_traj = self._out.take_back(traj, self._reused)
        self._released[id(group_traj.groups[self._pid].reward)] = traj  # its views, for reuse
        self._loop._pool.put_back(group_traj)  # checked above: the buffers are intact

    def get_state(self) -> dict[str, Any]:
        state = self._loop.get_state()
        group = state.groups[self._pid]
        return {
            "actor": group.actor,
            "book": state.book,
            "episode_start": group.agent_start[:, 0].copy(),
            "obs": jax.tree.map(lambda x: x[:, 0].copy(), group.obs),
        }

    def set_state(self, state: dict[str, Any], live: list[LiveEpisode] | None = None) -> None:
        gs, n = self._group, self.envs.num_envs
        group = GroupState(
            actor=state["actor"],
            running_return=np.zeros((n, 1)),
            running_length=np.zeros((n, 1), np.int64),
            awaiting=np.zeros((n, 1), np.bool_),
            pending_obs=jax.tree.map(np.zeros_like, gs.pending_obs),
            pending_action=jax.tree.map(np.zeros_like, gs.pending_action),
            pending_extras=tuple(np.zeros_like(x) for x in gs.pending_extras),
            obs=jax.tree.map(lambda x: np.asarray(x)[:, None], state["obs"]),
            acting=np.ones((n, 1), np.bool_),
            agent_start=np.asarray(state["episode_start"])[:, None],
        )
        self._loop.set_state(
            MultiAgentSamplerState(book=state["book"], groups={self._pid: group}), live
        )

    def get_connector_state(self, policy_id: str | None = None) -> Any:
        return self._loop.get_connector_state(self._pid)

    def set_connector_state(self, state: Any, policy_id: str | None = None) -> None:
        self._loop.set_connector_state(state, self._pid)

    def _view(self, traj: MultiAgentTrajectory) -> Trajectory:
        """The loop's buffers as a ``[T, B]`` trajectory (views; ``next_obs`` dense);
        a released buffer's again as the views it was handed out with."""
        group = traj.groups[self._pid]
        kept = self._released.pop(id(group.reward), None)  # (once: else it pins the memory)
        owner = group.reward if group.reward.base is None else group.reward.base  # type: ignore[union-attr]
        if kept is not None and getattr(kept.reward, "base", None) is owner:
            fresh = {"extras": _one(group.extras), "valid": traj.valid}
            if self._compact:  # the dense scratch's rows (what went out was compacted)
                fresh["next_obs_store"] = _one(group.next_obs_store)
            return kept.replace(**fresh)
        return Trajectory(
            obs=_one(group.obs),
            action=_one(group.action),
            reward=group.reward[..., 0],  # type: ignore[index]
            terminated=group.terminated[..., 0],  # type: ignore[index]
            truncated=group.truncated[..., 0],  # type: ignore[index]
            next_obs=_one(group.next_obs_store),
            extras=_one(group.extras),
            env_id=traj.env_id,
            episode_id=traj.episode_id,
            step=traj.step,
            valid=traj.valid,
        )

    def _stored(self, traj: MultiAgentTrajectory) -> Trajectory:
        """A sample as it goes out: compact where asked (the dense rows are the next
        sample's scratch)."""
        if self._loop._rows_of is traj:  # the sample's own view, its extras as they are now
            view = self._loop._rows
            if self._loop._infos is not None:  # info arrays added since it was made
                view = view.replace(extras=_one(traj.groups[self._pid].extras))
        else:
            view = self._view(traj)
        if not self._compact:
            return view
        # Where the next step acts on another observation: an episode's end, a restart or
        # reset step, and the last step (the rest is the next step's obs).
        stored = np.logical_or(view.terminated | view.truncated, ~view.valid)
        stored[-1] = True
        index = np.flatnonzero(stored)
        rows = jax.tree.map(
            lambda x: x.reshape(stored.size, *x.shape[2:])[index], view.next_obs_store
        )
        return view.replace(next_obs_store=next_obs_store.FinalObs(index=index, obs=rows))

    def _reused(self, traj: Trajectory) -> list[Any]:
        extras = traj.extras if isinstance(traj.extras, dict) else {}
        own = {k: extras.get(k) for k in self._loop._pool._own_extras[self._pid]}
        fields = [
            traj.obs, traj.action, traj.reward, traj.terminated, traj.truncated, own,
            traj.env_id, traj.episode_id, traj.step, traj.valid,
            None if self._compact else traj.next_obs_store,
        ]  # fmt: skip
        return jax.tree.leaves(fields)
