"""EnvRunner: the one runner facade, for single- and multi-agent envs alike; it picks the
sampler from the env's declared kind and capabilities."""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from jaxrunner._src import space_arrays
from jaxrunner._src.arg_checks import check_bool
from jaxrunner._src.backends import EnvSpec
from jaxrunner._src.backends.base import BaseVectorEnv, VectorEnv
from jaxrunner._src.backends.capabilities import is_multi_agent
from jaxrunner._src.backends.jax_env import ONE_AGENT, JaxVectorEnv
from jaxrunner._src.backends.multi_agent.vector_env import MultiAgentVectorEnv
from jaxrunner._src.backends.process import ProcessConfig
from jaxrunner._src.backends.ray import RayConfig
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.checkpoints import checkpoint
from jaxrunner._src.checkpoints.checkpoint import RestoreReport
from jaxrunner._src.checkpoints.checkpoint_file import MAX_RESTORE_BYTES
from jaxrunner._src.connectors.per_group import (
    GroupConnectors,
    check_state_like,
    per_policy_connectors,
)
from jaxrunner._src.connectors.pipeline import Connectors
from jaxrunner._src.core.agent_groups import AgentGroup
from jaxrunner._src.core.episode import AgentEpisode, Episode, concatenate_episodes
from jaxrunner._src.core.metrics import MetricsConfig, RunnerMetrics
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.core.runner_state import (
    DEFAULT_POLICY_ID,
    EpisodeJoiner,
    RunnerParts,
    RunnerState,
)
from jaxrunner._src.core.seeds import env_seeds
from jaxrunner._src.core.trajectory import MultiAgentTrajectory, Trajectory
from jaxrunner._src.runner.env_runner_checks import (
    check_arguments,
    check_connectors,
    check_host_options,
    check_multi_agent_arguments,
    check_ready_first_options,
    check_scan_agent_options,
)
from jaxrunner._src.runner.ownership import EnvOwner
from jaxrunner._src.samplers.agent_callbacks import agent_episode_joiner, overrides
from jaxrunner._src.samplers.callbacks import Callbacks
from jaxrunner._src.samplers.info_arrays import InfoKeys
from jaxrunner._src.samplers.lockstep import LockstepSampler
from jaxrunner._src.samplers.multi_agent import MultiAgentSampler, MultiAgentSetup
from jaxrunner._src.samplers.ready_first import ReadyFirstSampler
from jaxrunner._src.samplers.sampler import HostSampler, SamplerSetup
from jaxrunner._src.samplers.scan import ScanSampler, check_runner_options
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError


