"""The host loop: every host backend's env sampled as groups of agents (a single-agent
env is one group of one agent), one compiled policy step per group. See docs/design.md."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from time import perf_counter
from typing import Any

import jax
import numpy as np

from jaxrunner._src.backends.base import MultiAgentVectorEnv
from jaxrunner._src.backends.one_agent import OneAgentSteps
from jaxrunner._src.backends.steps import GroupBuffers, MultiAgentStep
from jaxrunner._src.connectors.pipeline import ConnectorsState
from jaxrunner._src.core.metrics import PERF_KEYS
from jaxrunner._src.core.multi_agent_trajectory import MultiAgentTrajectory, compact_group
from jaxrunner._src.core.policy import Params
from jaxrunner._src.samplers.agent_callbacks import STEP_HOOKS, AgentCallbacks, overrides
from jaxrunner._src.samplers.buffer_pool import BufferPool
from jaxrunner._src.samplers.callbacks import Callbacks, LiveEpisode
from jaxrunner._src.samplers.episode_ids import EpisodeBook
from jaxrunner._src.samplers.group_step import GroupSampler
from jaxrunner._src.samplers.info_arrays import InfoRecorder
from jaxrunner._src.samplers.live_episodes import LiveEpisodes
from jaxrunner._src.samplers.multi_agent_state import MultiAgentSamplerState
from jaxrunner._src.samplers.pipeline_splits import group_cost, pipeline_splits
from jaxrunner._src.samplers.ready_first import ReadyFirst
from jaxrunner._src.samplers.rollout import Rollout
from jaxrunner._src.samplers.sampler import SamplerSetup, StepProgress, attach_partial
from jaxrunner.errors import InvalidArgumentError


class HostLoop:
    """Samples a :class:`~jaxrunner.MultiAgentVectorEnv`, or a single-agent vector env
    seen as one group of one agent (:class:`OneAgentSteps`); ``envs`` just reset,
    ``first`` its reset result. The per-episode hooks (:data:`STEP_HOOKS`) run here on
    lockstep backends; a ready-first backend takes ``num_splits`` None or 1."""

    on_device = False  # host rollouts (see ScanSampler.on_device)
    saved_as = "MultiAgentSampler"
    """Its name in checkpoint files (their format predates the name HostLoop)."""

    def __init__(
        self,
        envs: MultiAgentVectorEnv | OneAgentSteps,
        first: MultiAgentStep,
        setup: SamplerSetup,
        *,
        num_splits: int | None = None,
        callbacks: AgentCallbacks | Callbacks | None = None,
        runner: Any = None,
    ) -> None:
        self.envs, self.rollout_length, self.metrics = envs, setup.rollout_length, setup.metrics
        num_envs = envs.num_envs
        ready_first = envs.capabilities.ready_first  # (its options checked by the runner)
        costs = {g.policy_id: group_cost(g, setup, num_envs) for g in envs.groups}
        # The blocks each sample starts with (ready-first: every env, then those answered).
        splits = [slice(0, num_envs)] if ready_first else None
        self.splits = splits or pipeline_splits(envs, num_splits, list(costs.values()))
        self._book = EpisodeBook(num_envs)
        # A single-agent env: its one group's arrays are the env-level ones.
        self._one_agent = getattr(envs, "one_agent", False)
        num_possible = len(envs.possible_agents)
        self.groups: dict[str, GroupSampler] = {}
        self._infos = None
        if setup.info_keys:  # one recorder of the names, shared by the groups
            self._infos = InfoRecorder(setup.info_keys, self._one_agent)
        offset = 0
        for group in envs.groups:
            pid = group.policy_id

            def label(row: int, agents: tuple[str, ...] = group.agents) -> str:
                if self._one_agent:
                    return f"sub-env {row}"
                return f"agent {agents[row % len(agents)]!r} of sub-env {row // len(agents)}"

            self.groups[pid] = GroupSampler(
                group, first.groups[pid], setup.policies[pid], setup.params[pid], setup.seed,
                num_envs, offset, num_possible, setup.connectors.get(pid),
                same_step=not envs.turn_based, blocks=self.splits,
                infos=None if self._infos is None else self._infos.share(label),
                one_agent=self._one_agent, chunk_rows=costs[pid].chunk_rows,
            )  # fmt: skip
            offset += group.num_agents
        self._parts = list(self.groups.items())
        # The sample's buffers as live episodes read them (a single agent's: [T, B] views).
        self.rows_view: Callable[[MultiAgentTrajectory], Any] = lambda traj: traj
        self._rows: Any = None
        self._rows_of: Any = None  # the buffers self._rows views
        self._num_envs = num_envs
        self._last = first  # the env's buffers, which every later step's rows view
        self._steps = 0  # lockstep: the steps every env has recorded in this sample
        self.agents = {g.policy_id: g.agents for g in envs.groups}
        # Envs a sample ahead (EnvPool async) write the next sample's buffers meanwhile.
        self._pool = BufferPool(
            self.groups, self.agents, self.rollout_length, num_envs, setup.compact_next_obs,
            live=2 if envs.capabilities.recv_batch_size else 1,
        )  # fmt: skip
        self._reset_steps = envs.capabilities.reset_steps
        self.ready_first: ReadyFirst | None = None
        if ready_first:  # (its chunk in envs: every group's calls hold whole chunks)
            chunk = min(max(1, c.chunk_rows // c.rows_per_env) for c in costs.values())
            self.ready_first = ReadyFirst(self, chunk)
        self._live: LiveEpisodes | None = None  # where a per-step hook is overridden
        if callbacks is not None and any(overrides(callbacks, h) for h in STEP_HOOKS):
            self._live = LiveEpisodes(
                callbacks, runner, num_envs, self._one_agent, self._reset_steps
            )
            self._live.restart(self._book.episode_id.tolist(), first.groups)

    def sample(
        self, params: dict[str, Params], progress: StepProgress | None = None
    ) -> MultiAgentTrajectory:
        """One rollout of every env; ``progress`` is told the env steps recorded."""
        ro = self._open() if self.ready_first is None else self.ready_first.rollout()
        for pid, gs in self.groups.items():
            gs.begin(ro.leaves[pid])
        self._rows, self._rows_of = self.rows_view(ro.traj), ro.traj  # what live episodes read
        perf = dict.fromkeys(PERF_KEYS, 0.0)
        start_time = perf_counter()
        self._steps = 0
        if self._live is not None:
            self._live.next_id = self._book.next_episode_id
        try:
            if self.ready_first is not None:
                self.ready_first.run(params, ro, perf, progress)
            else:
                self._run_lockstep(params, ro, perf, progress)
        except BaseException as err:
            done = self._steps_done()  # those steps as a sample's, connectors' extras too
            attach_partial(err, self._finish(self._close(ro, done)) if done else None)
            raise
        finally:
            self.metrics.sample_time_s += perf_counter() - start_time
            self.metrics.perf.record(perf, self._steps_done())
        if self._live is not None:  # the next sample writes other buffers
            self._live.detach()
        if self.ready_first is not None:
            self.ready_first.finish()
        traj = self._finish(self._close(ro, self.rollout_length))
        if self._infos is not None:  # misspelt info_keys, once an episode has ended
            ended = traj.env_done.any() or any(g.done.any() for g in traj.groups.values())
            try:
                self._infos.check(bool(ended))
            except InvalidArgumentError as err:
                attach_partial(err, traj)
                raise
        if not self._one_agent:  # (a single agent's view goes out, and comes back)
            self._pool.hand_out(traj)
        return traj

    def _run_lockstep(
        self,
        params: dict[str, Params],
        ro: Rollout,
        perf: dict[str, float],
        progress: StepProgress | None,
    ) -> None:
        """Every split steps in turn, answered in the order sent (``self._steps``: the steps
        every env has recorded). A backend that steps at ``recv`` (in this thread) gets a
        split's actions just before it steps, so each split's policy step computes while
        the others' envs step; where answers hold (``answers_held``), step t is recorded
        while step t + 1 runs (unless per-step callbacks read it)."""
        num_steps, num_envs, recv = self.rollout_length, self._num_envs, self.envs.recv
        defer = not self.envs.capabilities.steps_in_background
        late = not defer and self.envs.capabilities.answers_held and self._live is None
        last = self._last.groups
        for rows in self.splits:
            lo, hi = rows.start, rows.stop
            split_last = last if hi - lo == num_envs else {p: b.rows(rows) for p, b in last.items()}
            self._dispatch(params, lo, hi, split_last, perf)
            if not defer:
                self._send(lo, hi, perf, 0)
        bounds = [(rows.start, rows.stop) for rows in self.splits]
        for t in range(num_steps):
            for lo, hi in bounds:
                if defer:
                    self._send(lo, hi, perf, t)
                clock = perf_counter()
                out = recv()
                perf["env_wait_ms"] += perf_counter() - clock
                try:
                    if ahead := late and t + 1 < num_steps:
                        self._dispatch(params, lo, hi, out.groups, perf)
                        self._send(lo, hi, perf, t + 1)
                finally:  # (step t is kept, whatever the policy or the send raised)
                    self._record(ro, lo, hi, out, perf, t)
                    if hi == num_envs:  # every env has recorded step t
                        self._steps = t + 1
                if t + 1 < num_steps and not ahead:
                    self._dispatch(params, lo, hi, out.groups, perf)
                    if not defer:
                        self._send(lo, hi, perf, t + 1)
                if progress is not None:
                    progress(t * num_envs + hi)

    def _steps_done(self) -> int:
        return self._steps if self.ready_first is None else self.ready_first.steps_done()

    def _dispatch(
        self,
        params: dict[str, Params],
        lo: int,
        hi: int,
        last: Mapping[str, GroupBuffers],
        perf: dict[str, float],
    ) -> None:
        """Queues block ``[lo, hi)``'s policy steps from its last step ``last`` (every
        group's queued before any is waited for)."""
        clock = perf_counter()
        for pid, gs in self._parts:
            gs.dispatch(params[pid], last[pid], lo, hi)
        perf["inference_ms"] += perf_counter() - clock

    def _send(self, lo: int, hi: int, perf: dict[str, float], t: int) -> None:
        """Takes block ``[lo, hi)``'s queued actions for its step ``t``, sends, records them."""
        clock = perf_counter()
        actions, passed = [], True  # (a loop: a comprehension's frame costs more per step)
        for _, gs in self._parts:
            action, ok = gs.collect(t, lo, hi)
            actions.append(action)
            passed = passed and ok
        tick = perf_counter()
        perf["inference_ms"] += tick - clock  # the wait for the policy's result
        send = self.envs.send_checked if passed else self.envs.send
        send(actions, None if hi - lo == self._num_envs else slice(lo, hi))
        clock = perf_counter()
        perf["env_wait_ms"] += clock - tick
        for _, gs in self._parts:  # a background backend steps meanwhile
            gs.record_actions()
        perf["action_processing_ms"] += perf_counter() - clock

    def _record(
        self,
        ro: Rollout,
        lo: int,
        hi: int,
        out: MultiAgentStep,
        perf: dict[str, float],
        t: int,
    ) -> None:
        """Writes block ``[lo, hi)``'s step ``t`` into its envs' slot ``t``."""
        clock = perf_counter()
        traj = ro.traj
        for pid, gs in self._parts:
            gs.record(out.groups[pid], traj.groups[pid], lo, hi, t)
            if gs.infos is not None:
                envs = np.arange(lo, hi)
                gs.record_infos(traj.groups[pid], out.groups[pid].completed, out.infos, t, envs)
        if not self._one_agent:  # else the group's arrays, just written
            index, env_level = (t, slice(lo, hi)), ro.level
            env_level.reward[index] = out.env_reward
            env_level.terminated[index] = out.env_done
            ro.unassigned[index] = out.unassigned_reward  # type: ignore[index]
        if out.failed is not None or out.reset_rows is not None:
            self._faults(ro, out, t, slice(lo, hi), slice(None))
        if self._live is not None:
            if self._infos is not None and len(self._infos.keys) != self._live.num_info_keys:
                self._rows = self.rows_view(ro.traj)  # with the entries first reported now
                self._live.num_info_keys = len(self._infos.keys)
            self._live.step(lo, hi, t, out, self._rows)
        perf["obs_processing_ms"] += perf_counter() - clock

    def _faults(self, ro: Rollout, out: MultiAgentStep, t: Any, envs: Any, sel: Any) -> None:
        """Rows ``sel`` of ``out`` (envs ``envs``, at their steps ``t``; lockstep: a slice,
        no fancy index) where it failed or where it holds the env's reset steps."""
        index = (t, envs)
        if out.failed is not None:  # faults: their episodes end, their actions are dropped
            failed = out.failed[sel]
            ro.level.valid[index] = ~failed
            if not self._one_agent:  # (a single agent's slot keeps what it acted on)
                rows = np.arange(envs.start, envs.stop) if isinstance(envs, slice) else envs
                self.metrics.num_dropped_agent_steps += sum(
                    gs.drop(failed, (ro.leaves[pid], t, rows, sel)) for pid, gs in self._parts
                )
        if out.reset_rows is not None:  # the env's reset steps: no transition, no fault
            reset = out.reset_rows[sel]
            ro.level.valid[index] &= ~reset
            ro.resets[index] = reset  # type: ignore[index]

    def _finish(self, traj: MultiAgentTrajectory) -> MultiAgentTrajectory:
        """The groups' connectors' per-sample part (statistics, scaled rewards, what the
        policy would see of each next_obs) on a sample or a failed one's steps, timed."""
        if self._one_agent:  # its view's, on [T, B] (OneAgentSampler._finish)
            return traj
        clock = perf_counter()
        groups = dict(traj.groups)
        cut = None if traj.valid is None else ~traj.valid  # failed steps: episodes cut
        for pid, gs in self.groups.items():
            if gs.sample_end is not None:
                groups[pid], connectors = gs.sample_end(gs.state.connectors, groups[pid], cut)
                gs.state = gs.state.replace(connectors=connectors)
        self.metrics.sample_time_s += perf_counter() - clock
        return traj.replace(groups=groups)

    def free_buffers(self) -> None:  # (the runner stopped: the last sample's views too)
        self._pool.clear()
        self._rows = self._rows_of = None
        for gs in self.groups.values():
            gs.begin([])
        if self.ready_first is not None:  # (the next sample's rollout, begun early)
            self.ready_first.bufs.clear()

    def release(self, traj: MultiAgentTrajectory) -> None:
        """Takes back ``traj`` (a sample's result the caller is done with) for reuse."""
        self._pool.release(traj)

    def get_state(self) -> MultiAgentSamplerState:
        """What the sampler carries from one ``sample()`` to the next (copies; valid
        between samples): see :class:`MultiAgentSamplerState`."""
        last = self._last.groups
        return MultiAgentSamplerState(
            book=self._book.get_state(),
            groups={pid: gs.get_state(last[pid]) for pid, gs in self.groups.items()},
        )

    def set_state(
        self, state: MultiAgentSamplerState, live: list[LiveEpisode] | None = None
    ) -> None:
        """Takes ``state`` (a :meth:`get_state`, checked by the caller): sampling goes on
        exactly where it was taken if the envs are in their saved state too; ``live``: the
        callbacks' live episodes (None: they restart)."""
        if self.ready_first is not None:
            self.ready_first.check_not_ahead()
        self._book.set_state(state.book)
        for pid, gs in self.groups.items():
            gs.set_state(state.groups[pid], self._last.groups[pid])
        if self._live is not None and live is not None:
            self._live.episodes = list(live)
        elif self._live is not None:
            self._live.restart(self._book.episode_id.tolist(), self._last.groups)

    def live_episodes(self) -> list[LiveEpisode]:
        """The per-step callbacks' episodes under way, one per env (none without)."""
        return [] if self._live is None else list(self._live.episodes)

    def info_names(self) -> dict[str, Any] | None:
        """The ``info_keys`` recorder's names (None without): kept in a checkpoint."""
        return None if self._infos is None else self._infos.get_state()

    def set_info_names(self, names: dict[str, Any]) -> None:
        """Takes an :meth:`info_names` of a runner built as this one."""
        if self._infos is not None:
            self._infos.set_state(names)

    def restart_episodes(self, seeds: list[int]) -> None:
        """After :meth:`set_state` where the envs could not be restored: resets sub-env
        ``i`` with ``seeds[i]``; new env and agent episodes start (the next free ids, in env
        order; carries restart), those under way are abandoned, uncounted."""
        self._last = self.envs.reset_batch(seeds)
        if self.ready_first is not None:
            self.ready_first.restart()
        self._book.restart()
        for gs in self.groups.values():
            gs.restart_episodes()
        if self._live is not None:
            self._live.restart(self._book.episode_id.tolist(), self._last.groups)

    def get_connector_state(self, policy_id: str) -> ConnectorsState:
        """A host copy of the state of ``policy_id``'s connectors (as every sampler's)."""
        gs = self.groups[policy_id]
        return gs.packing.to_host(gs.state.connectors)  # type: ignore[union-attr]

    def set_connector_state(self, state: ConnectorsState, policy_id: str) -> None:
        """Replaces the state of ``policy_id``'s connectors; never recompiles."""
        gs = self.groups[policy_id]
        gs.state = gs.state.replace(connectors=gs.packing.to_device(state))  # type: ignore[union-attr]

    def _open(self) -> Rollout:
        """A sample's buffers: the pool's next, and their env-level arrays."""
        return Rollout.of(self._pool.take(), self.groups, self._one_agent, self._reset_steps)

    def _close(self, ro: Rollout, t: int) -> MultiAgentTrajectory:
        traj, env_level = ro.traj, ro.level
        self.metrics.add(self._book.close(env_level, t, ro.resets))  # type: ignore[arg-type]
        if not self._one_agent:  # (a single agent's reward is all assigned)
            self.metrics.unassigned_reward += float(ro.unassigned[:t].sum())  # type: ignore[index]
        valid = env_level.valid[:t]
        aborted = None if valid.all() else ~valid
        for pid, gs in self.groups.items():
            group = traj.groups[pid]
            if not self._one_agent:  # the env's episodes are its agent's
                steps = np.count_nonzero(group.valid[:t], axis=(0, 1))
                self.metrics.add_group_counts(pid, steps, gs.close(group, t, aborted))
            if gs.infos is not None:  # every name reported so far, in every group
                gs.infos.complete(group.extras)
        if t < self.rollout_length:
            traj = jax.tree.map(lambda x: x[:t], traj)
        # The scratch is the next sample's: only copies go out (a single agent's: its view's).
        if self._pool.compact and not self._one_agent:
            traj = traj.replace(groups={p: compact_group(g) for p, g in traj.groups.items()})
        return traj
