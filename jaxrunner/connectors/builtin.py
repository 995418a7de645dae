"""The built-in connectors: observation normalization, frame stacking, reward scaling and
action rescaling. Each is a small frozen dataclass: copy one to write your own."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces

from jaxrunner.connectors.base import (
    ActionConnector,
    ConnectorState,
    ObsConnector,
    RewardConnector,
)
from jaxrunner.connectors.moments import Moments, RunningMoments
from jaxrunner.errors import InvalidArgumentError


def _box_shape(who: str, space: spaces.Space) -> tuple[int, ...]:
    if not isinstance(space, spaces.Box):
        raise InvalidArgumentError(
            f"{who}: expected a Box observation space, got {space!r}. Apply it to a Box "
            "(e.g. after a gymnasium FlattenObservation wrapper on the env)."
        )
    return tuple(space.shape)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NormalizeObservation(ObsConnector):
    """Running mean/std normalization: ``clip((obs - mean) / sqrt(var + epsilon))``.

    The statistics a sample uses are fixed for the whole sample; at its end, the
    moments of every observation of the sample (``Trajectory.obs``, the ones the
    policy acted on) are merged into them for the next sample (Chan et al.'s parallel
    variance). So the compiled step only normalizes, outputs never depend on how envs
    are grouped or batched, and the statistics equal the mean and (population)
    variance of every observation seen so far. Before any sample has ended they are
    mean 0, variance 1. It must be the first observation connector (its statistics
    are those of the env's observations).
    """

    clip: float | None = 10.0
    """Bound of the normalized values (None: no clipping)."""
    epsilon: float = 1e-8
    """Added to the variance."""
    frozen: bool = False
    """Use the statistics without updating them (evaluation)."""

    first_only: ClassVar[bool] = True

    def init(self, num_envs: int, obs_space: spaces.Space) -> ConnectorState:
        return ConnectorState(
            shared=RunningMoments.zeros(_box_shape("NormalizeObservation", obs_space))
        )

    def observation_space(self, space: spaces.Space) -> spaces.Space:
        bound = np.inf if self.clip is None else self.clip
        return spaces.Box(-bound, bound, _box_shape("NormalizeObservation", space), np.float32)

    def normalize(self, stats: Moments, obs: jax.Array) -> jax.Array:
        """``obs`` normalized with ``stats`` (any leading axes)."""
        # One rsqrt of [*shape], then multiplies: no division per row.
        scale = jax.lax.rsqrt(stats.var + self.epsilon)
        out = (jnp.asarray(obs, jnp.float32) - stats.mean) * scale
        return out if self.clip is None else jnp.clip(out, -self.clip, self.clip)

    def __call__(
        self, state: ConnectorState, obs: Any, episode_start: jax.Array, active: jax.Array
    ) -> tuple[Any, ConnectorState]:
        return self.normalize(state.shared.stats, obs), state

    def follow(self, state: ConnectorState, seen: Any, next_obs: Any) -> Any:
        return self.normalize(state.shared.stats, next_obs)

    def end_sample(self, state: ConnectorState, inputs: Any = None) -> ConnectorState:
        if self.frozen:
            return state
        obs = jnp.asarray(inputs, jnp.float32)
        batch = Moments.of(obs.reshape(-1, *obs.shape[2:]))
        return state.replace(shared=state.shared.add(batch))


@dataclasses.dataclass(frozen=True, kw_only=True)
class FrameStack(ObsConnector):
    """The last ``num_frames`` observations of each env, oldest first: ``[k, *shape]``.
    At an episode start the stack is filled with the first observation (never frames of
    the previous episode, never another env's)."""

    num_frames: int = 4

    def __post_init__(self) -> None:
        if (
            isinstance(self.num_frames, bool)
            or not isinstance(self.num_frames, int)
            or (self.num_frames < 1)
        ):
            raise InvalidArgumentError(
                f"FrameStack(num_frames={self.num_frames!r}): expected an int >= 1."
            )

    def init(self, num_envs: int, obs_space: spaces.Space) -> ConnectorState:
        shape = _box_shape("FrameStack", obs_space)
        dtype = jax.dtypes.canonicalize_dtype(obs_space.dtype)  # int64 -> int32 without x64
        stack = jnp.zeros((num_envs, self.num_frames, *shape), dtype)
        return ConnectorState(per_env=stack)

    def observation_space(self, space: spaces.Space) -> spaces.Space:
        _box_shape("FrameStack", space)
        k = self.num_frames
        return spaces.Box(
            np.repeat(space.low[None], k, 0), np.repeat(space.high[None], k, 0), dtype=space.dtype
        )

    def __call__(
        self, state: ConnectorState, obs: Any, episode_start: jax.Array, active: jax.Array
    ) -> tuple[Any, ConnectorState]:
        obs = jnp.asarray(obs)
        rolled = jnp.concatenate([state.per_env[:, 1:], obs[:, None]], axis=1)
        filled = jnp.broadcast_to(obs[:, None], rolled.shape)
        start = episode_start.reshape(-1, *([1] * (rolled.ndim - 1)))
        stack = jnp.where(start, filled, rolled)
        return stack, state.replace(per_env=stack)

    def follow(self, state: ConnectorState, seen: Any, next_obs: Any) -> Any:
        if seen is None:
            raise InvalidArgumentError(
                "FrameStack.follow: the stack of the next observation needs the stack the "
                "policy saw; put FrameStack last in Connectors(obs=...)."
            )
        return jnp.concatenate([seen[:, :, 1:], jnp.asarray(next_obs)[:, :, None]], axis=2)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScaleReward(RewardConnector):
    """Rewards divided by a running estimate of the std of the discounted return, as
    gymnasium's ``NormalizeReward``: per env ``ret = gamma * ret + reward`` (reset after
    an episode ends or an invalid slot), the statistics take in each step's returns of
    every valid env, then ``reward / sqrt(var + epsilon)``. The raw rewards stay in
    ``Trajectory.reward``; the scaled ones go to ``extras["scaled_reward"]``."""

    gamma: float = 0.99
    epsilon: float = 1e-8
    clip: float | None = None
    """Bound of the scaled rewards (None: no clipping)."""
    frozen: bool = False
    """Scale with the statistics without updating them."""

    def init(self, num_envs: int) -> ConnectorState:
        return ConnectorState(
            per_env=jnp.zeros(num_envs, jnp.float32), shared=RunningMoments.zeros(())
        )

    def __call__(
        self,
        state: ConnectorState,
        reward: jax.Array,
        terminated: jax.Array,
        truncated: jax.Array,
        valid: jax.Array,
    ) -> tuple[jax.Array, ConnectorState]:
        def step(carry: tuple[jax.Array, RunningMoments], xs: tuple) -> tuple[tuple, jax.Array]:
            ret, shared = carry
            r, term, trunc, ok = xs
            r = jnp.where(ok, r.astype(jnp.float32), 0.0)
            ret = jnp.where(ok, self.gamma * ret + r, 0.0)
            if not self.frozen:
                shared = shared.add(Moments.of(ret, ok))
            scaled = r / jnp.sqrt(shared.stats.var + self.epsilon)
            if self.clip is not None:
                scaled = jnp.clip(scaled, -self.clip, self.clip)
            ret = jnp.where(term | trunc | ~ok, 0.0, ret)
            return (ret, shared), scaled

        (ret, shared), scaled = jax.lax.scan(
            step, (state.per_env, state.shared), (reward, terminated, truncated, valid)
        )
        return scaled, ConnectorState(per_env=ret, shared=shared)


@dataclasses.dataclass(frozen=True)
class RescaleActions(ActionConnector):
    """Maps a policy's ``[-1, 1]`` actions to a Box's ``[low, high]``: clipped to
    ``[-1, 1]`` first, or squashed with ``tanh`` when ``squash``. Build it with
    :meth:`for_space`."""

    low: tuple
    high: tuple
    squash: bool = False

    @classmethod
    def for_space(cls, space: spaces.Space, squash: bool = False) -> RescaleActions:
        if not isinstance(space, spaces.Box) or not (
            np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))
        ):
            raise InvalidArgumentError(
                f"RescaleActions.for_space: expected a Box action space with finite bounds, "
                f"got {space!r}."
            )
        return cls(tuple(space.low.ravel().tolist()), tuple(space.high.ravel().tolist()), squash)

    def __call__(self, action: Any) -> Any:
        a = jnp.tanh(action) if self.squash else jnp.clip(action, -1.0, 1.0)
        low = jnp.asarray(self.low, action.dtype).reshape(action.shape[1:])
        high = jnp.asarray(self.high, action.dtype).reshape(action.shape[1:])
        return low + (a + 1.0) * 0.5 * (high - low)


__all__ = ["FrameStack", "NormalizeObservation", "RescaleActions", "ScaleReward"]
