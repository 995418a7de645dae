"""What a wrapped gymnasium vector env returns, checked: its errors as ``EnvError``, its
observations, rewards and flags copied into the adapter's buffers only where they fit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner.errors import EnvError, InvalidArgumentError, InvalidStepError, SpaceMismatchError


def check_finite_rewards(reward: np.ndarray, name: str, env_ids: Any = None) -> None:
    """Raises naming the first sub-env (its row, or ``env_ids[row]``) whose reward from
    the wrapped ``name`` is NaN or infinite."""
    finite = np.isfinite(reward)
    if not finite.all():
        row = int(np.flatnonzero(~finite)[0])
        raise InvalidStepError(
            f"the wrapped {name} returned a non-finite reward ({reward[row]}) for sub-env "
            f"{row if env_ids is None else env_ids[row]}; expected finite floats."
        )


class WrappedOutputs:
    """The calls into ``env`` and the checked stores of what it returns, for an adapter
    that keeps its own observation, reward and flag buffers."""

    # Set by the adapter in __init__.
    env: Any
    num_envs: int
    single_observation_space: gymnasium.Space
    _reward: np.ndarray
    _terminated: np.ndarray
    _truncated: np.ndarray

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except InvalidArgumentError:
            raise
        except Exception as err:
            raise EnvError(
                f"the wrapped {type(self.env).__name__} raised in {what}(): {err!r}", -1
            ) from err

    def _store(self, dst: Any, obs: Any, call: str) -> None:

        def check(buffer: np.ndarray, value: Any) -> None:
            if (
                not isinstance(value, np.ndarray)
                or value.dtype != buffer.dtype
                or value.shape != buffer.shape
            ):
                raise space_arrays.mismatch(
                    f"the wrapped {type(self.env).__name__} returned observations from {call}()",
                    f"an ndarray of dtype {buffer.dtype} and shape {buffer.shape} (its space)",
                    value,
                    f"{space_arrays.NEVER_CAST}: fix the env or wrap it.",
                )
            buffer[...] = value

        try:
            space_arrays.map_structure(self.single_observation_space, check, dst, obs)
        except (KeyError, IndexError, TypeError) as err:
            raise SpaceMismatchError(
                f"the wrapped {type(self.env).__name__} returned observations from {call}() "
                f"that do not match {self.single_observation_space}: {err!r}"
            ) from err

    def _store_rows(self, dst: Any, obs: Any, indices: np.ndarray, call: str) -> None:
        sub = space_arrays.allocate(self.single_observation_space, (len(indices),))
        self._store(sub, obs, call)
        space_arrays.copy_into(self.single_observation_space, dst, sub, indices)

    def _store_flags(self, reward: Any, terminated: Any, truncated: Any) -> None:
        n, name = self.num_envs, type(self.env).__name__
        reward = np.asarray(reward)
        if reward.shape != (n,) or reward.dtype.kind not in "iuf":
            raise InvalidStepError(
                f"the wrapped {name} returned rewards of dtype {reward.dtype} and shape "
                f"{reward.shape}; expected {n} real numbers."
            )
        self._reward[:] = reward
        check_finite_rewards(self._reward, name)
        for flag, dst in (("terminated", self._terminated), ("truncated", self._truncated)):
            value = terminated if flag == "terminated" else truncated
            if not isinstance(value, np.ndarray) or value.dtype != np.bool_ or value.shape != (n,):
                got = (
                    f"an array of dtype {value.dtype} and shape {value.shape}"
                    if isinstance(value, np.ndarray)
                    else type(value).__name__
                )
                raise InvalidStepError(
                    f"the wrapped {name} returned {flag} as {got}; expected a bool array of "
                    f"shape ({n},)."
                )
            dst[:] = value