class EnvRunner(EnvOwner):
    """Samples trajectories from a vector env of either kind with jitted policies.

    The env declares its kind (``envs.multi_agent``): a single-agent env gives
    :class:`~jaxrunner.Trajectory` arrays ``[T, B, ...]`` (one policy, no agent axis); a
    multi-agent env (:func:`jaxrunner.make_vec` of PettingZoo envs, or a JaxMARL-style
    :class:`~jaxrunner.JaxVectorEnv`) gives a :class:`~jaxrunner.MultiAgentTrajectory`,
    its agents in policy groups, ``[T, B, A_g, ...]`` per group.

    Args:
        envs: a jaxrunner vector env (:func:`jaxrunner.make_vec`) or a
            :class:`~jaxrunner.JaxVectorEnv`. The runner owns it until :meth:`stop`:
            a second runner on the same envs is refused.
        policy: the :class:`~jaxrunner.Policy`; multi-agent: one for every policy id, or
            a dict ``policy_id -> Policy`` (``envs.policy_ids``).
        params: its params (``policy.init(...)``); multi-agent: ``policy_id -> params``
            (or the params alone, when there is one policy id).
        rollout_length: T, the steps per env of each :meth:`sample`.
        seed: seeds the policy's keys and the envs: the runner resets sub-env ``i``
            with ``jr.env_seeds(seed, num_envs)[i]`` (a block of seeds unrelated to other
            runner seeds' blocks), whatever seed the envs were reset with before (a different
            ``make_vec(..., seed=...)`` is overridden, with a warning). The same seed
            gives the same trajectories.
        callbacks: optional :class:`~jaxrunner.Callbacks` (lockstep backends only);
            multi-agent: :class:`~jaxrunner.multi_agent.AgentCallbacks`, whose per env
            episode hooks run in the sampling loop (lockstep backends) and
            ``on_agent_episode_end`` after each ``sample()``.
        metrics: optional :class:`~jaxrunner.MetricsConfig`.
        num_splits: pipelining: the envs are split in this many parts, and the
            policy computes one split's actions while another split's envs step.
            ``None`` lets the backend or the width decide (two splits on
            accelerators from 8 envs, on a CPU host with asynchronous dispatch from
            256, else one). Outputs are bitwise identical whatever the number of
            splits: each split's call computes only its own envs' rows, in fixed-size
            chunks whose results do not depend on the batch (batch invariance).
            Ready-first backends and pure-JAX envs take None (or 1).
        info_keys: names of per-step info entries to record as float64 ``[T, B]``
            arrays, in ``traj.extras["infos"][name]`` with the mask of the steps that had
            them in ``traj.extras["infos_present"][name]`` (``"episode.r"`` reaches into
            ``info["episode"]``). Host backends; nothing is recorded or paid without it.
            A name no info has had by the first episode end is refused as misspelt.
            ``"all"``: every entry any info reports, numbers only (another kind is
            refused, naming the entry); each sample has every name reported since the
            runner started, so names first reported later (e.g. ``episode.r`` at the
            first episode end) appear from that sample on. Multi-agent: ``[T, B, A_g]``
            in each group's extras, an agent's own entry of its env's per-agent infos at
            the step that completed its transition (lined up with ``valid``).
        compact_next_obs: store ``traj.next_obs`` only where it is not the next step's
            ``obs`` (episode ends, failed steps, reset steps, the last step), and build
            it from ``obs`` when it is read: half the memory of image observations,
            and ``traj.next_value(value, value_fn)`` evaluates only the stored rows.
            Single-agent host backends.
        connectors: optional :class:`~jaxrunner.connectors.Connectors` (observation
            normalization, frame stacking, reward scaling, action rescaling), run on
            device inside the compiled policy step; initialise the policy on
            ``connectors.observation_space(envs.single_observation_space)``.
            Multi-agent: one ``Connectors`` for every group (each keeps its own state) or
            a dict ``policy_id -> Connectors`` (ids left out run without), agent slots as
            rows.

    Faults: restarts of failed sub-envs are configured on the vector env
    (``make_vec(..., restart_policy=jr.RestartPolicy())``); the runner then records a
    failed step as ``valid=False`` and counts it in ``num_faulty_episodes`` and
    ``num_dropped_steps``.
    """

    def __init__(
        self,
        envs: VectorEnv | MultiAgentVectorEnv | JaxVectorEnv,
        policy: Policy | Mapping[str, Policy],
        params: Params,
        rollout_length: int,
        seed: int,
        callbacks: Callbacks | None = None,
        *,
        metrics: MetricsConfig | None = None,
        num_splits: int | None = None,
        connectors: Connectors | GroupConnectors | None = None,
        info_keys: Sequence[str] | str = (),
        compact_next_obs: bool = False,
    ) -> None:
        self.multi_agent = is_multi_agent(envs)
        """The kind the env declares: agents in policy groups (True) or one agent."""
        if self.multi_agent:
            policies, by_id = check_multi_agent_arguments(
                envs, policy, params, rollout_length, seed, callbacks, num_splits
            )
        else:
            check_arguments(envs, policy, params, rollout_length, seed, callbacks, num_splits)
            policies, by_id = {DEFAULT_POLICY_ID: policy}, {DEFAULT_POLICY_ID: params}
        self.info_keys: InfoKeys = check_host_options(
            envs, info_keys, compact_next_obs, self.multi_agent
        )
        self.compact_next_obs = compact_next_obs
        self.connectors: Any = connectors
        """As given: a ``Connectors`` or None; multi-agent: a dict by policy id of the
        groups with connectors."""
        self._connectors: dict[str, Connectors] = {}
        """Policy id -> its group's connectors (those with connectors only)."""
        if self.multi_agent:
            self._connectors = self.connectors = per_policy_connectors(connectors, envs.groups)  # type: ignore[union-attr]
        elif check_connectors(connectors) is not None:
            self._connectors = {DEFAULT_POLICY_ID: connectors}  # type: ignore[dict-item]
        self._claim(envs)
        self.envs: Any = envs
        self.policy = policy
        self._policies: dict[str, Policy] = policies  # type: ignore[assignment]
        self.rollout_length = int(rollout_length)
        self.seed = int(seed)
        self.callbacks: Any = callbacks
        self._closed = False
        self.state: RunnerState = self._new_state(by_id, metrics or MetricsConfig())
        """Params, metrics and episode bookkeeping (a typed runner state, which the
        services read); the sampler holds the per-step rest."""
        self._on_agent_episode_end = (
            callbacks.on_agent_episode_end  # type: ignore[union-attr]
            if self.multi_agent and overrides(callbacks, "on_agent_episode_end")  # type: ignore[arg-type]
            else None
        )
        try:
            self.sampler: Any = self._make_sampler(num_splits)
        except (KeyError, TypeError, AttributeError) as err:
            self._release(envs)
            if isinstance(err, InvalidArgumentTypeError):
                raise
            # Tracing the policy with params of the wrong structure fails deep in its code.
            raise InvalidArgumentError(
                f"EnvRunner(params=...): the policy could not be applied to these params "
                f"({type(err).__name__}: {err}). Pass the params the policy was initialised "
                "with: policy.init(jax.random.key(0), envs.single_observation_space)."
            ) from err
        except BaseException:
            self._release(envs)
            raise

    def _new_state(self, params: dict[str, Params], metrics: MetricsConfig) -> RunnerState:
        device_params = {pid: jax.device_put(p) for pid, p in params.items()}
        if not self.multi_agent:
            return RunnerState(
                params=device_params,
                metrics=RunnerMetrics(metrics),
                episodes=EpisodeJoiner(
                    lambda e: e.env_id, concatenate_episodes, lambda e: e.episode_id
                ),
            )
        envs = self.envs
        return RunnerState(
            params=device_params,
            metrics=RunnerMetrics(metrics, {g.policy_id: g.agents for g in envs.groups}),
            episodes=agent_episode_joiner(envs.possible_agents),
            callback_episodes=agent_episode_joiner(envs.possible_agents),
        )

    @classmethod
    def from_env(
        cls,
        env: EnvSpec,
        num_envs: int,
        policy: Policy | Mapping[str, Policy],
        params: Params,
        rollout_length: int,
        seed: int,
        callbacks: Callbacks | None = None,
        *,
        backend: str = "auto",
        config: ProcessConfig | RayConfig | None = None,
        restart_policy: RestartPolicy | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> EnvRunner:
        """A runner on envs it builds and owns (``make_vec(env, num_envs, backend,
        config=..., restart_policy=..., **env_kwargs)``; :meth:`stop` closes them).

        With ``backend="auto"`` (the default) the layout is chosen with the policy
        timed: where ``make_vec``'s env-only rule would start workers, a short trial
        runs this policy on sync and on those workers and keeps the faster (a few
        samples of each, after compiling; ``get_metrics()["auto"]`` and
        ``runner.envs.layout_choice`` report both rates and why). Where EnvPool has the
        env id (and there are no ``env_kwargs`` and no ``restart_policy``), the
        ``"envpool"`` backend is tried too. Where neither applies, nothing is tried.
        Either way the trajectories are exactly those of the chosen layout built by
        hand, with the same seed. A PettingZoo env factory is tried on sync and workers
        alike (``policy`` and ``params`` then as for a multi-agent env).

        ``options`` are :class:`EnvRunner`'s keyword options (``metrics``,
        ``num_splits``, ``connectors``, ``info_keys``, ``compact_next_obs``).
        """
        from jaxrunner._src.runner.auto_layout import make_runner

        return make_runner(
            cls, env, num_envs, policy, params, rollout_length, seed,
            backend=backend, config=config, restart_policy=restart_policy,
            env_kwargs=env_kwargs, runner_options={"callbacks": callbacks, **options},
        )  # fmt: skip

    def _make_sampler(self, num_splits: int | None) -> Any:
        """The sampler for what the env declares: scan for a pure-JAX env; for host envs,
        ready-first for ``ready_first`` backends, else lockstep (the multi-agent sampler
        runs both in one loop)."""
        envs, callbacks = self.envs, self.callbacks
        setup: SamplerSetup | MultiAgentSetup  # the kind's, as the env declares it
        if self.multi_agent:
            setup = MultiAgentSetup(
                self._policies,
                self.state.params,
                self.rollout_length,
                self.seed,
                self.state.metrics,
                connectors=self._connectors,
                info_keys=self.info_keys,
            )
        else:
            setup = SamplerSetup(
                self.policy,  # type: ignore[arg-type]
                self.get_params(),
                self.rollout_length,
                self.seed,
                self.state.metrics,
                connectors=self.connectors,
                info_keys=self.info_keys,
                compact_next_obs=self.compact_next_obs,
            )
        if isinstance(envs, JaxVectorEnv):  # one jitted scan per sample
            if isinstance(setup, MultiAgentSetup):
                check_scan_agent_options(callbacks, num_splits)
            else:
                check_runner_options(callbacks, num_splits)
            return ScanSampler(envs, setup)
        if not self.multi_agent and envs.reset_seed not in (None, self.seed):
            warnings.warn(
                f"EnvRunner(seed={self.seed}): these envs were reset with seed="
                f"{envs.reset_seed} (make_vec(..., seed=...) or reset(seed=...)); the runner "
                f"resets them again with its own seed, which decides. Give the seed in one "
                "place: EnvRunner(..., seed=...).",
                UserWarning,
                stacklevel=3,
            )
        first = envs.reset_batch(env_seeds(self.seed, envs.num_envs))
        # A proxy: the sampler must not keep its runner alive (one owner per env).
        runner = weakref.proxy(self) if callbacks is not None else None
        if isinstance(setup, MultiAgentSetup):
            return MultiAgentSampler(
                envs, first, setup, num_splits=num_splits, callbacks=callbacks, runner=runner
            )
        obs, _ = first
        sampler: HostSampler
        if envs.capabilities.ready_first:
            check_ready_first_options(envs, callbacks, num_splits)
            sampler = ReadyFirstSampler(envs, obs, setup)
        else:
            sampler = LockstepSampler(
                envs, obs, setup, num_splits=num_splits, callbacks=callbacks, runner=runner
            )
        space_arrays.check_policy_actions(
            envs.single_action_space, sampler.action_spec, envs.num_envs
        )
        return sampler

    # -- public API ---------------------------------------------------------------------------

    def sample(self, progress: bool = False) -> Any:
        """Collects ``rollout_length`` steps of every env: a :class:`Trajectory`, or a
        :class:`MultiAgentTrajectory` for a multi-agent env.

        Episodes carry on across calls. If a step fails, the exception propagates
        with ``err.partial_trajectory`` holding every step completed before it, and
        the runner refuses further sampling (its envs are in an unknown state).
        The unfinished episodes :meth:`sample_episodes` was assembling lose these steps
        to the caller and are dropped (never seen whole). With ``progress``, a progress
        bar counts the env steps (tqdm where it is installed, else a line on stderr; a
        pure-JAX env's scan fills it when it returns)."""
        check_bool("EnvRunner.sample", "progress", progress)
        self.state.episodes.forget()
        return self._sample_with_callbacks(progress)

    def _sample_with_callbacks(self, progress: bool = False) -> Any:
        traj = self._sample_once(progress)
        if self._on_agent_episode_end is not None:
            for episode in self.state.callback_episodes.complete(traj.split_episodes()):  # type: ignore[union-attr]
                self._on_agent_episode_end(self, episode)
        return traj

    def release(self, traj: Trajectory | MultiAgentTrajectory) -> None:
        """Hands back a trajectory :meth:`sample` returned that you no longer read: the
        next sample writes into its arrays instead of allocating new ones (a sample's
        memory is allocated and zeroed once, not every call). ``traj`` and any view of
        it (``time_slice``, its arrays) then change under you: copy what you keep
        first. Episodes from ``split_episodes`` are copies and stay valid.

        Raises:
            InvalidArgumentError: ``traj`` is not a result of this runner's ``sample()``
                still out (released twice, a copy, slice or ``replace()`` of one, another
                runner's), its arrays were replaced, resized or made read-only, or the
                envs are pure JAX (their trajectories live on device).
        """
        self._check_usable("release")
        if isinstance(self.sampler, ScanSampler):
            raise InvalidArgumentError(
                "EnvRunner.release(traj): a pure-JAX env's trajectories are device arrays "
                "built by its compiled scan, which allocates them itself; there is nothing to "
                "hand back."
            )
        self.sampler.release(traj)

    def sample_episodes(
        self, num_episodes: int, include_faulty: bool = False, progress: bool = False
    ) -> list[Any]:
        """Samples until ``num_episodes`` complete episodes (seen from their first
        step) are available; returns them in the order they started (multi-agent:
        :class:`AgentEpisode` s, ordered by env episode id, then agent). Episodes that
        complete beyond the count are kept for the next call, so none is lost.
        Episodes under way at a ``sample()`` (some of their steps are in its result) and
        those cut by a sub-env failure (``faulty``; kept with ``include_faulty``)
        are skipped. With ``progress``, a progress bar counts the episodes (tqdm where
        it is installed, else a line on stderr)."""
        check_bool("EnvRunner.sample_episodes", "include_faulty", include_faulty)
        return self._sample_episodes(
            num_episodes,
            progress,
            self._sample_with_callbacks,
            lambda e: include_faulty or not e.faulty,
        )

    def save(self, path: str | os.PathLike) -> None:
        """Writes a checkpoint of the runner to ``path`` (one ``.npz`` file, numpy
        arrays and a JSON document): the params (per policy id), every env's (agent
        slot's) policy key, step count and recurrent carry, connector state, episode
        bookkeeping, the latest observations, metrics, and the episodes
        ``sample_episodes`` and the callbacks hold. Pure-JAX envs' states are always in
        it; sub-envs of a backend that can snapshot them (``capabilities.can_snapshot``:
        the sync backend) are added as pickles. Call it between samples."""
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
        runner built as the saved one was (same policies, policy ids, agents, kind of
        backend, num_envs; new envs), before it samples.

        The envs resume exactly, so sampling continues the saved trajectories bit for
        bit, when they are pure JAX, or when the checkpoint holds pickled sub-envs and
        ``load_env_pickles`` is True (unpickling runs code from the file: only for
        checkpoints you trust). Otherwise every env is reset with fresh seeds and starts
        a new episode (the saved episodes under way are abandoned), with a warning;
        params, policy keys, episode ids and metrics are restored either way.

        ``max_bytes`` bounds what the file's arrays may take in memory once read (8 GiB
        by default): a file that needs more is refused before it is read.

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

    def get_connector_state(self) -> Any:
        """The connectors' state, as a host copy (multi-agent: a dict by policy id): the
        statistics the next ``sample()`` uses (those the last one used are already
        folded in; the trajectory keeps what the policy saw, ``extras["policy_obs"]``)."""
        self._check_connectors("get_connector_state")
        return self.from_policy_dict(
            {pid: self.sampler.get_connector_state(pid) for pid in self._connectors}
        )

    def set_connector_state(self, state: Any) -> None:
        """Replaces the connectors' state (e.g. statistics merged across runners, or
        those of a training runner in an evaluation runner); never recompiles. Takes a
        ``ConnectorsState`` or a dict by connector name (``connectors.state_dict``; the
        connectors it leaves out keep their state), checked by
        :meth:`~jaxrunner.connectors.Connectors.load_state`; multi-agent: a dict by
        policy id of those (some of the ids with connectors)."""
        self._check_connectors("set_connector_state")
        if self.multi_agent and (
            not isinstance(state, Mapping) or not set(state) <= set(self._connectors)
        ):
            got = sorted(state, key=str) if isinstance(state, Mapping) else type(state).__name__
            raise InvalidArgumentError(
                "EnvRunner.set_connector_state(state): expected a dict keyed by policy "
                f"ids with connectors ({list(self._connectors)}), got {got}. Start from "
                "runner.get_connector_state()."
            )
        given = self.to_policy_dict(state, "EnvRunner.set_connector_state(state)")
        sampler = self.sampler
        if self.multi_agent:
            for pid, value in given.items():
                check_state_like(pid, sampler.get_connector_state(pid), value)
        else:
            given = {
                pid: self._connectors[pid].load_state(sampler.get_connector_state(pid), value)
                for pid, value in given.items()
            }
        for pid, value in given.items():
            sampler.set_connector_state(value, pid)

    def get_metrics(self) -> dict[str, Any]:
        """Counters since construction, recent-episode statistics and perf timers, as
        of the last ``sample()`` (the episode bookkeeping is done once per sample);
        multi-agent: env steps and agent steps (counted apart), env episodes (returns
        summed over agents), and ``policies``/``agents``: per-policy and per-agent agent
        steps and agent-episode statistics. For envs built by ``make_vec(...,
        backend="auto")`` also ``auto``: the layout it chose, as numbers
        (``LayoutChoice.metrics``). An episode whose return overflows float64 (finite
        rewards, an infinite sum) counts in ``num_episodes`` but not in the window's
        statistics, with a ``RuntimeWarning``."""
        metrics = self.state.metrics.summary()
        if isinstance(self.envs, BaseVectorEnv) and self.envs.layout_choice is not None:
            metrics["auto"] = self.envs.layout_choice.metrics()
        return metrics

    def get_spaces(self) -> dict[str, Any]:
        """The single-env and batched observation and action spaces; multi-agent: each
        policy id's one-agent observation and action spaces, by policy id."""
        envs = self.envs
        if self.multi_agent:
            return {
                "observation_space": {g.policy_id: g.observation_space for g in envs.groups},
                "action_space": {g.policy_id: g.action_space for g in envs.groups},
            }
        return {
            "observation_space": envs.single_observation_space,
            "action_space": envs.single_action_space,
            "batched_observation_space": envs.observation_space,
            "batched_action_space": envs.action_space,
        }

    @property
    def num_splits(self) -> int:
        """Pipelining splits of the lockstep samplers (1 for the others)."""
        sampler = self.sampler
        if isinstance(sampler, LockstepSampler | MultiAgentSampler):
            return len(sampler.splits)
        return 1

    def to_policy_dict(self, value: Any, where: str) -> dict[str, Any]:
        """``value`` (params, connector state, statistics), given as this runner's
        methods take and return it, as a dict by policy id: a single-agent env's runner
        takes its one policy's value, a multi-agent env's a dict by policy id (some of
        the ids; checked, ``where`` named in the error). The services treat both kinds
        alike through it and :meth:`from_policy_dict`."""
        if not self.multi_agent:
            return {DEFAULT_POLICY_ID: value}
        ids = self.policy_ids
        if not isinstance(value, Mapping) or not set(value) <= set(ids):
            got = sorted(value, key=str) if isinstance(value, Mapping) else type(value).__name__
            raise InvalidArgumentError(
                f"{where}: this runner's env is multi-agent, so it takes a dict by policy id, "
                f"keyed by some of the policy ids {list(ids)}; got {got}. Check the keys "
                "against envs.policy_ids."
            )
        return dict(value)

    def from_policy_dict(self, values: Mapping[str, Any]) -> Any:
        """The inverse of :meth:`to_policy_dict`: values by policy id, as this runner's
        methods take and return them."""
        return dict(values) if self.multi_agent else values[DEFAULT_POLICY_ID]

    # -- internals ---------------------------------------------------------------------------

    def _parts(self) -> RunnerParts:
        """The state checkpoints save and restore (a single-agent env: one group of one
        agent)."""
        envs, sampler = self.envs, self.sampler
        groups = envs.groups if self.multi_agent else (
            AgentGroup(
                DEFAULT_POLICY_ID,
                (ONE_AGENT,),
                envs.single_observation_space,
                envs.single_action_space,
            ),
        )  # fmt: skip

        def restart_connectors() -> None:  # e.g. ScaleReward's running returns restart too
            for pid, connectors in self._connectors.items():
                state = connectors.restart_episodes(sampler.get_connector_state(pid))
                sampler.set_connector_state(state, pid)

        return RunnerParts(
            runner="EnvRunner",
            file_format="MultiAgentRunner" if self.multi_agent else "EnvRunner",
            state=self.state,
            sampler=sampler,
            envs=envs,
            groups=groups,
            episode_type=AgentEpisode if self.multi_agent else Episode,
            rollout_length=self.rollout_length,
            seed=self.seed,
            restart_connectors=restart_connectors,
        )

    def _check_connectors(self, what: str) -> None:
        if not self._connectors:
            raise InvalidArgumentError(
                f"EnvRunner.{what}(): this runner has no connectors; pass "
                "EnvRunner(..., connectors=jaxrunner.connectors.Connectors(...))"
                + (" (or a dict policy_id -> Connectors)." if self.multi_agent else ".")
            )

    def _sampler_params(self) -> Any:
        """The params as the sampler takes them: every policy id's (multi-agent), else
        the one policy's."""
        return self.state.params if self.multi_agent else self.get_params()


class MultiAgentRunner(EnvRunner):
    """Deprecated: :class:`EnvRunner` samples multi-agent envs too (see docs/changes.md)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        warnings.warn(
            "jaxrunner.MultiAgentRunner is deprecated: jaxrunner.EnvRunner takes multi-agent "
            "envs too, with the same arguments (policy= one Policy or a dict by policy id).",
            DeprecationWarning,
            stacklevel=2,
        )
        super().__init__(*args, **kwargs)
