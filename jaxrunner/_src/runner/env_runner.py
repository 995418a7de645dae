"""EnvRunner: the facade over the samplers, picking one from the backend's declared
capabilities."""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import jax
from gymnasium import spaces

from jaxrunner._src import space_arrays
from jaxrunner._src.arg_checks import check_bool
from jaxrunner._src.backends import EnvSpec
from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.jax_env import ONE_AGENT, JaxVectorEnv
from jaxrunner._src.backends.process import ProcessConfig
from jaxrunner._src.backends.ray import RayConfig
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.checkpoints import checkpoint
from jaxrunner._src.checkpoints.checkpoint import RestoreReport
from jaxrunner._src.checkpoints.checkpoint_file import MAX_RESTORE_BYTES
from jaxrunner._src.connectors.base import ConnectorState
from jaxrunner._src.connectors.pipeline import Connectors, ConnectorsState
from jaxrunner._src.core.agent_groups import AgentGroup
from jaxrunner._src.core.episode import Episode, concatenate_episodes
from jaxrunner._src.core.metrics import MetricsConfig, RunnerMetrics
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.core.runner_state import (
    DEFAULT_POLICY_ID,
    EpisodeJoiner,
    RunnerParts,
    RunnerState,
)
from jaxrunner._src.core.seeds import env_seeds
from jaxrunner._src.core.trajectory import Trajectory
from jaxrunner._src.runner.env_runner_checks import (
    check_arguments,
    check_connectors,
    check_host_options,
    check_ready_first_options,
)
from jaxrunner._src.runner.ownership import EnvOwner
from jaxrunner._src.samplers.callbacks import Callbacks
from jaxrunner._src.samplers.info_arrays import InfoKeys
from jaxrunner._src.samplers.lockstep import LockstepSampler
from jaxrunner._src.samplers.ready_first import ReadyFirstSampler
from jaxrunner._src.samplers.sampler import HostSampler, Sampler, SamplerSetup
from jaxrunner._src.samplers.scan import ScanSampler, check_runner_options
from jaxrunner.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
)


