"""NormalizeObservation: observations standardized by running statistics per ``Box`` leaf."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces

from jaxrunner._src.connectors.base import ConnectorState, ObsConnector
from jaxrunner._src.connectors.checks import check_statistics_args
from jaxrunner._src.connectors.moments import Moments, RunningMoments
from jaxrunner._src.connectors.structured_spaces import map_space
from jaxrunner.errors import InvalidArgumentError


def _is_stats(x: object) -> bool:
    """A leaf of NormalizeObservation's shared state: statistics, or None (not a Box)."""
    return x is None or isinstance(x, RunningMoments)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NormalizeObservation(ObsConnector):
    """Running mean/std normalization: ``clip((obs - mean) / std)``, where ``std`` is
    ``sqrt(var + epsilon)`` clamped to ``[min_std, max_std]`` (brax's bounds), and 1
    while the variance is 0 (before any sample, or a feature constant so far).

    A sample uses fixed statistics; at its end the observations the policy acted on (an
    agent group's valid slots only; never a row with a NaN or an infinity) are merged
    into them. Before any sample has ended they are mean 0, variance 1 (see
    :meth:`~jaxrunner.connectors.Connectors.prime`). It must be the first observation
    connector. ``Dict`` and ``Tuple`` observations: each ``Box`` leaf has statistics of
    its own (``shared`` has the observation's structure, None at non-Box leaves) and
    becomes a float32 Box; other leaves pass through unchanged; a space without any
    ``Box`` leaf is refused. See docs/connectors.md ("When the statistics change").
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
        check_statistics_args("NormalizeObservation", self)

    def init(self, num_envs: int, obs_space: spaces.Space) -> ConnectorState:
        def stats(leaf: spaces.Space) -> RunningMoments | None:
            if not isinstance(leaf, spaces.Box):
                return None
            return RunningMoments.zeros(leaf.shape, self.count_dtype, self.frozen)

        shared = map_space("NormalizeObservation", obs_space, stats)
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

        return map_space("NormalizeObservation", space, out, as_space=True)

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

        def structure(got: str) -> InvalidArgumentError:
            return InvalidArgumentError(
                "NormalizeObservation.prime(obs=...): expected observations structured as the "
                f"observation space (as the statistics are): {got}"
            )

        def check(running: RunningMoments | None, leaf: Any) -> None:
            shape = None if running is None else tuple(running.stats.mean.shape)
            if isinstance(leaf, Mapping):  # (jax.tree.map takes a dict for a stats leaf)
                raise structure(f"a dict where the space has an array of shape {shape}")
            if shape is not None and (not np.ndim(leaf) or np.shape(leaf)[1:] != shape):
                raise InvalidArgumentError(
                    f"NormalizeObservation.prime(obs=...): expected N observations of shape "
                    f"{shape} stacked on a first axis, got shape {np.shape(leaf)}; pass env "
                    "observations as [N, ...] (one observation: obs[None])."
                )

        try:
            jax.tree.map(check, state.shared, obs, is_leaf=_is_stats)
        except InvalidArgumentError:
            raise
        except ValueError as err:  # jax.tree.map: another structure than the statistics'
            raise structure(str(err)) from None
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
