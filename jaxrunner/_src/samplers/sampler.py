"""What every sampler is: a backend plus a compiled policy step, turned into ``[T, B]``
trajectory buffers and episode bookkeeping."""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import jax
import numpy as np
from gymnasium import spaces

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.batch_step import BatchStep
from jaxrunner._src.connectors.pipeline import Connectors
from jaxrunner._src.core.metrics import RunnerMetrics
from jaxrunner._src.core.next_obs_store import FinalObsRecorder
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.core.trajectory import Trajectory
from jaxrunner._src.samplers.info_arrays import INFOS, INFOS_PRESENT, InfoKeys, InfoRecorder
from jaxrunner.errors import InvalidArgumentError

StepProgress = Callable[[int], None]
"""What a sampler reports a sample's progress to: called with the env steps it has
recorded so far (``Progress.update`` of the runner's bar)."""


@dataclasses.dataclass(frozen=True)
class SamplerSetup:
    """What every sampler is built from, besides its envs."""

    policies: dict[str, Policy]
    """Policy id -> Policy (a single-agent env's one policy under its default id)."""
    params: dict[str, Params]
    """Policy id -> device params: their shapes and dtypes fix the compile."""
    rollout_length: int
    """T, the steps per env of each ``sample()``."""
    seed: int
    """The runner's seed: each env's action key derives from it, the env's id and its
    step count."""
    metrics: RunnerMetrics
    """The runner's metrics, which every sample adds to."""
    connectors: Mapping[str, Connectors] = dataclasses.field(default_factory=dict)
    """Policy id -> the transforms between the envs and its policy
    (:mod:`jaxrunner.connectors`; policies without connectors absent)."""
    info_keys: InfoKeys = ()
    """Info entries recorded as arrays (``[T, B]``, or ``[T, B, A_g]`` per group), or
    ``"all"`` (:mod:`.info_arrays`; host samplers)."""
    compact_next_obs: bool = False
    """Store ``next_obs`` only where it is not the obs its slot acts on next (host
    samplers; :mod:`jaxrunner._src.core.next_obs_store`)."""
    by_group: bool = False
    """Sample into a ``MultiAgentTrajectory`` of agent groups (else a ``[T, B]``
    :class:`Trajectory` of the one policy's env)."""

    def one(self) -> tuple[Policy, Params, Connectors | None]:
        """The one policy, its params and connectors (a single-agent sampler's)."""
        ((pid, policy),) = self.policies.items()
        return policy, self.params[pid], self.connectors.get(pid)


class Sampler(abc.ABC):
    """Collects ``rollout_length`` steps of every env per :meth:`sample`.

    A sampler adds what it measured to the runner's :class:`RunnerMetrics` (given at
    construction). If a step fails, :meth:`sample` raises with the steps every env
    completed before it in ``err.partial_trajectory`` (episode ids and steps filled).
    """

    action_spec: Any
    """Shapes and dtypes of the policy's actions for all envs (``[B, ...]``)."""

    @abc.abstractmethod
    def sample(self, params: Params, progress: StepProgress | None = None) -> Trajectory:
        """One rollout of every env with ``params`` (device arrays for the scan
        sampler, numpy for the host ones); host samplers tell ``progress`` the env steps
        recorded as they go (a scan, one compiled call, does not)."""

    def get_state(self) -> dict[str, Any]:
        """What the sampler carries from one ``sample()`` to the next (policy keys and
        step counts, carries, episode bookkeeping, latest observations; for a pure-JAX
        env, the env states too), as a pytree of arrays. Valid between samples."""
        raise self._cannot_checkpoint("save")

    def set_state(self, state: dict[str, Any]) -> None:
        """Takes ``state`` (shaped as :meth:`get_state`'s) as its own: sampling goes on
        exactly where it was saved, provided the envs are in their saved state too."""
        raise self._cannot_checkpoint("restore")

    def restart_episodes(self, seeds: list[int]) -> None:
        """After :meth:`set_state` when the envs could not be restored: resets every env
        with ``seeds`` and starts a new episode in each (new ids, carries restarted)."""
        raise self._cannot_checkpoint("restore")

    def _cannot_checkpoint(self, what: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"EnvRunner.{what}(): the {type(self).__name__} cannot be checkpointed (it has "
            "no get_state/set_state/restart_episodes)."
        )


