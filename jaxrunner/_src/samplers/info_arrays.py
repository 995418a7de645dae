"""Per-step infos as ``[T, B]`` arrays, for ``EnvRunner(..., info_keys=...)``."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrunner.errors import InvalidArgumentError

INFOS = "infos"
"""``traj.extras[INFOS][name]``: the float64 ``[T, B]`` values of info entry ``name``."""
INFOS_PRESENT = "infos_present"
"""``traj.extras[INFOS_PRESENT][name]``: where the step's info had entry ``name``."""

_MISSING = object()


def check_info_keys(info_keys: Any) -> tuple[str, ...]:
    """``info_keys`` as a tuple of distinct non-empty strings, or a clear refusal."""
    if isinstance(info_keys, str) or not isinstance(info_keys, Sequence):
        raise InvalidArgumentError(
            f"EnvRunner(info_keys={info_keys!r}): expected a sequence of info entry names, "
            'e.g. ("lives", "episode.r").'
        )
    keys = tuple(info_keys)
    bad = [k for k in keys if not isinstance(k, str) or not k]
    if bad or len(set(keys)) != len(keys):
        raise InvalidArgumentError(
            f"EnvRunner(info_keys={info_keys!r}): names must be distinct non-empty strings"
            + (f"; got {bad!r}." if bad else "; some are repeated.")
        )
    return keys


class InfoRecorder:
    """Records the named entries of each step's infos into a trajectory buffer's
    extras: float64 ``[T, B]`` values and masks; a
    dotted name reaches into a dict entry, and where an episode ended the info is the
    final step's."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        self.keys = keys
        self._unseen = set(keys)
        """The names no step's info has had yet (checked by :meth:`check_reported`)."""
        self._reported: set[str] = set()
        """Every name the infos had, gathered while some are unseen (for the error)."""

    def allocate(self, extras: dict[str, Any], shape: tuple[int, int]) -> None:
        """Adds zeroed ``[T, B]`` arrays for every name to a new buffer's ``extras``."""
        clash = {INFOS, INFOS_PRESENT} & set(extras)
        if clash:
            raise InvalidArgumentError(
                f"EnvRunner(info_keys=...): the policy's extras already have {sorted(clash)}, "
                "where the infos are recorded; rename that policy output."
            )
        extras[INFOS] = {k: np.zeros(shape, np.float64) for k in self.keys}
        extras[INFOS_PRESENT] = {k: np.zeros(shape, np.bool_) for k in self.keys}

    def clear(self, extras: dict[str, Any]) -> None:
        """Zeroes a reused buffer's arrays (a sample writes only the entries present)."""
        for key in self.keys:
            extras[INFOS][key].fill(0.0)
            extras[INFOS_PRESENT][key].fill(False)

    def record(
        self, extras: dict[str, Any], t: Any, envs: Sequence[int], infos: Sequence[dict]
    ) -> None:
        """Step ``t`` (an int, or one step index per env) of sub-envs ``envs``, whose
        infos are ``infos`` in the same order, into the buffer whose extras are
        ``extras``."""
        steps = np.broadcast_to(np.asarray(t), (len(envs),)).tolist()
        if self._unseen:
            for info in infos:
                self._reported.update(_names(info))
        for key in self.keys:
            values, present = extras[INFOS][key], extras[INFOS_PRESENT][key]
            for step, env, info in zip(steps, envs, infos):
                value = _lookup(info, key)
                if value is _MISSING:
                    continue
                self._unseen.discard(key)
                if not isinstance(value, (numbers.Number, np.number, np.bool_)):
                    raise InvalidArgumentError(
                        f"EnvRunner(info_keys=...): sub-env {env}'s info[{key!r}] is a "
                        f"{type(value).__name__} ({value!r:.80}); only numbers are recorded. "
                        "Name a numeric entry, e.g. 'episode.r' rather than 'episode'."
                    )
                values[step, env] = float(value)  # type: ignore[arg-type]
                present[step, env] = True

    def check_reported(self, episode_ended: bool) -> None:
        """At a sample's end: refuses the names no info has had, once an episode has
        ended (``episode_ended``: in this sample)."""
        if not self._unseen or not episode_ended:
            return
        raise InvalidArgumentError(
            f"EnvRunner(info_keys=...): no sub-env's info had {sorted(self._unseen)} in any "
            "step up to the end of the first episode; is the name misspelt? The infos had "
            f"{sorted(self._reported)} (a dict entry's keys as 'name.key'). Pass names "
            "from that list."
        )


def _names(info: dict[str, Any], prefix: str = "") -> list[str]:
    """The names of ``info``'s entries, with those of dict entries as ``name.key``."""
    names = []
    for key, value in info.items():
        names.append(f"{prefix}{key}")
        if isinstance(value, dict):
            names += _names(value, f"{prefix}{key}.")
    return names


def policy_extras(extras: dict[str, Any]) -> dict[str, Any]:
    """``extras`` without the recorded infos: the policy's outputs alone."""
    if INFOS not in extras:
        return extras
    return {k: v for k, v in extras.items() if k not in (INFOS, INFOS_PRESENT)}


def _lookup(info: dict[str, Any], key: str) -> Any:
    value = info.get(key, _MISSING)
    if value is not _MISSING or "." not in key:
        return value
    value = info
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value
