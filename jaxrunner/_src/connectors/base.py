"""What a connector is: a pure, stateful transform between the env and the policy, of
observations and actions inside the compiled policy step, of rewards once per sample."""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import flax.struct
import jax
from gymnasium import spaces


class ConnectorState(flax.struct.PyTreeNode):
    """One connector's state.

    Attributes:
        per_env: pytree of ``[num_envs, ...]`` leaves (rows gathered and scattered by the
            runner), or None.
        shared: pytree shared by every env (statistics), or None.
    """

    per_env: Any = None
    shared: Any = None


class ObsConnector(abc.ABC):
    """Transforms observations before the policy sees them, once per policy step, inside
    the compiled step. A call sees only the rows of the envs it computes (an agent group's
    row ``b * A_g + a`` is agent ``a`` of env ``b``); ``shared`` may take in only rows where
    ``active`` is true. Subclasses are frozen dataclasses (hashable, picklable); only
    :meth:`init` and :meth:`__call__` are required (docs/connectors.md, "Your own").
    """

    first_only: ClassVar[bool] = False
    """True for a connector that must come first: its :meth:`end_sample` reads its
    inputs over the sample, which are then the Trajectory's observations."""

    @abc.abstractmethod
    def init(self, num_envs: int, obs_space: spaces.Space) -> ConnectorState:
        """The state for ``num_envs`` envs whose observations live in ``obs_space``
        (the space the connector receives: the env's, or the previous connector's)."""

    @abc.abstractmethod
    def __call__(
        self, state: ConnectorState, obs: Any, episode_start: jax.Array, active: jax.Array
    ) -> tuple[Any, ConnectorState]:
        """One step of ``N`` rows: ``obs`` ``[N, ...]``, ``episode_start`` and ``active``
        ``[N]`` bool, ``state.per_env`` the rows' own ``[N, ...]``. Returns what the
        policy sees and the new state; ``shared`` may only change from active rows."""

    def observation_space(self, space: spaces.Space) -> spaces.Space:
        """The space of what this connector outputs, given its input ``space`` (the
        policy is initialised on the last connector's)."""
        return space

    def follow(self, state: ConnectorState, seen: Any, next_obs: Any) -> Any:
        """What the policy would see of ``next_obs`` ``[T, B, ...]`` (for bootstrap
        values); ``seen``: this connector's output at the same steps when it is the
        chain's last (else None). Default: applied without episode starts, state dropped."""
        num_envs = jax.tree.leaves(next_obs)[0].shape[1]
        flags = jax.numpy.zeros(num_envs, bool)
        return jax.vmap(lambda x: self(state, x, flags, flags)[0])(next_obs)

    def end_sample(
        self, state: ConnectorState, inputs: Any = None, valid: jax.Array | None = None
    ) -> ConnectorState:
        """Called once at the end of each sample (jitted), after :meth:`follow`, e.g. to
        fold the sample into the statistics. ``inputs``: the ``[T, B, ...]`` observations
        it received when it is the first connector (``Trajectory.obs``), else None;
        ``valid`` (``[T, B]``, None for all): the rows of ``inputs`` to take in."""
        return state


class ActionConnector(abc.ABC):
    """Transforms the policy's action into the env's (pure, stateless, jitted)."""

    @abc.abstractmethod
    def __call__(self, action: Any) -> Any:
        """``[N, ...]`` actions as sampled -> ``[N, ...]`` actions for the env."""


class RewardConnector(abc.ABC):
    """Transforms a sample's rewards, once per sample (pure, jitted)."""

    @abc.abstractmethod
    def init(self, num_envs: int) -> ConnectorState:
        """The state for ``num_envs`` envs."""

    def restart(self, state: ConnectorState) -> ConnectorState:
        """``state`` as every env starts a new episode outside a sample (a restore that
        restarts the episodes under way): default, ``per_env`` zeroed; ``shared`` kept."""
        return state.replace(per_env=jax.tree.map(jax.numpy.zeros_like, state.per_env))

    @abc.abstractmethod
    def __call__(
        self,
        state: ConnectorState,
        reward: jax.Array,
        terminated: jax.Array,
        truncated: jax.Array,
        valid: jax.Array,
    ) -> tuple[jax.Array, ConnectorState]:
        """``[T, B]`` raw rewards and flags -> ``[T, B]`` transformed rewards and the new
        state (``per_env`` the full ``[B, ...]``). ``valid`` marks the slots holding a
        transition; an invalid slot ends no episode (one cut there is flagged ``truncated``)."""
