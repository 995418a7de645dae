"""What every sampler is: a backend plus a compiled policy step, turned into ``[T, B]``
trajectory buffers and episode bookkeeping."""

from __future__ import annotations

import abc
import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from jaxrunner._src.connectors.pipeline import Connectors
from jaxrunner._src.core.metrics import RunnerMetrics
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.core.trajectory import Trajectory
from jaxrunner._src.samplers.info_arrays import InfoKeys
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
    chunk_rows: int | None = None
    """Rows per policy chunk (None: :func:`.group_cost`'s default; host samplers)."""

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

    def set_state(self, state: dict[str, Any], live: list[Any] | None = None) -> None:
        """Takes ``state`` (shaped as :meth:`get_state`'s) as its own: sampling goes on
        exactly where it was saved, provided the envs are in their saved state too;
        ``live``: the callbacks' episodes under way then (:meth:`live_episodes`), else
        they start again from the latest observations."""
        raise self._cannot_checkpoint("restore")

    def live_episodes(self) -> list[Any]:
        """The per-step callbacks' episodes under way, one per env (none without)."""
        return []

    def restart_episodes(self, seeds: list[int]) -> None:
        """After :meth:`set_state` when the envs could not be restored: resets every env
        with ``seeds`` and starts a new episode in each (new ids, carries restarted)."""
        raise self._cannot_checkpoint("restore")

    def _cannot_checkpoint(self, what: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"EnvRunner.{what}(): the {type(self).__name__} cannot be checkpointed (it has "
            "no get_state/set_state/restart_episodes)."
        )


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
