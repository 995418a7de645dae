"""The main process's share of ``backend="process"`` (``ProcessConfig(main_process_envs=k)``):
its first ``k`` sub-envs step in the main process while the workers step the rest, as the
two pipelining splits; and :func:`make_process_vec`, what ``make_vec`` builds."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from gymnasium.vector.utils import batch_space

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.batch_step import BatchStep, EnvIds, block_rows
from jaxrunner._src.backends.capabilities import Capabilities
from jaxrunner._src.backends.error_indices import with_global_env_index
from jaxrunner._src.backends.process.config import ProcessConfig, checked_config, main_process_share
from jaxrunner._src.backends.process.handle import shutdown
from jaxrunner._src.backends.process.launch import (
    EnvFactory,
    MainProcessFactory,
    default_num_workers,
)
from jaxrunner._src.backends.process.transport import ProcessTransport
from jaxrunner._src.backends.process.vector_env import ProcessVectorEnv
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.backends.step_buffers import StepBuffers
from jaxrunner._src.backends.sub_env_handle import SubEnvHandle
from jaxrunner._src.backends.sync import SyncVectorEnv
from jaxrunner._src.core.agent_groups import PolicyMappingFn
from jaxrunner.errors import (
    InvalidArgumentError,
    SpaceMismatchError,
)

if TYPE_CHECKING:
    from jaxrunner._src.backends.multi_agent.vector_env import MultiAgentVectorEnv


def make_process_vec(
    env_fns: Sequence[EnvFactory],
    config: ProcessConfig | None,
    *,
    restart_policy: RestartPolicy | None = None,
    policy_mapping_fn: PolicyMappingFn | None = None,
    multi_agent: bool | None = False,
) -> VectorEnv | MultiAgentVectorEnv:
    """``backend="process"``: a :class:`LocalShareVectorEnv` where the main process
    takes a share (:func:`main_process_share`) of single-agent sub-envs, else the process
    backend of the sub-envs' kind (a multi-agent one takes ``policy_mapping_fn``).
    ``multi_agent=None``: the kind is not known (and no share is asked for): the workers
    report it as they start."""
    config = ProcessConfig() if config is None else config
    if isinstance(config, ProcessConfig) and not multi_agent:
        if main_process_share(len(env_fns), config):
            return LocalShareVectorEnv(env_fns, config, restart_policy=restart_policy)
        config = dataclasses.replace(config, main_process_envs=0)
    transport = None
    if multi_agent is None and isinstance(config, ProcessConfig) and env_fns:
        transport = ProcessTransport(env_fns, config, None)
        multi_agent = transport.multi_agent
    try:
        if not multi_agent:
            return ProcessVectorEnv(
                env_fns, config, restart_policy=restart_policy, _transport=transport
            )
        from jaxrunner._src.backends.process.agents import ProcessMultiAgentVectorEnv

        return ProcessMultiAgentVectorEnv(
            env_fns, policy_mapping_fn, config=config, restart_policy=restart_policy,
            _transport=transport,
        )  # fmt: skip
    except BaseException:
        if transport is not None:  # not taken by a vector env (its close is idempotent)
            shutdown(transport.res)
        raise


class _Send(NamedTuple):
    """One send in flight: its rows, the main process's actions (a copy; None: no rows
    of its share) and whether the workers step some."""

    lo: int
    hi: int
    local_actions: Any
    remote: bool


class LocalShareVectorEnv(VectorEnv):
    """Sub-envs ``[0, k)`` stepped in the main process, ``[k, num_envs)`` in workers
    (``k = main_process_share(num_envs, config)``), as one lockstep vector env that
    steps in the background.

    Step for step equal to :class:`~jaxrunner.SyncVectorEnv` for the same seeds and
    actions. ``send`` hands the workers their rows at once and keeps the main
    process's (a copy); ``recv`` answers the sends in order, stepping the main
    process's rows then, while the workers step theirs. A send of rows of both parts
    is answered from copies in this env's own buffers; a send within one part is
    answered by that part's views (``capabilities.pipeline_bounds`` makes every
    lockstep group such a send).

    Faults: with a ``restart_policy``, a failed sub-env of the main process's share
    restarts exactly as the sync backend's do; lost workers are replaced as in
    :class:`~jaxrunner.ProcessVectorEnv`. Errors name sub-envs by their index in this env
    (``env_index``; a note says the workers' part's own). A failure that closes the
    workers' part closes this env.

    Args:
        env_fns: zero-argument factories, one per sub-env; the first ``k`` are called
            here, the others pickled to the workers.
        config: the workers' options and ``main_process_envs`` (at least 1).
        copy: as for :class:`~jaxrunner.SyncVectorEnv`.
        restart_policy: as for :class:`~jaxrunner.ProcessVectorEnv`.

    Raises:
        InvalidArgumentError: a share of 0 or of every sub-env, or a ready-first config.
        InvalidArgumentTypeError: ``config`` is not a ProcessConfig.
        EnvError: a factory raised (here or in its worker; the original is chained).
        SpaceMismatchError: the two parts' sub-envs have different spaces.
    """

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        config: ProcessConfig | None = None,
        *,
        copy: bool = True,
        restart_policy: RestartPolicy | None = None,
    ) -> None:
        super().__init__(copy=copy)
        self._closed_reason = "construction failed"  # until both parts are up
        config = checked_config(config, "LocalShareVectorEnv")
        num_envs = len(env_fns)
        k = main_process_share(num_envs, config) if num_envs else 0
        if k < 1:
            raise InvalidArgumentError(
                f"LocalShareVectorEnv(config=ProcessConfig(main_process_envs="
                f"{config.main_process_envs!r})) with num_envs={num_envs}: the main process's "
                "share came to 0 sub-envs. Give main_process_envs >= 1 (and below num_envs), "
                "or use jaxrunner.ProcessVectorEnv to step every sub-env in a worker."
            )
        self.config, self.restart_policy, self.num_envs = config, restart_policy, num_envs
        self.main_process_envs = k
        """How many sub-envs (the first ones) step in the main process."""
        local_fns = [MainProcessFactory(fn, i) for i, fn in enumerate(env_fns[:k])]
        self._local = SyncVectorEnv(local_fns, copy=False, restart_policy=restart_policy)
        try:
            worker_config = dataclasses.replace(config, main_process_envs=0)
            if config.num_workers is None and config.envs_per_worker is None:
                # The main process steps envs too: one CPU stays with it.
                workers = default_num_workers(num_envs - k, main_process="steps")
                worker_config = dataclasses.replace(worker_config, num_workers=workers)
            with self._workers_part():
                self._remote = ProcessVectorEnv(
                    env_fns[k:], worker_config, copy=False, restart_policy=restart_policy
                )
        except BaseException:
            self._local.close()
            raise
        try:
            self._check_spaces()
        except SpaceMismatchError:
            self._close_backend()
            raise
        self._closed_reason = None
        obs_space = self.single_observation_space = self._local.single_observation_space
        self.single_action_space = self._local.single_action_space
        self.observation_space = batch_space(obs_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.metadata, self.render_mode = self._local.metadata, self._local.render_mode
        self.spec = None
        self.capabilities = Capabilities(
            can_restart=True, steps_in_background=True, pipeline_bounds=(0, k, num_envs)
        )
        self._buffers = StepBuffers.allocate(obs_space, num_envs)
        self._sent: collections.deque[_Send] = collections.deque()

    def _check_spaces(self) -> None:
        for name in ("single_observation_space", "single_action_space"):
            here, there = getattr(self._local, name), getattr(self._remote, name)
            if here != there:
                raise SpaceMismatchError(
                    f"sub-env {self.main_process_envs} has {name[7:]}={there}, but sub-env 0 "
                    f"has {here}; every sub-env of a vector env must have equal spaces. Check "
                    "the factory."
                )

    # -- counters and options of the parts ---------------------------------------------------

    @property
    def num_restarts(self) -> int:
        """Sub-envs recreated after a failure, in the main process or a worker."""
        return self._local.num_restarts + self._remote.num_restarts

    @property
    def num_worker_restarts(self) -> int:
        """Workers replaced after they died or timed out."""
        return self._remote.num_worker_restarts

    @property
    def num_lost_steps(self) -> int:
        """Completed ``env.step`` calls whose results died with their worker."""
        return self._remote.num_lost_steps

    @property
    def num_unrun_steps(self) -> int:
        """Failed slots of replaced workers' sub-envs that had not started their step."""
        return self._remote.num_unrun_steps

    @property
    def step_timeout_s(self) -> float | None:
        """How long a worker may take to answer a command (None: forever)."""
        return self._remote.step_timeout_s

    @property
    def num_workers(self) -> int:
        return self._remote.num_workers

    @property
    def worker_pids(self) -> list[int | None]:
        """The worker processes' ids (for monitoring; empty once closed)."""
        return self._remote.worker_pids

    # -- the backend contract -----------------------------------------------------------------

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> tuple[Any, list[dict[str, Any]]]:
        """Resets every sub-env; the results of sends not yet received are dropped."""
        self._check_open("reset")
        seeds, k = list(seeds), self.main_process_envs
        self._sent.clear()  # the main process's rows never started; the workers' drop theirs
        with self._workers_part():
            _, remote_infos = self._remote.reset_batch(seeds[k:], options)
        _, local_infos = self._local.reset_batch(seeds[:k], options)
        return self._obs_buffer(), local_infos + remote_infos

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        self._check_open("reset_at")
        self._check_index(index, "reset_at")
        k = self.main_process_envs
        if index < k:
            return self._local.reset_at(index, seed=seed, options=options)
        with self._workers_part():
            return self._remote.reset_at(index - k, seed=seed, options=options)

    def send(self, actions: Any, env_ids: EnvIds = None) -> None:
        """Starts the workers' rows of ``env_ids`` (None: all; else a slice) at once and
        keeps a copy of the main process's rows for :meth:`recv`; validates the whole
        batch first where it covers the main process's rows."""
        self._check_open("step")
        lo, hi = block_rows(env_ids, self.num_envs, "LocalShareVectorEnv")
        k = self.main_process_envs
        local, remote = lo < k, hi > k
        space = self.single_action_space
        if local:  # checked here: the workers' rows may start before the main process's
            actions = space_arrays.check_action_batch(space, actions, hi - lo)
        if remote:
            part = actions if not local else space_arrays.rows(space, actions, slice(k - lo, None))
            self._remote.send(part, slice(max(lo, k) - k, hi - k))
        local_actions = None
        if local:  # a copy: the caller may reuse its array before the matching recv
            part = actions if not remote else space_arrays.rows(space, actions, slice(0, k - lo))
            local_actions = space_arrays.map_structure(space, np.array, part)
        self._sent.append(_Send(lo, hi, local_actions, remote))

    def recv(self) -> BatchStep:
        """The result of the oldest send: the main process's rows step now (while the
        workers step theirs), then the workers' rows are waited for."""
        self._check_open("step")
        if not self._sent:
            raise InvalidArgumentError(
                "LocalShareVectorEnv.recv(): no send() is waiting for its results. Call "
                "send(actions, env_ids) first, once per recv()."
            )
        sent = self._sent.popleft()
        k = self.main_process_envs
        try:
            local = None
            if sent.local_actions is not None:
                rows = slice(sent.lo, min(sent.hi, k))
                local = self._local.step_batch(sent.local_actions, rows)
        except BaseException:
            if sent.remote:  # keep the workers' answers in step with the sends
                self._drain_remote()
            raise
        with self._workers_part():
            remote = self._shifted(self._remote.recv()) if sent.remote else None
        if remote is None:
            return local  # type: ignore[return-value]
        if local is None:
            return remote
        return self._merge(sent, local, remote)

    def _drain_remote(self) -> None:
        """Receives and drops the workers' result of a send whose main-process rows
        raised (their own error, if any, is dropped: the first one is raised)."""
        with contextlib.suppress(Exception):
            self._remote.recv()

    @contextlib.contextmanager
    def _workers_part(self) -> Iterator[None]:
        """Errors raised by the workers' part name this env's sub-envs."""
        try:
            yield
        except BaseException as err:
            with_global_env_index(err, self.main_process_envs, "the worker processes' share")
            raise

    def _shifted(self, out: BatchStep) -> BatchStep:
        """The workers' result with global env indices."""
        k = self.main_process_envs
        ids = out.env_ids
        lo, hi = (0, self._remote.num_envs) if ids is None else (ids.start, ids.stop)  # type: ignore[union-attr]
        reset_infos = {i + k: info for i, info in out.reset_infos.items()}
        errors = out.errors and {
            i + k: with_global_env_index(e, k, "the worker processes' share")
            for i, e in out.errors.items()
        }
        return out._replace(reset_infos=reset_infos, errors=errors, env_ids=slice(lo + k, hi + k))

    def _merge(self, sent: _Send, local: BatchStep, remote: BatchStep) -> BatchStep:
        """Both parts' results as one, copied into this env's buffers."""
        buffers, space, k = self._buffers, self.single_observation_space, self.main_process_envs
        for out in (local, remote):
            rows = out.env_ids
            space_arrays.copy_into(space, buffers.obs, out.obs, rows)
            space_arrays.copy_into(space, buffers.next_obs, out.next_obs, rows)
            buffers.reward[rows] = out.reward
            buffers.terminated[rows] = out.terminated
            buffers.truncated[rows] = out.truncated
        failed = None
        if local.failed is not None or remote.failed is not None:
            failed = np.zeros(sent.hi - sent.lo, dtype=np.bool_)
            if local.failed is not None:
                failed[: k - sent.lo] = local.failed
            if remote.failed is not None:
                failed[k - sent.lo :] = remote.failed
        errors = {**(local.errors or {}), **(remote.errors or {})}
        whole = (sent.lo, sent.hi) == (0, self.num_envs)
        return buffers.batch_step(
            space,
            None if whole else slice(sent.lo, sent.hi),
            [*local.infos, *remote.infos],
            {**local.reset_infos, **remote.reset_infos},
            failed,
            errors or None,
        )

    def _obs_buffer(self) -> Any:
        """Both parts' current observations, copied into this env's buffer."""
        k, space, obs = self.main_process_envs, self.single_observation_space, self._buffers.obs
        space_arrays.copy_into(space, obs, self._local._obs_buffer(), slice(0, k))
        space_arrays.copy_into(space, obs, self._remote._obs_buffer(), slice(k, None))
        return obs

    def _check_open(self, what: str) -> None:
        reason = self._remote._closed_reason
        if self._closed_reason is None and reason is not None:  # a worker failure closed it
            self._closed_reason = f"its worker processes closed: {reason}"
            self._local.close()
        super()._check_open(what)

    def _close_backend(self) -> None:
        try:
            self._remote.close()
        finally:
            self._local.close()

    # -- the rest of gymnasium's VectorEnv API -------------------------------------------------

    def render(self) -> tuple[Any, ...]:
        self._check_open("render")
        return self._local.render() + self._remote.render()

    def get_sub_environments(self) -> list[Any]:
        """The main process's sub-envs themselves, then a
        :class:`~jaxrunner._src.backends.sub_env_handle.SubEnvHandle` per worker's
        sub-env, in index order."""
        self._check_open("get_sub_environments")
        handles = [SubEnvHandle(self, i) for i in range(self.main_process_envs, self.num_envs)]
        return self._local.get_sub_environments() + handles

    def _sub_env_request(self, index: int, method: str, args: tuple) -> Any:
        self._check_open(f"get_sub_environments()[{index}].{method}")
        with self._workers_part():
            return self._remote._sub_env_request(index - self.main_process_envs, method, args)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method ``name`` (or reads attribute ``name``) on every sub-env; the
        workers' results must pickle."""
        self._check_open("call")
        return self._local.call(name, *args, **kwargs) + self._remote.call(name, *args, **kwargs)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        self._check_open("get_attr")
        return self._local.get_attr(name) + self._remote.get_attr(name)

    def set_attr(self, name: str, values: Any) -> None:
        self._check_open("set_attr")
        values, k = self._values_per_env(name, values), self.main_process_envs
        self._local.set_attr(name, values[:k])
        self._remote.set_attr(name, values[k:])