class EnvRunner(EnvOwner):
    """Samples trajectories from a vector env with a jitted policy.

    Args:
        envs: a jaxrunner vector env (:func:`jaxrunner.make_vec`) or a
            :class:`~jaxrunner.JaxVectorEnv`. The runner owns it until :meth:`stop`:
            a second runner on the same envs is refused.
        policy: the :class:`~jaxrunner.Policy`.
        params: its params (``policy.init(...)``).
        rollout_length: T, the steps per env of each :meth:`sample`.
        seed: seeds the policy's keys and the envs: the runner resets sub-env ``i``
            with ``jr.env_seeds(seed, num_envs)[i]`` (a block of seeds unrelated to other
            runner seeds' blocks), whatever seed the envs were reset with before (a different
            ``make_vec(..., seed=...)`` is overridden, with a warning). The same seed
            gives the same trajectories.
        callbacks: optional :class:`~jaxrunner.Callbacks` (lockstep backends only).
        metrics: optional :class:`~jaxrunner.MetricsConfig`.
        num_splits: pipelining: the envs are split in this many parts, and the
            policy computes one split's actions while another split's envs step.
            ``None`` lets the backend or the width decide (two splits on
            accelerators from 8 envs, on a CPU host with asynchronous dispatch from
            256, else one). Outputs are bitwise identical whatever the number of
            splits: each split's call computes only its own envs' rows, in fixed-size
            chunks whose results do not depend on the batch (batch invariance).
        info_keys: names of per-step info entries to record as float64 ``[T, B]``
            arrays, in ``traj.extras["infos"][name]`` with the mask of the steps that had
            them in ``traj.extras["infos_present"][name]`` (``"episode.r"`` reaches into
            ``info["episode"]``). Host backends; nothing is recorded or paid without it.
            A name no info has had by the first episode end is refused as misspelt.
            ``"all"``: every entry any info reports, numbers only (another kind is
            refused, naming the entry); each sample has every name reported since the
            runner started, so names first reported later (e.g. ``episode.r`` at the
            first episode end) appear from that sample on.
        compact_next_obs: store ``traj.next_obs`` only where it is not the next step's
            ``obs`` (episode ends, failed steps, reset steps, the last step), and build
            it from ``obs`` when it is read: half the memory of image observations,
            and ``traj.next_value(value, value_fn)`` evaluates only the stored rows.
            Host backends.
        connectors: optional :class:`~jaxrunner.connectors.Connectors` (observation
            normalization, frame stacking, reward scaling, action rescaling), run on
            device inside the compiled policy step; initialise the policy on
            ``connectors.observation_space(envs.single_observation_space)``.

    Faults: restarts of failed sub-envs are configured on the vector env
    (``make_vec(..., restart_policy=jr.RestartPolicy())``); the runner then records a
    failed step as ``valid=False`` and counts it in ``num_faulty_episodes`` and
    ``num_dropped_steps``.
    """

    def __init__(
        self,
        envs: VectorEnv | JaxVectorEnv,
        policy: Policy,
        params: Params,
        rollout_length: int,
        seed: int,
        callbacks: Callbacks | None = None,
        *,
        metrics: MetricsConfig | None = None,
        num_splits: int | None = None,
        connectors: Connectors | None = None,
        info_keys: Sequence[str] | str = (),
        compact_next_obs: bool = False,
    ) -> None:
        check_arguments(envs, policy, params, rollout_length, seed, callbacks, num_splits)
        checked_info_keys = check_host_options(envs, info_keys, compact_next_obs)
        self.compact_next_obs = compact_next_obs
        self._claim(envs)
        self.envs = envs
        self.info_keys: InfoKeys = checked_info_keys
        self.policy = policy
        self.rollout_length = int(rollout_length)
        self.seed = int(seed)
        self.callbacks = callbacks
        self.connectors = check_connectors(connectors)
        self._closed = False
        self.state: RunnerState[Episode] = RunnerState(
            params={DEFAULT_POLICY_ID: jax.device_put(params)},
            metrics=RunnerMetrics(metrics or MetricsConfig()),
            episodes=EpisodeJoiner(
                lambda e: e.env_id, concatenate_episodes, lambda e: e.episode_id
            ),
        )
        """Params, metrics and episode bookkeeping (a typed runner state, which the
        services read); the sampler holds the per-step rest."""
        try:
            self.sampler = self._make_sampler(num_splits)
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

    @classmethod
    def from_env(
        cls,
        env: EnvSpec,
        num_envs: int,
        policy: Policy,
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
        hand, with the same seed.

        ``options`` are :class:`EnvRunner`'s keyword options (``metrics``,
        ``num_splits``, ``connectors``, ``info_keys``, ``compact_next_obs``).
        """
        from jaxrunner._src.runner.auto_layout import make_runner

        return make_runner(
            cls, env, num_envs, policy, params, rollout_length, seed,
            backend=backend, config=config, restart_policy=restart_policy,
            env_kwargs=env_kwargs, runner_options={"callbacks": callbacks, **options},
        )  # fmt: skip

    def _make_sampler(self, num_splits: int | None) -> Sampler:
        """The sampler for what the backend declares (scan for a pure-JAX env, ready-first
        for ``ready_first`` backends, else lockstep)."""
        envs = self.envs
        setup = SamplerSetup(
            self.policy,
            self.get_params(),
            self.rollout_length,
            self.seed,
            self.state.metrics,
            connectors=self.connectors,
            info_keys=self.info_keys,
            compact_next_obs=self.compact_next_obs,
        )
        if isinstance(envs, JaxVectorEnv):
            check_runner_options(self.callbacks, num_splits)
            return ScanSampler(envs, setup)
        if envs.reset_seed is not None and envs.reset_seed != self.seed:
            warnings.warn(
                f"EnvRunner(seed={self.seed}): these envs were reset with seed="
                f"{envs.reset_seed} (make_vec(..., seed=...) or reset(seed=...)); the runner "
                f"resets them again with its own seed, which decides. Give the seed in one "
                "place: EnvRunner(..., seed=...).",
                UserWarning,
                stacklevel=3,
            )
        obs, _ = envs.reset_batch(env_seeds(self.seed, envs.num_envs))
        sampler: Sampler
        if envs.capabilities.ready_first:
            check_ready_first_options(envs, self.callbacks, num_splits)
            sampler = ReadyFirstSampler(envs, obs, setup)
        else:
            sampler = LockstepSampler(
                envs,
                obs,
                setup,
                num_splits=num_splits,
                callbacks=self.callbacks,
                # A proxy: the sampler must not keep its runner alive (one owner per env).
                runner=weakref.proxy(self) if self.callbacks is not None else None,
            )
        space_arrays.check_policy_actions(
            envs.single_action_space, sampler.action_spec, envs.num_envs
        )
        return sampler

    # -- public API ---------------------------------------------------------------------------

    def sample(self, progress: bool = False) -> Trajectory:
        """Collects ``rollout_length`` steps of every env.

        Episodes carry on across calls. If a step fails, the exception propagates
        with ``err.partial_trajectory`` holding every step completed before it, and
        the runner refuses further sampling (its envs are in an unknown state).
        The unfinished episodes :meth:`sample_episodes` was assembling lose these steps
        to the caller and are dropped (never seen whole). With ``progress``, a progress
        bar counts the env steps (tqdm where it is installed, else a line on stderr; a
        pure-JAX env's scan fills it when it returns)."""
        check_bool("EnvRunner.sample", "progress", progress)
        self.state.episodes.forget()
        return self._sample_once(progress)

    def release(self, traj: Trajectory) -> None:
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
        if not isinstance(self.sampler, HostSampler):
            raise InvalidArgumentError(
                "EnvRunner.release(traj): a pure-JAX env's trajectories are device arrays "
                "built by its compiled scan, which allocates them itself; there is nothing to "
                "hand back."
            )
        self.sampler.release(traj)

    def sample_episodes(
        self, num_episodes: int, include_faulty: bool = False, progress: bool = False
    ) -> list[Episode]:
        """Samples until ``num_episodes`` complete episodes (seen from their first
        step) are available; returns them in the order they started. Episodes that
        complete beyond the count are kept for the next call, so none is lost.
        Episodes under way at a ``sample()`` (some of their steps are in its result) and
        those cut by a sub-env failure (``Episode.faulty``; kept with ``include_faulty``)
        are skipped. With ``progress``, a progress bar counts the episodes (tqdm where
        it is installed, else a line on stderr)."""
        check_bool("EnvRunner.sample_episodes", "include_faulty", include_faulty)
        return self._sample_episodes(
            num_episodes, progress, self._sample_once, lambda e: include_faulty or not e.faulty
        )

    def save(self, path: str | os.PathLike) -> None:
        """Writes a checkpoint of the runner to ``path`` (one ``.npz`` file, numpy
        arrays and a JSON document): the
        params, every env's policy key and step count, recurrent carries, episode
        bookkeeping, the latest observations, metrics, and the episodes
        ``sample_episodes`` holds. Pure-JAX envs' states are always in it; sub-envs of
        a backend that can snapshot them (``capabilities.can_snapshot``: the sync
        backend) are added as pickles. Call it between samples."""
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
        runner built as the saved one was (same policy, kind of backend, num_envs;
        new envs), before it samples.

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
        """
        self._check_usable("restore")
        parts = self._parts()
        report = checkpoint.restore(parts, path, load_env_pickles, max_bytes)
        self.seed = parts.seed
        return report

    def get_connector_state(self) -> ConnectorsState:
        """The connectors' state, as a host copy: the statistics the next ``sample()``
        uses (those the last one used are already folded in; its Trajectory keeps what
        the policy saw, ``extras["policy_obs"]``)."""
        self._check_connectors("get_connector_state")
        return self.sampler.get_connector_state()  # type: ignore[attr-defined]

    def set_connector_state(self, state: ConnectorsState | Mapping[str, ConnectorState]) -> None:
        """Replaces the connectors' state (e.g. statistics merged across runners, or
        those of a training runner in an evaluation runner); never recompiles. Takes a
        ``ConnectorsState`` or a dict by connector name (``connectors.state_dict``; the
        connectors it leaves out keep their state); checked by
        :meth:`~jaxrunner.connectors.Connectors.load_state`."""
        self._check_connectors("set_connector_state")
        current = self.sampler.get_connector_state()  # type: ignore[attr-defined]
        state = self.connectors.load_state(current, state)  # type: ignore[union-attr]
        self.sampler.set_connector_state(state)  # type: ignore[attr-defined]

    def get_metrics(self) -> dict[str, Any]:
        """Counters since construction, recent-episode statistics and perf timers, as
        of the last ``sample()`` (the episode bookkeeping is done once per sample);
        for envs built by ``make_vec(..., backend="auto")`` also ``auto``: the layout
        it chose, as numbers (``LayoutChoice.metrics``). An episode whose return
        overflows float64 (finite rewards, an infinite sum) counts in ``num_episodes``
        but not in the window's statistics, with a ``RuntimeWarning``."""
        metrics = self.state.metrics.summary()
        if isinstance(self.envs, VectorEnv) and self.envs.layout_choice is not None:
            metrics["auto"] = self.envs.layout_choice.metrics()
        return metrics

    def get_spaces(self) -> dict[str, spaces.Space]:
        """The single-env and batched observation and action spaces."""
        return {
            "observation_space": self.envs.single_observation_space,
            "action_space": self.envs.single_action_space,
            "batched_observation_space": self.envs.observation_space,
            "batched_action_space": self.envs.action_space,
        }

    @property
    def num_splits(self) -> int:
        """Pipelining splits of the lockstep sampler (1 for the others)."""
        sampler = self.sampler
        return len(sampler.splits) if isinstance(sampler, LockstepSampler) else 1

    # -- internals ---------------------------------------------------------------------------

    def _parts(self) -> RunnerParts:
        """The state checkpoints save and restore: one group of one agent."""
        envs = self.envs
        group = AgentGroup(
            DEFAULT_POLICY_ID, (ONE_AGENT,), envs.single_observation_space, envs.single_action_space
        )

        def restart_connectors() -> None:  # e.g. ScaleReward's running returns restart too
            if self.connectors is not None:
                self.set_connector_state(
                    self.connectors.restart_episodes(self.get_connector_state())
                )

        return RunnerParts(
            runner="EnvRunner",
            state=self.state,
            sampler=self.sampler,
            envs=envs,
            groups=(group,),
            episode_type=Episode,
            rollout_length=self.rollout_length,
            seed=self.seed,
            restart_connectors=restart_connectors,
        )

    def _check_connectors(self, what: str) -> None:
        if self.connectors is None:
            raise InvalidArgumentError(
                f"EnvRunner.{what}(): this runner has no connectors; pass "
                "EnvRunner(..., connectors=jaxrunner.connectors.Connectors(...))."
            )

    def _sampler_params(self) -> Params:
        return self.get_params()
