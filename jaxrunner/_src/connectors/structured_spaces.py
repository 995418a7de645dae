"""The leaf spaces of a structured (``Dict``/``Tuple``) observation space, mapped and
rebuilt, for the observation connectors, which work leaf by leaf."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gymnasium import spaces

from jaxrunner._src.space_arrays.buffers import LEAF_SPACES
from jaxrunner.errors import InvalidArgumentError


def map_space(who: str, space: spaces.Space, fn: Callable[[spaces.Space], Any]) -> Any:
    """``fn`` applied to each leaf space of ``space``, in the shape of its observations
    (``Dict`` -> dict, ``Tuple`` -> tuple)."""
    if isinstance(space, spaces.Dict):
        return {key: map_space(who, sub, fn) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(map_space(who, sub, fn) for sub in space.spaces)
    if not isinstance(space, LEAF_SPACES):
        raise InvalidArgumentError(
            f"{who}: expected a Box, Discrete, MultiBinary or MultiDiscrete observation space "
            f"(or a Dict/Tuple of them), got {space!r}. Flatten it with a gymnasium "
            "observation wrapper first."
        )
    return fn(space)


def rebuild_space(space: spaces.Space, leaves: Any) -> spaces.Space:
    """A space of ``space``'s structure with the leaf spaces ``leaves`` (a
    :func:`map_space` result)."""
    if isinstance(space, spaces.Dict):
        return spaces.Dict(
            {key: rebuild_space(sub, leaves[key]) for key, sub in space.spaces.items()}
        )
    if isinstance(space, spaces.Tuple):
        return spaces.Tuple(
            tuple(rebuild_space(sub, leaf) for sub, leaf in zip(space.spaces, leaves))
        )
    return leaves