class HostSampler(Sampler):
    """What the host samplers (lockstep, ready-first) share: the actor state on device
    (``_state``, its connectors packed by ``_packing``) and the connectors' once-per-
    sample update (``_sample_end``, None without connectors)."""

    _state: Any
    _packing: Any
    _sample_end: Any
    _infos: InfoRecorder | None
    metrics: RunnerMetrics
    _pool: BufferPool

    def release(self, traj: Trajectory) -> None:
        """Takes back ``traj`` (a sample's result the caller is done with) for reuse."""
        self._pool.release(traj)

    def _end_sample(self, buf: Trajectory) -> Trajectory:
        """The connectors' end-of-sample update (statistics from this sample's
        observations, scaled rewards), timed as sampling; the result is handed out
        (:meth:`BufferPool.hand_out`). Misspelt ``info_keys`` are refused here, with
        the sample in the error's ``partial_trajectory``."""
        if self._infos is not None:
            try:
                self._infos.finish(buf.extras, bool((buf.terminated | buf.truncated).any()))
            except InvalidArgumentError as err:
                attach_partial(err, buf)
                raise
        if self._sample_end is not None:
            clock = time.perf_counter()
            buf, connectors = self._sample_end(self._state.connectors, buf)
            self._state = self._state.replace(connectors=connectors)
            self.metrics.sample_time_s += time.perf_counter() - clock
        self._pool.hand_out(buf)
        return buf

    def get_connector_state(self, policy_id: str | None = None) -> Any:
        """The connectors' state (a host copy): the statistics the next sample uses
        (``policy_id``: the one policy's, as every sampler takes it)."""
        return self._packing.to_host(self._state.connectors)

    def set_connector_state(self, state: Any, policy_id: str | None = None) -> None:
        """Replaces the connectors' state (shapes as :meth:`get_connector_state`'s)."""
        self._state = self._state.replace(connectors=self._packing.to_device(state))


