"""The built-in connectors: observation normalization, frame stacking, reward scaling and
action rescaling. Each is a small frozen dataclass: copy one to write your own.

Structured observations (``Dict`` and ``Tuple`` spaces, nested freely) are handled leaf
by leaf: :class:`NormalizeObservation` keeps statistics per ``Box`` leaf and passes other
leaves (``Discrete``, ``MultiBinary``, ``MultiDiscrete``) through unchanged;
:class:`FrameStack` stacks every leaf.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces

from jaxrunner._src.connectors.base import (
    ActionConnector,
    ConnectorState,
    ObsConnector,
    RewardConnector,
)
from jaxrunner._src.connectors.checks import (
    check_count_dtype,
    check_flag,
    check_number,
    check_std_bounds,
)
from jaxrunner._src.connectors.moments import Moments, RunningMoments
from jaxrunner._src.space_arrays.buffers import leaf_spec
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError

_LEAVES = (spaces.Box, spaces.Discrete, spaces.MultiBinary, spaces.MultiDiscrete)


def _map_space(who: str, space: spaces.Space, fn: Callable[[spaces.Space], Any]) -> Any:
    """``fn`` applied to each leaf space of ``space``, in the shape of its observations
    (``Dict`` -> dict, ``Tuple`` -> tuple)."""
    if isinstance(space, spaces.Dict):
        return {key: _map_space(who, sub, fn) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_map_space(who, sub, fn) for sub in space.spaces)
    if not isinstance(space, _LEAVES):
        raise InvalidArgumentError(
            f"{who}: expected a Box, Discrete, MultiBinary or MultiDiscrete observation space "
            f"(or a Dict/Tuple of them), got {space!r}. Flatten it with a gymnasium "
            "observation wrapper first."
        )
    return fn(space)


def _rebuild(space: spaces.Space, leaves: Any) -> spaces.Space:
    """A space of ``space``'s structure with the leaf spaces ``leaves`` (a
    :func:`_map_space` result)."""
    if isinstance(space, spaces.Dict):
        return spaces.Dict({key: _rebuild(sub, leaves[key]) for key, sub in space.spaces.items()})
    if isinstance(space, spaces.Tuple):
        return spaces.Tuple(tuple(_rebuild(sub, leaf) for sub, leaf in zip(space.spaces, leaves)))
    return leaves


def _is_stats(x: object) -> bool:
    """A leaf of NormalizeObservation's shared state: statistics, or None (not a Box)."""
    return x is None or isinstance(x, RunningMoments)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NormalizeObservation(ObsConnector):
    """Running mean/std normalization: ``clip((obs - mean) / std)``, where ``std`` is
    ``sqrt(var + epsilon)`` clamped to ``[min_std, max_std]`` (brax's bounds), and 1
    while the variance is 0 (before any sample, or a feature constant so far).

    The statistics a sample uses are fixed for the whole sample; at its end, the
    moments of every observation of the sample (``Trajectory.obs``, the ones the
    policy acted on; for an agent group, its valid slots only) are merged into them
    for the next sample (Chan et al.'s parallel variance). So the compiled step only
    normalizes, outputs never depend on how envs are grouped or batched, and the
    statistics equal the mean and (population) variance of every observation seen so
    far. Before any sample has ended they are mean 0, variance 1: prime them from a
    few random steps with :meth:`~jaxrunner.connectors.Connectors.prime` so the first
    sample is normalized too. It must be the first observation connector (its
    statistics are those of the env's observations).

    The one exception: EnvPool's async mode (``make_vec(..., backend="envpool",
    batch_size=k)``) keeps stepping envs up to one sample ahead, so the steps that open
    a sample's Trajectory may have been computed during the previous sample, with its
    statistics, one sample older (and a ``set_connector_state`` between samples reaches
    them one sample late). ``policy_obs`` keeps what the policy saw, so log-probs stay
    exact. Every other sampler (lockstep, scan, Ray's and the process backend's
    ready-first) ends each sample with nothing in flight.

    An observation row holding a NaN or an infinity is never taken into the
    statistics (host backends refuse it earlier, as an invalid step: see the README).

    ``Dict`` and ``Tuple`` observations: each ``Box`` leaf has statistics of its own
    (``shared`` is then a dict/tuple of the observation's structure, with a
    :class:`RunningMoments` per ``Box`` leaf and None elsewhere) and is normalized to a
    float32 Box; ``Discrete``, ``MultiBinary`` and ``MultiDiscrete`` leaves pass through
    with their values unchanged (as JAX arrays: 64-bit integers come back int32 unless
    ``jax_enable_x64``). A space without any ``Box`` leaf is refused.
    """

    clip: float | None = 10.0
    """Bound of the normalized values (> 0; None: no clipping)."""
    epsilon: float = 1e-8
    """Added to the variance (>= 0)."""
    min_std: float = 1e-6
    """Smallest std divided by (> 0): a feature that barely varies is not blown up."""
    max_std: float = 1e6
    """Largest std divided by (>= min_std)."""
    count_dtype: str = "float32"
    """Dtype of the statistics' count: ``"float32"`` counts exactly to 2**24
    observations, ``"int32"`` to 2**31 - 1, ``"float64"``/``"int64"`` (with
    ``jax_enable_x64``) far beyond."""
    frozen: bool = False
    """Start with the statistics frozen (evaluation); :func:`freeze` and
    :func:`unfreeze` change it at run time, through ``runner.set_connector_state``."""

    first_only: ClassVar[bool] = True

    def __post_init__(self) -> None:
        who = "NormalizeObservation"
        check_number(who, "clip", self.clip, low=0.0, low_open=True, optional=True)
        check_std_bounds(who, self.epsilon, self.min_std, self.max_std)
        check_count_dtype(who, self.count_dtype)
        check_flag(who, "frozen", self.frozen)

    def init(self, num_envs: int, obs_space: spaces.Space) -> ConnectorState:
        def stats(leaf: spaces.Space) -> RunningMoments | None:
            if not isinstance(leaf, spaces.Box):
                return None
            return RunningMoments.zeros(leaf.shape, self.count_dtype, self.frozen)

        shared = _map_space("NormalizeObservation", obs_space, stats)
        if all(x is None for x in jax.tree.leaves(shared, is_leaf=_is_stats)):
            raise InvalidArgumentError(
                f"NormalizeObservation: expected a Box observation space, or a Dict/Tuple with "
                f"at least one Box leaf, got {obs_space!r} (nothing to normalize). Drop the "
                "connector, or apply it to an env with Box observations."
            )
        return ConnectorState(shared=shared)

    def observation_space(self, space: spaces.Space) -> spaces.Space:
        bound = np.inf if self.clip is None else self.clip

        def out(leaf: spaces.Space) -> spaces.Space:
            if not isinstance(leaf, spaces.Box):
                return leaf
            return spaces.Box(-bound, bound, leaf.shape, np.float32)

        return _rebuild(space, _map_space("NormalizeObservation", space, out))

    def normalize(self, stats: Moments, obs: jax.Array) -> jax.Array:
        """``obs`` normalized with ``stats`` (any leading axes)."""
        scale = stats.inverse_std(self.epsilon, self.min_std, self.max_std)
        out = (jnp.asarray(obs, jnp.float32) - stats.mean) * scale
        return out if self.clip is None else jnp.clip(out, -self.clip, self.clip)

    def denormalize(self, stats: Moments, normalized: jax.Array) -> jax.Array:
        """The inverse of :meth:`normalize` (brax's ``denormalize``): ``normalized * std +
        mean``; exact where :meth:`normalize` did not clip."""
        scale = stats.inverse_std(self.epsilon, self.min_std, self.max_std)
        return jnp.asarray(normalized, jnp.float32) / scale + stats.mean

    def _apply(self, shared: Any, obs: Any, fn: Callable[[Moments, Any], Any]) -> Any:
        """``obs`` (any leading axes) with ``fn`` applied to each Box leaf."""

        def one(running: RunningMoments | None, leaf: Any) -> Any:
            return leaf if running is None else fn(running.stats, leaf)

        return jax.tree.map(one, shared, obs, is_leaf=_is_stats)

    def __call__(
        self, state: ConnectorState, obs: Any, episode_start: jax.Array, active: jax.Array
    ) -> tuple[Any, ConnectorState]:
        return self._apply(state.shared, obs, self.normalize), state

    def follow(self, state: ConnectorState, seen: Any, next_obs: Any) -> Any:
        return self._apply(state.shared, next_obs, self.normalize)

    def invert(self, state: ConnectorState, normalized: Any) -> Any:
        """:meth:`denormalize` over a whole (structured) observation, with the
        statistics in ``state`` (e.g. ``runner.get_connector_state().obs[0]``)."""
        return self._apply(state.shared, normalized, self.denormalize)

    def end_sample(
        self, state: ConnectorState, inputs: Any = None, valid: jax.Array | None = None
    ) -> ConnectorState:
        mask = None if valid is None else valid.reshape(-1)
        return self._take_in(state, inputs, 2, mask, force=False)

    def prime(self, state: ConnectorState, obs: Any) -> ConnectorState:
        """``state`` with the observations ``obs`` (``[N, ...]`` env observations, e.g.
        from a few random steps) merged into the statistics, frozen or not."""
        return self._take_in(state, obs, 1, None, force=True)

    def _take_in(
        self, state: ConnectorState, obs: Any, batch: int, mask: Any, *, force: bool
    ) -> ConnectorState:
        def one(running: RunningMoments | None, leaf: Any) -> RunningMoments | None:
            if running is None:
                return None
            x = jnp.asarray(leaf, jnp.float32)
            x = x.reshape(-1, *x.shape[batch:])
            return running.add(Moments.of(x, mask, self.count_dtype), force=force)

        return state.replace(shared=jax.tree.map(one, state.shared, obs, is_leaf=_is_stats))


