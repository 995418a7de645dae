"""RescaleActions: a policy's ``[-1, 1]`` actions mapped to a Box's bounds."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np
from gymnasium import spaces

from jaxrunner._src.arg_checks import check_bool
from jaxrunner._src.connectors.base import ActionConnector
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError


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
        check_bool(who, "squash", self.squash)
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
        return jnp.clip(low + (a + 1.0) * 0.5 * (high - low), low, high)  # rounding may pass them
