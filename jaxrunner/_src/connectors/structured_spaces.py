"""The leaf spaces of a structured (``Dict``/``Tuple``) observation space, mapped (and
rebuilt), for the observation connectors, which work leaf by leaf."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gymnasium import spaces

from jaxrunner._src.space_arrays.buffers import LEAF_SPACES
from jaxrunner.errors import InvalidArgumentError


def map_space(
    who: str, space: spaces.Space, fn: Callable[[spaces.Space], Any], *, as_space: bool = False
) -> Any:
    """``fn`` applied to each leaf space of ``space``, in the shape of its observations
    (``Dict`` -> dict, ``Tuple`` -> tuple); ``as_space``: ``fn`` returns leaf spaces, and
    they come back as a space of ``space``'s structure."""
    if isinstance(space, spaces.Dict):
        out = {key: map_space(who, sub, fn, as_space=as_space) for key, sub in space.items()}
        return spaces.Dict(out) if as_space else out
    if isinstance(space, spaces.Tuple):
        parts = tuple(map_space(who, sub, fn, as_space=as_space) for sub in space.spaces)
        return spaces.Tuple(parts) if as_space else parts
    if not isinstance(space, LEAF_SPACES):
        raise InvalidArgumentError(
            f"{who}: expected a Box, Discrete, MultiBinary or MultiDiscrete observation space "
            f"(or a Dict/Tuple of them), got {space!r}. Flatten it with a gymnasium "
            "observation wrapper first."
        )
    return fn(space)