def _stacked_space(leaf: spaces.Space, k: int) -> spaces.Box:
    """The space of ``k`` stacked observations of a leaf space (a Box of its bounds)."""
    shape, dtype = leaf_spec(leaf)
    if isinstance(leaf, spaces.Box):
        low, high = leaf.low, leaf.high
    elif isinstance(leaf, spaces.Discrete):
        low, high = np.asarray(leaf.start), np.asarray(leaf.start + leaf.n - 1)
    elif isinstance(leaf, spaces.MultiDiscrete):
        low, high = np.asarray(leaf.start), np.asarray(leaf.start + leaf.nvec - 1)
    else:  # MultiBinary
        low, high = np.zeros(shape), np.ones(shape)
    low = np.broadcast_to(np.asarray(low, dtype), shape)
    high = np.broadcast_to(np.asarray(high, dtype), shape)
    return spaces.Box(np.repeat(low[None], k, 0), np.repeat(high[None], k, 0), dtype=dtype)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FrameStack(ObsConnector):
    """The last ``num_frames`` observations of each env, oldest first: ``[k, *shape]``.
    At an episode start the stack is filled with the first observation (never frames of
    the previous episode, never another env's; for an agent group, never another
    agent's).

    ``Dict`` and ``Tuple`` observations are stacked leaf by leaf (each leaf
    ``[k, *shape]``); a ``Discrete``, ``MultiBinary`` or ``MultiDiscrete`` leaf becomes a
    ``Box`` of its bounds and dtype (``k`` values of a ``Discrete``: ``Box`` of shape
    ``(k,)``).
    """

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
        def zeros(leaf: spaces.Space) -> jax.Array:
            shape, dtype = leaf_spec(leaf)
            dtype = jax.dtypes.canonicalize_dtype(dtype)  # int64 -> int32 without x64
            return jnp.zeros((num_envs, self.num_frames, *shape), dtype)

        return ConnectorState(per_env=_map_space("FrameStack", obs_space, zeros))

    def observation_space(self, space: spaces.Space) -> spaces.Space:
        k = self.num_frames
        return _rebuild(space, _map_space("FrameStack", space, lambda s: _stacked_space(s, k)))

    def __call__(
        self, state: ConnectorState, obs: Any, episode_start: jax.Array, active: jax.Array
    ) -> tuple[Any, ConnectorState]:
        def one(old: jax.Array, leaf: Any) -> jax.Array:
            leaf = jnp.asarray(leaf, old.dtype)
            rolled = jnp.concatenate([old[:, 1:], leaf[:, None]], axis=1)
            filled = jnp.broadcast_to(leaf[:, None], rolled.shape)
            start = episode_start.reshape(-1, *([1] * (rolled.ndim - 1)))
            return jnp.where(start, filled, rolled)

        stack = jax.tree.map(one, state.per_env, obs)
        return stack, state.replace(per_env=stack)

    def follow(self, state: ConnectorState, seen: Any, next_obs: Any) -> Any:
        if seen is None:
            raise InvalidArgumentError(
                "FrameStack.follow: the stack of the next observation needs the stack the "
                "policy saw; put FrameStack last in Connectors(obs=...)."
            )

        def one(stack: jax.Array, leaf: Any) -> jax.Array:
            leaf = jnp.asarray(leaf, stack.dtype)
            return jnp.concatenate([stack[:, :, 1:], leaf[:, :, None]], axis=2)

        return jax.tree.map(one, seen, next_obs)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScaleReward(RewardConnector):
    """Rewards divided by a running estimate of the std of the discounted return, as
    gymnasium's ``NormalizeReward``: per env (per agent slot in a group) ``ret = gamma *
    ret + reward`` at each valid slot (an invalid slot, e.g. an agent waiting for its
    turn, leaves it as it is), reset where an episode ended; the statistics take in each
    step's returns of every valid slot, then ``reward / std`` (0 at invalid slots), with
    ``std`` as :class:`NormalizeObservation`'s (``sqrt(var + epsilon)`` clamped to
    ``[min_std, max_std]``, 1 while the variance is 0). The raw rewards stay in
    ``Trajectory.reward``; the scaled ones go to ``extras["scaled_reward"]``.

    Where it differs from gymnasium's ``NormalizeReward``: the return restarts after
    every episode end, truncation included (gymnasium carries it over a truncation;
    baselines' ``VecNormalize`` restarts it as here), and a zero variance scales by 1,
    not by ``1 / sqrt(epsilon)``. CleanRL's recipe (clip the scaled rewards to +-10) is
    :meth:`cleanrl`."""

    gamma: float = 0.99
    """Discount of the return whose std scales the rewards, in [0, 1]."""
    epsilon: float = 1e-8
    """Added to the variance (>= 0)."""
    clip: float | None = None
    """Bound of the scaled rewards (> 0; None: no clipping)."""
    min_std: float = 1e-6
    """Smallest std divided by (> 0)."""
    max_std: float = 1e6
    """Largest std divided by (>= min_std)."""
    count_dtype: str = "float32"
    """Dtype of the statistics' count (see :class:`NormalizeObservation`)."""
    frozen: bool = False
    """Start with the statistics frozen; :func:`freeze`/:func:`unfreeze` at run time."""

    def __post_init__(self) -> None:
        who = "ScaleReward"
        check_number(who, "gamma", self.gamma, low=0.0, high=1.0)
        check_number(who, "clip", self.clip, low=0.0, low_open=True, optional=True)
        check_std_bounds(who, self.epsilon, self.min_std, self.max_std)
        check_count_dtype(who, self.count_dtype)
        check_flag(who, "frozen", self.frozen)

    @classmethod
    def cleanrl(cls, gamma: float = 0.99) -> ScaleReward:
        """CleanRL's reward recipe (``NormalizeReward(gamma)`` then rewards clipped to
        +-10): ``ScaleReward(gamma=gamma, clip=10.0)``."""
        return cls(gamma=gamma, clip=10.0)

    def init(self, num_envs: int) -> ConnectorState:
        return ConnectorState(
            per_env=jnp.zeros(num_envs, jnp.float32),
            shared=RunningMoments.zeros((), self.count_dtype, self.frozen),
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
            ret = jnp.where(ok, self.gamma * ret + r, ret)
            shared = shared.add(Moments.of(ret, ok, self.count_dtype))
            scale = shared.stats.inverse_std(self.epsilon, self.min_std, self.max_std)
            scaled = r * scale
            if self.clip is not None:
                scaled = jnp.clip(scaled, -self.clip, self.clip)
            ret = jnp.where(term | trunc, 0.0, ret)
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

    def __post_init__(self) -> None:
        who = "RescaleActions"
        check_flag(who, "squash", self.squash)
        try:
            low = np.asarray(self.low, np.float64)
            high = np.asarray(self.high, np.float64)
        except (TypeError, ValueError) as err:
            raise InvalidArgumentTypeError(
                f"{who}(low=..., high=...): expected tuples of numbers, got {self.low!r:.60} "
                f"and {self.high!r:.60}. Build it with RescaleActions.for_space(space)."
            ) from err
        if low.shape != high.shape or low.ndim != 1:
            raise InvalidArgumentError(
                f"{who}(low=..., high=...): expected two flat tuples of the same length, got "
                f"shapes {low.shape} and {high.shape}. Build it with RescaleActions.for_space."
            )
        if not (np.isfinite(low).all() and np.isfinite(high).all() and (low <= high).all()):
            raise InvalidArgumentError(
                f"{who}(low={self.low!r:.60}, high={self.high!r:.60}): expected finite bounds "
                "with low <= high."
            )

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