class ReusedBuffers(abc.ABC):
    """A host sampler's sample buffers: new ones, or those of samples the caller
    released (``EnvRunner.release``), which the next sample writes into instead of
    allocating (and zeroing) a trajectory's memory again.

    Only a trajectory handed out and not released yet is taken back, and only with the
    very arrays it was handed out with, still writable and of their shapes: the next
    sample writes into them, so anything else (a ``replace()``'d copy, another runner's,
    one released already whose arrays hold a later sample) would be written into the
    caller's memory or break the sample. Subclasses say how a buffer is made, made
    ready again, and which of its arrays are reused.
    """

    def __init__(self) -> None:
        self._out: dict[int, tuple[weakref.ref, list[tuple[np.ndarray, Any, Any]]]] = {}
        """id(trajectory) -> (a weak reference to it, its reused arrays as handed out,
        each with its shape and dtype). An entry goes when its trajectory does."""
        self._free: list[Any] = []

    @abc.abstractmethod
    def _allocate(self) -> Any:
        """A new, zeroed buffer."""

    @abc.abstractmethod
    def _refresh(self, buf: Any) -> Any:
        """A released buffer, made as a new one is where a sample does not write in full
        (the caller may have changed those fields)."""

    @abc.abstractmethod
    def _reused_arrays(self, traj: Any) -> list[Any]:
        """The arrays of ``traj`` the next sample would write into, in a fixed order."""

    @abc.abstractmethod
    def _kept(self, traj: Any) -> Any:
        """``traj`` as the pool keeps it: without what was added after the sample (the
        connectors' extras)."""

    def take(self) -> Any:
        """A buffer for the next sample: a released one, made ready, or a new one."""
        return self._refresh(self._free.pop()) if self._free else self._allocate()

    def hand_out(self, traj: Any) -> None:
        """Records ``traj`` (a sample's result) as out: :meth:`release` may take it back."""
        key, out = id(traj), self._out

        def forget(ref: weakref.ref) -> None:  # the caller dropped it unreleased
            if out.get(key, (None,))[0] is ref:
                del out[key]

        arrays = [(a, a.shape, a.dtype) for a in self._reused_arrays(traj)]
        out[key] = (weakref.ref(traj, forget), arrays)

    def release(self, traj: Any) -> None:
        """Makes ``traj``'s arrays the next sample's.

        Raises:
            InvalidArgumentError: ``traj`` is not a result of this sampler still out
                (another runner's, a slice, copy or ``replace()`` of one, or released
                already), or its arrays were replaced, resized or made read-only.
        """
        entry = self._out.get(id(traj))
        if entry is None or entry[0]() is not traj:
            raise InvalidArgumentError(
                "EnvRunner.release(traj): traj is not a trajectory this runner's sample() "
                "returned and that is still out (it may be another runner's, a slice, a copy "
                "or a replace() of one, or released already). Pass the sample() result "
                "itself, once, before the next sample()."
            )
        arrays = self._reused_arrays(traj)
        handed_out = entry[1]
        changed = len(arrays) != len(handed_out) or any(
            now is not array or now.shape != shape or now.dtype != dtype
            or not now.flags.writeable
            for now, (array, shape, dtype) in zip(arrays, handed_out)
        )  # fmt: skip
        if changed:
            raise InvalidArgumentError(
                "EnvRunner.release(traj): traj's arrays are not those sample() handed out "
                "(an extras entry replaced, an array resized or made read-only); the next "
                "sample would write into them. Release only an unmodified sample() result; "
                "this one stays yours (the runner allocates new buffers)."
            )
        del self._out[id(traj)]
        self._free.append(self._kept(traj))


class BufferPool(ReusedBuffers):
    """The ``[T, B]`` :class:`Trajectory` buffers of a single-agent host sampler."""

    def __init__(
        self,
        obs_space: spaces.Space,
        action_space: spaces.Space,
        extras_spec: Any,
        num_steps: int,
        num_envs: int,
        infos: InfoRecorder | None,
        compact: bool,
    ) -> None:
        super().__init__()
        self._shape = (obs_space, action_space, extras_spec, num_steps, num_envs, infos)
        self._compact = compact
        self._own_extras = policy_extras_keys(extras_spec, infos)

    def take(self) -> Trajectory:
        buf = super().take()
        if self._compact:
            obs_space, _, _, num_steps, num_envs, _ = self._shape
            buf = buf.replace(next_obs_store=FinalObsRecorder(obs_space, num_steps, num_envs))
        return buf

    def _allocate(self) -> Trajectory:
        return allocate_trajectory(*self._shape, compact=self._compact)

    def _refresh(self, buf: Trajectory) -> Trajectory:
        infos, num_envs = self._shape[5], self._shape[4]
        buf.valid.fill(True)
        buf.env_id[...] = np.arange(num_envs)
        if infos is not None:
            infos.clear(buf.extras)
        return buf

    def _kept(self, traj: Trajectory) -> Trajectory:
        return traj.replace(extras={k: traj.extras[k] for k in self._own_extras})

    def _reused_arrays(self, traj: Trajectory) -> list[Any]:
        extras = traj.extras if isinstance(traj.extras, dict) else {}
        fields = [
            traj.obs, traj.action, traj.reward, traj.terminated, traj.truncated,
            [extras.get(k) for k in self._own_extras],
            traj.env_id, traj.episode_id, traj.step, traj.valid,
            None if self._compact else traj.next_obs_store,
        ]  # fmt: skip
        return jax.tree.leaves(fields)


def policy_extras_keys(extras_spec: Any, infos: InfoRecorder | None) -> list[str]:
    """The ``extras`` a sampler writes itself (the policy's and the infos), not those
    connectors add at the end of a sample."""
    keys = list(extras_spec)
    if infos is not None:
        keys += [INFOS, INFOS_PRESENT]
    return keys


