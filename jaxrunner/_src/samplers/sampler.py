"""What every sampler is: a backend plus a compiled policy step, turned into
``[T, B]`` Trajectory buffers and episode bookkeeping.

The :class:`~jaxrunner.EnvRunner` facade picks one from the backend's declared
capabilities (``EnvRunner._make_sampler``) and owns what is common:
params, metrics, ``sample_episodes``, failures.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import time
from typing import Any, Protocol

import jax
import numpy as np
from gymnasium import spaces

from jaxrunner._src import space_arrays
from jaxrunner._src.connectors.pipeline import Connectors
from jaxrunner._src.runner.metrics import RunnerMetrics
from jaxrunner._src.runner.policy import Params, Policy
from jaxrunner._src.runner.trajectory import Trajectory
from jaxrunner._src.samplers.info_arrays import InfoRecorder
from jaxrunner.errors import InvalidArgumentError


@dataclasses.dataclass(frozen=True)
class SamplerSetup:
    """What every sampler is built from, besides its envs."""

    policy: Policy
    params: Params
    """Device params: their shapes and dtypes fix the compile."""
    rollout_length: int
    """T, the steps per env of each ``sample()``."""
    seed: int
    """The runner's seed: each env's action key derives from it, the env's id and its
    step count."""
    metrics: RunnerMetrics
    """The runner's metrics, which every sample adds to."""
    connectors: Connectors | None = None
    """Transforms between the envs and the policy (:mod:`jaxrunner.connectors`)."""
    info_keys: tuple[str, ...] = ()
    """Info entries recorded as ``[T, B]`` arrays (:mod:`.info_arrays`; host samplers)."""


class Sampler(abc.ABC):
    """Collects ``rollout_length`` steps of every env per :meth:`sample`.

    A sampler adds what it measured to the runner's :class:`RunnerMetrics` (given at
    construction). If a step fails, :meth:`sample` raises with the steps every env
    completed before it in ``err.partial_trajectory`` (episode ids and steps filled).
    """

    action_spec: Any
    """Shapes and dtypes of the policy's actions for all envs (``[B, ...]``)."""

    @abc.abstractmethod
    def sample(self, params: Params) -> Trajectory:
        """One rollout of every env with ``params`` (device arrays for the scan
        sampler, numpy for the host ones)."""

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
    metrics: RunnerMetrics

    def _end_sample(self, buf: Trajectory) -> Trajectory:
        """The connectors' end-of-sample update (statistics from this sample's
        observations, scaled rewards), timed as sampling."""
        if self._sample_end is not None:
            clock = time.perf_counter()
            buf, connectors = self._sample_end(self._state.connectors, buf)
            self._state = self._state.replace(connectors=connectors)
            self.metrics.sample_time_s += time.perf_counter() - clock
        return buf

    def get_connector_state(self) -> Any:
        """The connectors' state (a host copy): the statistics the next sample uses."""
        return self._packing.to_host(self._state.connectors)

    def set_connector_state(self, state: Any) -> None:
        """Replaces the connectors' state (shapes as :meth:`get_connector_state`'s)."""
        self._state = self._state.replace(connectors=self._packing.to_device(state))


def allocate_trajectory(
    obs_space: spaces.Space,
    action_space: spaces.Space,
    extras_spec: Any,
    num_steps: int,
    num_envs: int,
    infos: InfoRecorder | None = None,
) -> Trajectory:
    """Zeroed ``[T, B]`` host buffers; ``extras_spec`` has a leading batch axis; with
    ``infos``, its arrays too (``extras["infos"]``, ``extras["infos_present"]``)."""
    shape = (num_steps, num_envs)
    buf = Trajectory(
        obs=space_arrays.allocate(obs_space, shape),
        action=space_arrays.allocate(action_space, shape),
        reward=np.zeros(shape, np.float64),
        terminated=np.zeros(shape, np.bool_),
        truncated=np.zeros(shape, np.bool_),
        next_obs=space_arrays.allocate(obs_space, shape),
        extras=jax.tree.map(lambda s: np.zeros((*shape, *s.shape[1:]), s.dtype), extras_spec),
        env_id=np.broadcast_to(np.arange(num_envs, dtype=np.int64), shape).copy(),
        episode_id=np.zeros(shape, np.int64),
        step=np.zeros(shape, np.int64),
        valid=np.ones(shape, np.bool_),
    )
    if infos is not None:
        infos.allocate(buf.extras, shape)
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


__all__ = ["Sampler", "SamplerSetup", "allocate_trajectory", "attach_partial"]
