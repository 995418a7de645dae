"""Checking one episode of a Minari dataset, as read or about to be written, and
building its Episode; the optional Minari import both directions need."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from gymnasium import spaces

from jaxrunner._src import space_arrays
from jaxrunner._src.core.episode import Episode
from jaxrunner.errors import InvalidArgumentError, MissingDependencyError


def import_minari() -> Any:
    try:
        import minari
    except ImportError as err:
        raise MissingDependencyError(
            'jaxrunner._src.services.datasets needs Minari: pip install "jaxrunner[minari]".'
        ) from err
    return minari


class EpisodeCheck:
    """Checks one stored episode (Minari's dict of its fields) and builds its Episode;
    errors name the episode (``where``) and the field, and end with ``fix``."""

    def __init__(
        self, where: str, fix: str = "write the dataset again from complete episodes"
    ) -> None:
        self.where, self.fix = where, fix

    def error(self, field: str, problem: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"{self.where}, field {field}: {problem}. The episode is inconsistent and is "
            f"refused; {self.fix}."
        )

    def episode(
        self, data: Any, index: int, obs_space: spaces.Space, action_space: spaces.Space
    ) -> Episode:
        if not isinstance(data, Mapping):
            raise self.error("(all)", f"expected Minari's episode dict, got {type(data).__name__}")
        reward = self.numeric(data.get("rewards"), "rewards", "biuf")
        if reward.ndim != 1:
            raise self.error("rewards", f"expected [L], got shape {list(reward.shape)}")
        bad = np.flatnonzero(~np.isfinite(reward))
        if len(bad):
            raise self.error("rewards", f"step {bad[0]} is {reward[bad[0]]}; expected finite")
        steps = len(reward)
        ends = [self.flags(data.get(key), key, steps) for key in ("terminations", "truncations")]
        # Observations as envs report them (jaxrunner keeps those past a Box's bounds).
        obs = self.in_space(data.get("observations"), obs_space, steps + 1, "observations", False)
        action = self.in_space(data.get("actions"), action_space, steps, "actions")
        infos = data.get("infos") or {}
        if not isinstance(infos, Mapping):
            raise self.error("infos", f"expected a dict, got {type(infos).__name__}")
        # The final row belongs to the final observation, where no action was taken.
        extras = self.rows(infos.get("extras", {}), steps + 1, "infos.extras")
        return Episode(
            obs=obs,
            action=action,
            reward=reward.astype(np.float64),
            extras=jax.tree.map(lambda x: x[:steps], extras),
            terminated=bool(steps and ends[0][-1]),
            truncated=bool(steps and ends[1][-1]),
            episode_id=self.constant(infos, "episode_id", steps + 1, index),
            env_id=self.constant(infos, "env_id", steps + 1, 0),
        )

    def numeric(self, value: Any, field: str, kinds: str) -> np.ndarray:
        array = np.asarray(value) if isinstance(value, np.ndarray | list | tuple) else None
        if array is None or array.dtype.kind not in kinds:
            got = type(value).__name__ if array is None else str(array.dtype)
            raise self.error(field, f"expected an array of dtype kind {kinds!r}, got {got}")
        return array

    def flags(self, value: Any, field: str, steps: int) -> np.ndarray:
        flags = self.numeric(value, field, "biu")
        if flags.shape != (steps,) or not np.isin(flags, (0, 1)).all():
            raise self.error(
                field,
                f"expected [{steps}] flags (one per reward), got {flags.dtype}{list(flags.shape)}",
            )
        early = np.flatnonzero(flags[:-1])
        if len(early):
            raise self.error(
                field, f"the episode ends at step {early[0]}, before its last step {steps - 1}"
            )
        return flags.astype(np.bool_)

    def in_space(
        self, value: Any, space: spaces.Space, rows: int, field: str, bounds: bool = True
    ) -> Any:
        """``value``: ``rows`` rows of ``space``, each in it (``bounds``: as
        :func:`rows_in_space`'s)."""
        if isinstance(space, spaces.Dict):
            if not isinstance(value, Mapping) or set(value) != set(space.spaces):
                got = sorted(value) if isinstance(value, Mapping) else type(value).__name__
                raise self.error(field, f"expected the keys {sorted(space.spaces)}, got {got}")
            return {
                k: self.in_space(value[k], sub, rows, f"{field}.{k}", bounds)
                for k, sub in space.items()
            }
        if isinstance(space, spaces.Tuple):
            if not isinstance(value, tuple | list) or len(value) != len(space.spaces):
                raise self.error(field, f"expected a tuple of {len(space.spaces)} parts")
            return tuple(
                self.in_space(v, sub, rows, f"{field}[{i}]", bounds)
                for i, (v, sub) in enumerate(zip(value, space.spaces))
            )
        array = self.numeric(value, field, "biuf")
        shape, _ = space_arrays.leaf_spec(space)
        if array.shape != (rows, *shape):
            raise self.error(
                field,
                f"expected {rows} rows of shape {list(shape)}, got "
                f"{array.dtype}{list(array.shape)}",
            )
        inside = space_arrays.rows_in_space(space, array, bounds)
        if not inside.all():
            row = int(np.flatnonzero(~inside)[0])
            raise self.error(field, f"row {row} ({array[row]!r}) is outside {space}")
        return array

    def rows(self, tree: Any, rows: int, field: str) -> Any:
        """A dict tree of arrays of ``rows`` rows (numeric)."""
        if isinstance(tree, Mapping):
            return {k: self.rows(v, rows, f"{field}.{k}") for k, v in tree.items()}
        array = self.numeric(tree, field, "biufc")
        if array.ndim < 1 or len(array) != rows:
            raise self.error(field, f"expected {rows} rows (one per observation), got shape "
                             f"{list(array.shape)}")  # fmt: skip
        return array

    def constant(self, infos: Mapping[str, Any], key: str, rows: int, default: int) -> int:
        """``infos[key]``: one int >= 0 repeated on every row (``default`` if absent)."""
        if key not in infos:
            return default
        array = self.numeric(infos[key], f"infos.{key}", "iu")
        if array.shape != (rows,) or (array != array[:1]).any() or (array < 0).any():
            raise self.error(
                f"infos.{key}",
                f"expected one int >= 0 on each of {rows} rows, got "
                f"{array.dtype}{list(array.shape)}",
            )
        return int(array[0])