def allocate_trajectory(
    obs_space: spaces.Space,
    action_space: spaces.Space,
    extras_spec: Any,
    num_steps: int,
    num_envs: int,
    infos: InfoRecorder | None = None,
    compact: bool = False,
) -> Trajectory:
    """Zeroed ``[T, B]`` host buffers; ``extras_spec`` has a leading batch axis; with
    ``infos``, its arrays too (``extras["infos"]``, ``extras["infos_present"]``).
    ``compact``: no ``next_obs`` arrays (the sampler sets a recorder)."""
    shape = (num_steps, num_envs)
    buf = Trajectory(
        obs=space_arrays.allocate(obs_space, shape),
        action=space_arrays.allocate(action_space, shape),
        reward=np.zeros(shape, np.float64),
        terminated=np.zeros(shape, np.bool_),
        truncated=np.zeros(shape, np.bool_),
        next_obs=None if compact else space_arrays.allocate(obs_space, shape),
        extras=jax.tree.map(lambda s: np.zeros((*shape, *s.shape[1:]), s.dtype), extras_spec),
        env_id=np.broadcast_to(np.arange(num_envs, dtype=np.int64), shape).copy(),
        episode_id=np.zeros(shape, np.int64),
        step=np.zeros(shape, np.int64),
        valid=np.ones(shape, np.bool_),
    )
    if infos is not None:
        infos.allocate(buf.extras, shape)
    return buf


def record_next_obs(
    obs_space: spaces.Space,
    buf: Trajectory,
    index: tuple[Any, Any],
    out: BatchStep,
    sel: Any = None,
) -> None:
    """Writes the next observations of ``out`` (its rows ``sel``; all by default) at
    ``index`` (steps, envs) of ``buf``: all of them, or into a compact buffer's
    recorder, which keeps those that are not the next step's observation."""
    store = buf.next_obs_store
    if not isinstance(store, FinalObsRecorder):
        next_obs = out.next_obs if sel is None else space_arrays.take(obs_space, out.next_obs, sel)
        space_arrays.copy_into(obs_space, store, next_obs, index)
        return
    steps, envs = index
    if isinstance(envs, slice) and sel is None:  # lockstep: a block of envs, one step
        differs = out.terminated | out.truncated
    else:
        if isinstance(envs, slice):
            envs = np.arange(envs.start, envs.stop)
        sel = np.arange(len(out.reward))[slice(None) if sel is None else sel]
        differs = out.terminated[sel] | out.truncated[sel]
        steps = np.broadcast_to(np.asarray(steps), envs.shape)
    for mask in (out.failed, out.reset_rows):  # a restart or a reset step: another obs
        if mask is not None:
            differs |= mask if sel is None else mask[sel]
    store.record(buf.obs, steps, envs, out.next_obs, out.obs, sel, differs)


def finish_next_obs(buf: Trajectory) -> Trajectory:
    """``buf`` with its recorder (a compact buffer's) turned into the stored rows."""
    store = buf.next_obs_store
    if isinstance(store, FinalObsRecorder):
        return buf.replace(next_obs_store=store.finish())
    return buf


class PartialTrajectory(Protocol):
    """What :func:`attach_partial` needs of the steps it attaches: a :class:`Trajectory`
    or a ``MultiAgentTrajectory``."""

    @property
    def num_steps(self) -> int: ...


def attach_partial(err: BaseException, partial: PartialTrajectory | None) -> None:
    """Puts the steps collected before ``err`` in ``err.partial_trajectory``, with a
    note saying so (exceptions that refuse new attributes are left as they are)."""
    with contextlib.suppress(AttributeError):
        err.partial_trajectory = partial  # type: ignore[attr-defined]
        steps = 0 if partial is None else partial.num_steps
        err.add_note(
            f"jaxrunner: the {steps} steps completed before this error are in "
            "err.partial_trajectory."
        )
