"""MultiAgentRunner: the facade over the multi-agent sampler (params per policy id,
metrics per policy and per agent, complete agent episodes)."""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from jaxrunner._src.arg_checks import check_bool
from jaxrunner._src.backends.capabilities import is_multi_agent
from jaxrunner._src.backends.jax_env import JaxVectorEnv
from jaxrunner._src.backends.multi_agent.vector_env import MultiAgentVectorEnv
from jaxrunner._src.checkpoints import checkpoint
from jaxrunner._src.checkpoints.checkpoint import RestoreReport
from jaxrunner._src.checkpoints.checkpoint_file import MAX_RESTORE_BYTES
from jaxrunner._src.connectors.per_group import (
    GroupConnectors,
    check_state_like,
    per_policy_connectors,
)
from jaxrunner._src.connectors.pipeline import Connectors, ConnectorsState
from jaxrunner._src.core.episode import AgentEpisode
from jaxrunner._src.core.metrics import MetricsConfig, RunnerMetrics
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.core.runner_state import RunnerParts, RunnerState
from jaxrunner._src.core.seeds import env_seeds
from jaxrunner._src.core.trajectory import MultiAgentTrajectory
from jaxrunner._src.runner.env_runner_checks import check_host_options
from jaxrunner._src.runner.ownership import EnvOwner, check_rollout_arguments
from jaxrunner._src.samplers.agent_callbacks import (
    STEP_HOOKS,
    AgentCallbacks,
    agent_episode_joiner,
    overrides,
)
from jaxrunner._src.samplers.multi_agent import MultiAgentSampler, MultiAgentSetup
from jaxrunner._src.samplers.scan import ScanSampler
from jaxrunner.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
)


