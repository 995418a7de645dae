"""EnvRunner: the one runner facade, for single- and multi-agent envs alike; it picks the
sampler from the env's declared kind and capabilities."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from jaxrunner._src.arg_checks import check_bool, check_config, check_int
from jaxrunner._src.backends.base import BaseVectorEnv, MultiAgentVectorEnv, VectorEnv
from jaxrunner._src.backends.jax_env import JaxVectorEnv
from jaxrunner._src.checkpoints import checkpoint
from jaxrunner._src.checkpoints.checkpoint import RestoreReport
from jaxrunner._src.checkpoints.checkpoint_file import MAX_RESTORE_BYTES
from jaxrunner._src.connectors.per_group import GroupConnectors
from jaxrunner._src.connectors.pipeline import Connectors
from jaxrunner._src.core.metrics import MetricsConfig
from jaxrunner._src.core.multi_agent_trajectory import MultiAgentTrajectory
from jaxrunner._src.core.params import params_error, put_params, refuse_params_by_policy_id
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.core.runner_state import RunnerState
from jaxrunner._src.core.trajectory import Trajectory
from jaxrunner._src.runner.auto_layout import from_env
from jaxrunner._src.runner.collection import collect_episodes, iterate_samples, sample_once
from jaxrunner._src.runner.env_runner_checks import (
    check_arguments,
    check_has_connectors,
    check_host_options,
    check_policy_id,
    check_releasable,
)
from jaxrunner._src.runner.kinds import kind_of
from jaxrunner._src.runner.ownership import Ownership
from jaxrunner._src.samplers.callbacks import Callbacks
from jaxrunner._src.samplers.info_arrays import InfoKeys


class EnvRunner:
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
            with ``jr.env_seeds(seed, num_envs)[i]`` (a different ``make_vec(...,
            seed=...)`` is overridden, with a warning). The same seed gives the same
            trajectories.
        callbacks: optional :class:`~jaxrunner.Callbacks` (lockstep backends only);
            multi-agent: :class:`~jaxrunner.multi_agent.AgentCallbacks`, whose per env
            episode hooks run in the sampling loop (lockstep backends) and
            ``on_agent_episode_end`` after each ``sample()`` (every backend; on a
            single-agent env too, an ``AgentCallbacks`` sees its one agent's episodes).
        metrics: optional :class:`~jaxrunner.MetricsConfig`.
        num_splits: pipelining: the envs are split in this many parts, and the
            policy computes one split's actions while another split's envs step.
            ``None`` lets the backend or the width decide (docs/gpu.md, "Pipelining").
            Outputs are bitwise identical whatever the number (batch invariance,
            docs/concepts.md). Ready-first backends and pure-JAX envs take None (or 1).
        info_keys: names of per-step info entries to record as float64 ``[T, B]``
            arrays, in ``traj.extras["infos"][name]`` with the mask of the steps that had
            them in ``traj.extras["infos_present"][name]`` (``"episode.r"`` reaches into
            ``info["episode"]``), or ``"all"``: every numeric entry reported so far.
            Host backends; multi-agent: ``[T, B, A_g]`` in each group's extras, lined up
            with ``valid``. The rules: docs/concepts.md, "Infos as arrays".
        compact_next_obs: store ``traj.next_obs`` only where it is not the next step's
            ``obs`` (multi-agent: the obs at the agent slot's next valid row), and build
            it from ``obs`` when it is read: half the memory of image observations
            (docs/concepts.md, "Memory"). Host backends.
        chunk_rows: rows per batch-invariant policy chunk (None: the default for the
            width and the policy's cost, the same for every backend). A block of envs
            smaller than a chunk is padded to it; set this to the smallest block where
            those are smaller (ready-first workers with a CNN). Host backends.
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
        chunk_rows: int | None = None,
    ) -> None:
        self.kind = kind_of(envs)  # agents in policy groups, or one agent
        policies, by_id = check_arguments(
            envs, self.kind, policy, params, rollout_length, seed, callbacks, num_splits
        )
        self.info_keys: InfoKeys = check_host_options(envs, info_keys, compact_next_obs, chunk_rows)
        name = type(self).__name__
        device_params = {
            pid: put_params(p, f"{name}(params), policy {pid!r}") for pid, p in by_id.items()
        }
        metrics = check_config(name, metrics, MetricsConfig, "metrics")
        self.compact_next_obs = compact_next_obs
        self.chunk_rows = None if chunk_rows is None else int(chunk_rows)
        # As given (multi-agent: a dict by policy id), and by policy id (those with some).
        self.connectors, self._connectors = self.kind.connectors(connectors)
        self._ownership = Ownership(type(self).__name__, envs)
        self.envs: Any = envs
        self.policy = policy
        self._policies: dict[str, Policy] = policies
        self.rollout_length = int(rollout_length)
        self.seed = int(seed)
        self.callbacks: Any = callbacks
        self.state: RunnerState = self.kind.new_state(device_params, metrics)
        self._on_agent_episode_end = self.kind.agent_episode_end(callbacks)
        try:
            self.sampler: Any = self.kind.sampler(self, num_splits)
        except BaseException as err:
            self._ownership.release()
            instead = params_error(err, policies, by_id, envs.groups, self._connectors)
            if instead is None:
                raise
            raise instead from err

    @property
    def multi_agent(self) -> bool:
        """The kind the env declares: agents in policy groups (True) or one agent."""
        return self.kind.multi_agent

    # Built with envs it owns, the layout chosen with the policy timed: auto_layout.py.
    from_env = classmethod(from_env)

    # -- public API ---------------------------------------------------------------------------

    def sample(self, progress: bool = False) -> Any:
        """Collects ``rollout_length`` steps of every env: a :class:`Trajectory`, or a
        :class:`MultiAgentTrajectory` for a multi-agent env.

        Episodes carry on across calls. If a step fails, the exception propagates
        with ``err.partial_trajectory`` holding the steps every env completed before
        it (``[t, B]``), and the runner refuses further sampling (its envs are in an
        unknown state). The unfinished episodes :meth:`sample_episodes` was assembling
        are dropped. With ``progress``, a progress bar counts the env steps (tqdm where
        it is installed, else a line on stderr)."""
        check_bool("EnvRunner.sample", "progress", progress)
        self._ownership.check_usable("sample")  # a refused call forgets nothing
        self.state.episodes.forget()
        return sample_once(self, progress)

    def release(self, traj: Trajectory | MultiAgentTrajectory) -> None:
        """Hands back a trajectory :meth:`sample` returned that you no longer read: the
        next sample writes into its arrays instead of allocating new ones (a sample's
        memory is allocated and zeroed once, not every call). ``traj`` and any view of
        it (``time_slice``, its arrays) then change under you: copy what you keep
        first. Episodes from ``split_episodes`` are copies and stay valid. (A sample
        you drop, and hold nothing of, is written again without it: docs/concepts.md,
        "Memory".)

        Raises:
            InvalidArgumentError: ``traj`` is not a result of this runner's ``sample()``
                still out (released twice, a copy, slice or ``replace()`` of one, another
                runner's), its arrays were replaced, resized or made read-only, or the
                envs are pure JAX (their trajectories live on device).
        """
        self._ownership.check_usable("release")
        check_releasable(self, "release(traj)", ".")
        self.sampler.release(traj)

    def sample_episodes(
        self, num_episodes: int, include_faulty: bool = False, progress: bool = False
    ) -> list[Any]:
        """Samples until ``num_episodes`` complete episodes (seen from their first
        step) are available; returns them in the order they started (multi-agent:
        :class:`AgentEpisode` s, ordered by env episode id, then agent). Episodes that
        complete beyond the count are kept for the next call. Episodes under way at a
        ``sample()`` and those cut by a sub-env failure (``faulty``; kept with
        ``include_faulty``) are skipped. With ``progress``, a progress bar counts the
        episodes. If a sample fails, its error carries the episodes completed so far in
        ``err.partial_episodes``."""
        name = f"{type(self).__name__}.sample_episodes"
        check_bool(name, "include_faulty", include_faulty)
        check_int(name, "num_episodes", num_episodes)
        check_bool(name, "progress", progress)
        return collect_episodes(self, name, num_episodes, include_faulty, progress)

    def iterate(
        self, num_samples: int | None = None, *, progress: bool = False, reuse_buffers: bool = False
    ) -> Iterator[Any]:
        """Yields ``num_samples`` results of :meth:`sample` (``None``: until the loop
        stops), as TorchRL and Sample Factory users iterate a collector.

        Args:
            num_samples: how many samples; ``None`` for an endless iterator.
            progress: a progress bar counting env steps.
            reuse_buffers: hand each trajectory back (``release``) when the next is
                asked for, so the loop writes into one set of buffers instead of
                allocating a sample's memory each time; a yielded trajectory is then
                valid until the next iteration only (copy what you keep). Host envs only
                (a pure-JAX env's trajectories live on device).
        """
        name = f"{type(self).__name__}.iterate"
        num_samples = check_int(name, "num_samples", num_samples, low=0, none="for no end")
        check_bool(name, "progress", progress)
        check_bool(name, "reuse_buffers", reuse_buffers)
        if reuse_buffers:
            check_releasable(self, "iterate(reuse_buffers=True)", "; leave reuse_buffers=False.")
        return iterate_samples(self, name, num_samples, progress, reuse_buffers)

    def set_params(self, params: Params, policy_id: str | None = None) -> None:
        """Replaces the params of policy ``policy_id`` (``None``: the runner's one policy);
        takes effect at the next :meth:`sample` and never recompiles. Called from a
        callback while a sample runs, it leaves that sample on the params it started with
        (every env and agent alike, whatever the pipelining splits). The new params must
        have the structure, shapes and dtypes of the old ones."""
        # A callback may call it while sampling: the next sample() takes the new params.
        self._ownership.check_usable("set_params", while_sampling=True)
        if isinstance(params, str) and params in self.state.params and policy_id is not None:
            warnings.warn(
                f"{type(self).__name__}.set_params(policy_id, params) is the old order; call "
                "set_params(params, policy_id), as every runner takes it.",
                DeprecationWarning,
                stacklevel=2,
            )
            params, policy_id = policy_id, params
        pid = check_policy_id(self, "set_params", policy_id)
        what = f"{type(self).__name__}.set_params(params, {pid!r})"
        refuse_params_by_policy_id(params, self.state.params, self.state.params[pid], what)
        self.state.params[pid] = put_params(params, what, like=self.state.params[pid])

    def get_params(self, policy_id: str | None = None) -> Params:
        """The params of policy ``policy_id`` (``None``: the runner's one policy), as the
        runner holds them, on device."""
        return self.state.params[check_policy_id(self, "get_params", policy_id)]

    @property
    def policy_ids(self) -> tuple[str, ...]:
        """The runner's policy ids (a single-agent env's one: ``"default_policy"``)."""
        return tuple(self.state.params)

    def save(self, path: str | os.PathLike) -> None:
        """Writes a checkpoint of the runner to ``path`` (one ``.npz`` file): params,
        policy keys, carries, connector state, episode bookkeeping, latest observations
        and metrics (docs/checkpoints.md). Pure-JAX envs' states are always in it;
        sub-envs of a backend that can snapshot them (the sync backend) are added as
        pickles. Call it between samples."""
        self._ownership.check_usable("save")
        checkpoint.save(self.kind.parts(self), path)

    def restore(
        self,
        path: str | os.PathLike,
        *,
        load_env_pickles: bool = False,
        max_bytes: int = MAX_RESTORE_BYTES,
    ) -> RestoreReport:
        """Continues from the checkpoint at ``path`` (:meth:`save`). Call it on a new
        runner built as the saved one was (same policies, policy ids, agents, kind of
        backend, num_envs; new envs), or on one that has sampled: what it sampled is
        replaced, and it goes on as the saved run does.

        The envs resume exactly (sampling continues bit for bit) when they are pure JAX,
        or when the checkpoint holds pickled sub-envs and ``load_env_pickles`` is True
        (unpickling runs code from the file: only for checkpoints you trust). Otherwise
        every env is reset with fresh seeds and starts a new episode, with a warning;
        params, policy keys, episode ids and metrics are restored either way.
        ``max_bytes`` bounds the memory of the file's arrays (8 GiB by default).

        Returns:
            A :class:`~jaxrunner.RestoreReport`: whether the envs were restored, and how
            they were resumed.

        Raises:
            InvalidArgumentError: the file is not a checkpoint of a runner built as this
                one, or a value in it is damaged (the message names the field); the
                runner is unchanged.
        """
        self._ownership.check_usable("restore")
        parts = self.kind.parts(self)
        report = checkpoint.restore(parts, path, load_env_pickles, max_bytes)
        self.seed = parts.seed
        return report

    def get_connector_state(self) -> Any:
        """The connectors' state, as a host copy (multi-agent: a dict by policy id): the
        statistics the next ``sample()`` uses (those the last one used are already
        folded in; the trajectory keeps what the policy saw, ``extras["policy_obs"]``)."""
        check_has_connectors(self, "get_connector_state")
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
        check_has_connectors(self, "set_connector_state")
        sampler = self.sampler
        for pid, value in self.kind.connector_states(state, sampler, self._connectors).items():
            sampler.set_connector_state(value, pid)

    def get_metrics(self) -> dict[str, Any]:
        """Counters since construction, recent-episode statistics and perf timers, as
        of the last ``sample()``; multi-agent: agent steps too, env episodes (returns
        summed over agents), and ``policies``/``agents``: per-policy and per-agent
        statistics. For envs built by ``make_vec(..., backend="auto")`` also ``auto``:
        the layout it chose (``LayoutChoice.metrics``). An episode whose return
        overflows float64 counts in ``num_episodes`` only, with a ``RuntimeWarning``."""
        metrics = self.state.metrics.summary()
        if isinstance(self.envs, BaseVectorEnv) and self.envs.layout_choice is not None:
            metrics["auto"] = self.envs.layout_choice.metrics()
        return metrics

    def get_spaces(self) -> dict[str, Any]:
        """The single-env and batched observation and action spaces; multi-agent: each
        policy id's one-agent observation and action spaces, by policy id."""
        return self.kind.spaces()

    @property
    def num_splits(self) -> int:
        """Pipelining splits of the lockstep samplers (1 for the others)."""
        return len(self.sampler.splits)

    def to_policy_dict(self, value: Any, where: str) -> dict[str, Any]:
        """``value`` (params, connector state, ...) as this runner's methods take it
        (a single-agent env's: its one policy's; a multi-agent env's: a dict by some of
        the policy ids, checked, ``where`` named in the error), as a dict by policy id."""
        return self.kind.to_policy_dict(value, where)

    def from_policy_dict(self, values: Mapping[str, Any]) -> Any:
        """The inverse of :meth:`to_policy_dict`: values by policy id, as this runner's
        methods take and return them."""
        return self.kind.from_policy_dict(values)

    def stop(self, close_envs: bool = True) -> None:
        """Ends the runner: it cannot sample afterwards, and its envs are free for
        another runner. Closes the envs unless ``close_envs`` is False."""
        if self._ownership.sampling:
            self._ownership.check_usable("stop")
        if not self._ownership.closed:
            self._ownership.release()
            self.sampler.free_buffers()
            if close_envs:
                self.envs.close()
            elif hasattr(self.envs, "drop_in_flight"):  # EnvPool async: steps a sample ahead
                self.envs.drop_in_flight()

    def close(self) -> None:
        """:meth:`stop`, closing the envs (the name gymnasium and Python users reach for)."""
        self.stop()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


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
