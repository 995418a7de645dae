"""Pickles of sub-envs as they are, for exact resume from a checkpoint
(``EzPickle`` envs taken by their attributes). See docs/checkpoints.md."""

from __future__ import annotations

import io
import pickle
import sys
from typing import Any

from gymnasium.utils import EzPickle

from jaxrunner._src.arg_checks import is_int
from jaxrunner.errors import InvalidArgumentError


class SnapshotRefusedError(InvalidArgumentError):
    """``restore_sub_envs`` refused snapshot ``index`` (``problem`` says why, for a
    caller that names the snapshot otherwise: a checkpoint's ``envs/<index>``); the
    sub-envs are left as they were."""

    def __init__(self, index: int, problem: str) -> None:
        super().__init__(
            f"restore_sub_envs(snapshots=...): snapshot {index} {problem}; the sub-envs are "
            "left as they were. Pass the bytes snapshot_sub_envs() returned."
        )
        self.index, self.problem = index, problem


class _StatePickler(pickle.Pickler):
    """Pickles :class:`~gymnasium.utils.EzPickle` objects (PettingZoo's classic games,
    MPE) by their attributes: EzPickle pickles the constructor's arguments, so an
    unpickled env would be a new, unreset one, not the env as it was. Render resources
    that do not pickle (:func:`_render_resource`) are rebuilt blank."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, type):
            return NotImplemented
        if isinstance(obj, EzPickle):
            # State set by _set_attributes, never EzPickle.__setstate__ (which rebuilds).
            return _new, (type(obj),), dict(vars(obj)), None, None, _set_attributes
        return _render_resource(obj) or NotImplemented


def _render_resource(obj: Any) -> tuple[Any, tuple[Any, ...]] | None:
    """How to rebuild a pygame canvas or font (MPE makes both at construction; only
    ``render()`` uses them, and it redraws the canvas whole): a blank ``Surface`` of the
    size, the ``Font`` from its file. None for anything else."""
    pygame = sys.modules.get("pygame")
    if pygame is not None and type(obj) is pygame.Surface:
        return pygame.Surface, (obj.get_size(),)
    freetype = sys.modules.get("pygame.freetype")
    if freetype is not None and type(obj) is freetype.Font:
        return freetype.Font, (obj.path, obj.size)
    return None


def _new(cls: Any) -> Any:
    return cls.__new__(cls)


def _set_attributes(obj: Any, state: dict[str, Any]) -> None:
    obj.__dict__.update(state)


def snapshot_dumps(value: Any) -> bytes:
    """``value`` pickled with EzPickle objects taken by their state (see the module
    docstring); ``pickle.loads`` reads it."""
    buffer = io.BytesIO()
    _StatePickler(buffer, pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


def valid_restart_state(restarts: Any) -> bool:
    """``restarts`` is a sub-env's restart state as snapshots hold it: ``(last reset
    seed or None, restarts since >= 0)``."""
    ok = isinstance(restarts, tuple) and len(restarts) == 2
    return ok and (restarts[0] is None or is_int(restarts[0], 0)) and is_int(restarts[1], 0)