class MultiAgentRunner(EnvOwner):
    """Samples multi-agent trajectories from a multi-agent vector env.

    Args:
        envs: a :class:`~jaxrunner.MultiAgentVectorEnv`
            (:func:`jaxrunner.make_vec` of PettingZoo envs, stepped on the host) or a
            :class:`~jaxrunner.JaxVectorEnv` (a pure-JAX env, JaxMARL-style or one group
            of one agent: one jitted scan per sample, arrays on device), owned by the
            runner until :meth:`stop`.
        policies: one :class:`~jaxrunner.Policy` for every policy id, or a dict
            ``policy_id -> Policy`` (``envs.policy_ids``).
        params: ``policy_id -> params`` (or the params alone, when there is one policy id).
        rollout_length: T, the env steps of each :meth:`sample`.
        seed: seeds the policies' keys and the envs: sub-env ``i`` is reset with
            ``jaxrunner.env_seeds(seed, num_envs)[i]``, as an ``EnvRunner``'s are (so
            runners with different seeds never share sub-env seeds).
        metrics: optional :class:`~jaxrunner.MetricsConfig`.
        connectors: optional :class:`~jaxrunner.connectors.Connectors` for every group
            (each group keeps its own state), or a dict ``policy_id -> Connectors``
            (ids left out run without); run on device inside each group's compiled
            policy step, with agent slots as rows. Initialise a group's policy on
            ``connectors.observation_space(group.observation_space)``.
        callbacks: optional :class:`~jaxrunner.multi_agent.AgentCallbacks`: per env episode
            in the sampling loop (``Callbacks``' hooks; lockstep backends), and per
            complete agent episode after each ``sample()``.
        num_splits: host envs, lockstep backends: pipelining, as for an ``EnvRunner``:
            the envs are split in this many contiguous parts, and one part's policy
            steps run while another part's envs step (process and Ray backends);
            trajectories are the same bits for any value. None: the lockstep sampler's
            rule (:func:`~jaxrunner._src.samplers.pipeline_splits.default_num_splits`: one on a CPU
            host with inline dispatch, two from 8 envs on accelerators). Ready-first
            backends and pure-JAX envs take None (or 1).
        info_keys: names of per-step info entries to record, as ``EnvRunner``'s
            ``info_keys`` (``"all"`` too), with an agent axis: float64 ``[T, B, A_g]``
            arrays in each group's ``extras["infos"][name]``, and where they were
            reported in ``extras["infos_present"][name]``. An agent's value is its own
            entry of its env's per-agent infos at the step that completed its transition
            (a parallel env: the step it acted in; an AEC env: its next turn, as
            ``env.last()`` gives it then), so it lines up with ``valid``. An AEC env's
            dead steps delete the infos of the agents they remove: those transitions have
            none. Host backends; nothing is recorded or paid without it.
    """

    def __init__(
        self,
        envs: MultiAgentVectorEnv | JaxVectorEnv,
        policies: Policy | Mapping[str, Policy],
        params: Params,
        rollout_length: int,
        seed: int,
        *,
        metrics: MetricsConfig | None = None,
        connectors: GroupConnectors | None = None,
        callbacks: AgentCallbacks | None = None,
        num_splits: int | None = None,
        info_keys: Sequence[str] | str = (),
    ) -> None:
        if not (is_multi_agent(envs) or isinstance(envs, JaxVectorEnv)):
            raise InvalidArgumentTypeError(
                f"MultiAgentRunner(envs=...): expected a multi-agent vector env or a "
                f"jaxrunner.JaxVectorEnv, got {type(envs).__name__}. Build one with "
                "jaxrunner.make_vec(env_fn, num_envs), env_fn returning a PettingZoo env."
            )
        ids = envs.policy_ids
        self._policies = _per_policy("policies", policies, ids, single=isinstance(policies, Policy))
        for pid, policy in self._policies.items():
            if not isinstance(policy, Policy):
                raise InvalidArgumentTypeError(
                    f"MultiAgentRunner(policies=...): policy {pid!r} is {policy!r}; expected a "
                    "jaxrunner.Policy."
                )
        device_params = {
            pid: jax.device_put(p) for pid, p in _params_per_policy(params, ids).items()
        }
        check_rollout_arguments("MultiAgentRunner", rollout_length, seed, num_splits, envs.num_envs)
        checked_info_keys = check_host_options(envs, info_keys, False, "MultiAgentRunner")
        if callbacks is not None and not isinstance(callbacks, AgentCallbacks):
            raise InvalidArgumentTypeError(
                f"MultiAgentRunner(callbacks=...): expected a jaxrunner.multi_agent."
                f"AgentCallbacks (subclass it), got {type(callbacks).__name__}."
            )
        self.connectors: dict[str, Connectors] = per_policy_connectors(connectors, envs.groups)
        """Policy id -> the connectors of its group (groups with connectors only)."""
        self._claim(envs)  # one live runner per vector env
        self.envs, self.rollout_length, self.seed = envs, rollout_length, seed
        self._closed = False
        agents = {g.policy_id: g.agents for g in envs.groups}
        self.state: RunnerState[AgentEpisode] = RunnerState(
            params=device_params,
            metrics=RunnerMetrics(metrics or MetricsConfig(), agents),
            episodes=agent_episode_joiner(envs.possible_agents),
            callback_episodes=agent_episode_joiner(envs.possible_agents),
        )
        """Params per policy id, metrics and agent-episode bookkeeping (a typed runner
        state, which the services read); the sampler holds the per-step rest."""
        self.callbacks = callbacks
        self._on_agent_episode_end = (
            callbacks.on_agent_episode_end  # type: ignore[union-attr]
            if overrides(callbacks, "on_agent_episode_end")
            else None
        )
        try:
            setup = MultiAgentSetup(
                self._policies,
                self.state.params,
                rollout_length,
                seed,
                self.state.metrics,
                connectors=self.connectors,
                info_keys=checked_info_keys,
            )
            self.sampler: MultiAgentSampler | ScanSampler
            if isinstance(envs, JaxVectorEnv):  # one jitted scan per sample
                if num_splits not in (None, 1):
                    raise InvalidArgumentError(
                        f"MultiAgentRunner(num_splits={num_splits!r}): a pure-JAX env is "
                        "sampled as one jitted scan; pipelining splits do not apply. Leave "
                        "num_splits=None."
                    )
                if any(overrides(callbacks, hook) for hook in STEP_HOOKS):
                    raise InvalidArgumentError(
                        "MultiAgentRunner(callbacks=...): the per-step hooks "
                        f"({', '.join(STEP_HOOKS)}) run Python per env step, which a "
                        "JaxVectorEnv rollout (one compiled lax.scan) cannot do. Override only "
                        "on_agent_episode_end, or use a host vector env (jaxrunner.make_vec)."
                    )
                self.sampler = ScanSampler(envs, setup)
            else:
                first = envs.reset_batch(env_seeds(seed, envs.num_envs))
                self.sampler = MultiAgentSampler(
                    envs,
                    first,
                    setup,
                    num_splits=num_splits,
                    callbacks=callbacks,
                    # A proxy: the sampler must not keep its runner alive (one owner per env).
                    runner=weakref.proxy(self) if callbacks is not None else None,
                )
        except BaseException:
            self._release(envs)
            raise

    def to_policy_dict(self, value: Any, where: str) -> dict[str, Any]:
        """``value`` as this runner takes it, a dict by policy id (some of the ids),
        checked (see :meth:`EnvOwner.to_policy_dict`)."""
        ids = self.policy_ids
        if not isinstance(value, Mapping) or not set(value) <= set(ids):
            got = sorted(value, key=str) if isinstance(value, Mapping) else type(value).__name__
            raise InvalidArgumentError(
                f"{where}: this runner's env is multi-agent, so it takes a dict by policy id, "
                f"keyed by some of the policy ids {list(ids)}; got {got}. Check the keys "
                "against envs.policy_ids."
            )
        return dict(value)

    def from_policy_dict(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return dict(values)

    def sample(self, progress: bool = False) -> MultiAgentTrajectory:
        """Collects ``rollout_length`` env steps of every env. Agent and env episodes
        carry on across calls; a failure raises with ``err.partial_trajectory``. Its steps
        are the caller's: the unfinished agent episodes :meth:`sample_episodes` was
        assembling lose them, so they are dropped (they are not seen whole). With
        ``progress``, a progress bar counts the env steps (as ``EnvRunner.sample``)."""
        check_bool("MultiAgentRunner.sample", "progress", progress)
        self.state.episodes.forget()
        return self._sample_with_callbacks(progress)

    def _sample_with_callbacks(self, progress: bool = False) -> MultiAgentTrajectory:
        traj = self._sample_once(progress)
        if self._on_agent_episode_end is not None:
            for episode in self.state.callback_episodes.complete(traj.split_episodes()):  # type: ignore[union-attr]
                self._on_agent_episode_end(self, episode)
        return traj

    def sample_episodes(
        self, num_episodes: int, include_faulty: bool = False, progress: bool = False
    ) -> list[AgentEpisode]:
        """Samples until ``num_episodes`` complete agent episodes (seen from their first
        transition) are available; returns them ordered by (env episode id, agent).
        Extra ones are kept for the next call. Agent episodes under way at a
        ``sample()`` and those cut by a failure of their env (``AgentEpisode.faulty``;
        kept with ``include_faulty``) are skipped, as ``EnvRunner.sample_episodes``
        skips them. With ``progress``, a progress bar counts the agent episodes."""
        check_bool("MultiAgentRunner.sample_episodes", "include_faulty", include_faulty)
        return self._sample_episodes(
            num_episodes,
            progress,
            self._sample_with_callbacks,
            lambda e: include_faulty or not e.faulty,
        )

    def save(self, path: str | os.PathLike) -> None:
        """Writes a checkpoint of the runner to ``path`` (one ``.npz`` file, numpy arrays
        and a JSON document, as ``EnvRunner.save``): the params per policy id, every
        agent slot's policy key, step count and carry, connector state, episode bookkeeping
        (env and agent episodes, turns waiting for their transition), the observations
        the next step acts on, metrics, and the agent episodes ``sample_episodes`` and
        the callbacks hold. A pure-JAX env's states are arrays of the sampler's
        state, always saved (as ``EnvRunner.save`` saves a ``JaxVectorEnv``'s); the
        sync backend (``envs.can_snapshot``) adds a pickle of each sub-env with its
        driver's state and restart seed state. Call it between samples.
        """
        self._check_usable("save")
        checkpoint.save(self._parts(), path)

    def restore(
        self,
        path: str | os.PathLike,
        *,
        load_env_pickles: bool = False,
        max_bytes: int = MAX_RESTORE_BYTES,
    ) -> RestoreReport:
        """Continues from the checkpoint at ``path`` (:meth:`save`). Call it on a new
        runner built as the saved one was (same policies, policy ids, agents and
        num_envs; new envs, on any host backend, or the same kind of pure-JAX env),
        before it samples. A pure-JAX env's states are restored with the rest: its
        episodes go on exactly.

        With ``load_env_pickles`` (unpickling runs code from the file: only for
        checkpoints you trust) and a checkpoint that holds pickled sub-envs (the sync
        backend's), the envs resume exactly: sampling, metrics, ``sample_episodes`` and
        the callbacks continue the saved run bit for bit. Otherwise every env is reset
        with ``jaxrunner.env_seeds((seed, steps_done), num_envs)`` and starts a new
        episode (the saved env and agent episodes under way are abandoned), with a
        warning; params, policy keys, episode ids and metrics are restored either way.
        ``max_bytes`` bounds what the file's arrays may take in memory once read (8 GiB
        by default).

        Returns:
            A :class:`~jaxrunner.RestoreReport`: whether the envs were restored, and how
            they were resumed.

        Raises:
            InvalidArgumentError: the file is not a checkpoint of a runner built as this
                one, or a value in it is damaged (the message names the field); the
                runner is unchanged.
        """
        self._check_usable("restore")
        parts = self._parts()
        report = checkpoint.restore(parts, path, load_env_pickles, max_bytes)
        self.seed = parts.seed
        return report

    def _parts(self) -> RunnerParts:
        """The state checkpoints save and restore."""
        sampler = self.sampler

        def restart_connectors() -> None:  # e.g. running returns restart
            for pid, connectors in self.connectors.items():
                state = connectors.restart_episodes(sampler.get_connector_state(pid))
                sampler.set_connector_state(policy_id=pid, state=state)

        return RunnerParts(
            runner="MultiAgentRunner",
            state=self.state,
            sampler=sampler,
            envs=self.envs,
            groups=self.envs.groups,
            episode_type=AgentEpisode,
            rollout_length=self.rollout_length,
            seed=self.seed,
            restart_connectors=restart_connectors,
        )

    def get_connector_state(self) -> dict[str, ConnectorsState]:
        """``policy_id -> `` the state of its group's connectors, as host copies: the
        statistics the next ``sample()`` uses (those the last one used are already
        folded in; each group's trajectory keeps what its policy saw,
        ``extras["policy_obs"]``)."""
        self._check_connectors("get_connector_state")
        return {pid: self.sampler.get_connector_state(pid) for pid in self.connectors}

    def set_connector_state(self, state: Mapping[str, ConnectorsState]) -> None:
        """Replaces the connectors' state of the policy ids in ``state`` (a dict shaped
        as :meth:`get_connector_state`'s, or part of it), e.g. the statistics of a
        training runner in an evaluation runner; never recompiles."""
        self._check_connectors("set_connector_state")
        if not isinstance(state, Mapping) or not set(state) <= set(self.connectors):
            got = sorted(state, key=str) if isinstance(state, Mapping) else type(state).__name__
            raise InvalidArgumentError(
                "MultiAgentRunner.set_connector_state(state): expected a dict keyed by policy "
                f"ids with connectors ({list(self.connectors)}), got {got}. Start from "
                "runner.get_connector_state()."
            )
        for pid, value in state.items():
            check_state_like(pid, self.sampler.get_connector_state(pid), value)
        for pid, value in state.items():
            self.sampler.set_connector_state(policy_id=pid, state=value)

    def get_metrics(self) -> dict[str, Any]:
        """Env steps and agent steps (counted apart), env episodes (returns summed
        over agents), and ``policies``/``agents``: per-policy and per-agent agent steps
        and agent-episode statistics."""
        return self.state.metrics.summary()

    def _check_connectors(self, what: str) -> None:
        if not self.connectors:
            raise InvalidArgumentError(
                f"MultiAgentRunner.{what}(): this runner has no connectors; pass "
                "MultiAgentRunner(..., connectors=jaxrunner.connectors.Connectors(...)) (or a "
                "dict policy_id -> Connectors)."
            )


def _per_policy(name: str, value: Any, ids: tuple[str, ...], *, single: bool) -> dict[str, Any]:
    if single:
        return dict.fromkeys(ids, value)
    if not isinstance(value, Mapping) or set(value) != set(ids):
        got = sorted(value) if isinstance(value, Mapping) else type(value).__name__
        raise InvalidArgumentError(
            f"MultiAgentRunner({name}=...): expected a dict keyed by the policy ids "
            f"{list(ids)}, got {got}."
        )
    return {pid: value[pid] for pid in ids}


def _params_per_policy(params: Any, ids: tuple[str, ...]) -> dict[str, Params]:
    """``policy_id -> params``: a dict keyed by policy ids must name every id and only
    those (a typo is refused here, not met later inside the trace); with one policy id,
    anything else is that policy's params."""
    if isinstance(params, Mapping) and any(key in ids for key in params):
        unknown = [key for key in params if key not in ids]
        missing = [pid for pid in ids if pid not in params]
        if unknown or missing:
            raise InvalidArgumentError(
                f"MultiAgentRunner(params=...): a dict keyed by policy ids must have exactly "
                f"the ids {list(ids)}; unknown: {unknown}, missing: {missing}. Check the keys "
                "against envs.policy_ids."
            )
        return {pid: params[pid] for pid in ids}
    if len(ids) == 1:
        return {ids[0]: params}
    got = sorted(map(str, params)) if isinstance(params, Mapping) else type(params).__name__
    raise InvalidArgumentError(
        f"MultiAgentRunner(params=...): expected a dict keyed by the policy ids {list(ids)}, "
        f"got {got}."
    )
