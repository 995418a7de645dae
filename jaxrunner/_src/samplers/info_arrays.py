"""Per-step infos as ``[T, B]`` arrays (``[T, B, A_g]`` per agent group), for the
runners' ``info_keys``."""

from __future__ import annotations

import copy
import numbers
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, Literal

import numpy as np

from jaxrunner.errors import InvalidArgumentError

INFOS = "infos"
"""``traj.extras[INFOS][name]``: the float64 ``[T, B]`` values of info entry ``name``."""
INFOS_PRESENT = "infos_present"
"""``traj.extras[INFOS_PRESENT][name]``: where the step's info had entry ``name``."""
ALL: Final = "all"
"""``info_keys=ALL``: every numeric entry any info reports (the set grows as new ones
appear; docs/concepts.md, "Infos as arrays")."""

InfoKeys = tuple[str, ...] | Literal["all"]
"""Checked ``info_keys``: the names to record, or :data:`ALL`."""

_MISSING = object()


def check_info_keys(info_keys: Any, runner: str = "EnvRunner") -> InfoKeys:
    """``info_keys`` as a tuple of distinct non-empty strings, or ``"all"``, or a clear
    refusal naming ``runner``'s argument."""
    if isinstance(info_keys, str) and info_keys == ALL:
        return ALL
    if isinstance(info_keys, str) or not isinstance(info_keys, Sequence):
        raise InvalidArgumentError(
            f"{runner}(info_keys={info_keys!r}): expected a sequence of info entry names, "
            'e.g. ("lives", "episode.r"), or "all" for every numeric entry.'
        )
    keys = tuple(info_keys)
    bad = [k for k in keys if not isinstance(k, str) or not k]
    if bad or len(set(keys)) != len(keys):
        raise InvalidArgumentError(
            f"{runner}(info_keys={info_keys!r}): names must be distinct non-empty strings"
            + (f"; got {bad!r}." if bad else "; some are repeated.")
        )
    return keys


class InfoRecorder:
    """Records the named entries of each step's infos (or, for :data:`ALL`, every
    numeric entry) into a trajectory buffer's extras: float64 ``[T, B]`` values and
    masks (``[T, B, A_g]`` for an agent group: see :meth:`share`); a dotted name reaches
    into a dict entry, and where an episode ended the info is the final step's. Its
    errors say where else an entry that is not a number can be read: a step hook of
    ``Callbacks`` (``one_agent``) or of ``AgentCallbacks``."""

    def __init__(self, keys: InfoKeys, one_agent: bool) -> None:
        hook = (
            "Callbacks.on_episode_step: live.infos[-1] is the step's info"
            if one_agent
            else "AgentCallbacks.on_episode_step: episode.infos[-1] is the step's per-agent infos"
        )
        self._elsewhere = f"read this one in a callback ({hook})"
        self._label: Callable[[int], str] = "sub-env {}".format  # how errors name a row
        self.every = keys == ALL  # info_keys="all": self.keys grows as entries are reported
        self.keys: list[str] = [] if self.every else list(keys)
        self._shape = (0, 0)
        self._unseen = set() if self.every else set(keys)  # names no info has had yet
        self._reported: set[str] = set()  # every name seen while some are unseen (the error)

    def share(self, label: Callable[[int], str]) -> InfoRecorder:
        """A recorder of the same names (given or reported, and those not seen yet) for
        buffers of another shape: one per agent group of a multi-agent runner, whose
        row ``r`` errors name ``label(r)`` (e.g. "agent 'a0' of sub-env 1")."""
        other = copy.copy(self)  # the lists and sets of names stay shared
        other._label = label
        return other

    def allocate(self, extras: dict[str, Any], shape: tuple[int, ...]) -> None:
        """Adds zeroed ``[T, B]`` (or ``[T, B, A_g]``) arrays for every name to a new
        buffer's ``extras``."""
        clash = {INFOS, INFOS_PRESENT} & set(extras)
        if clash:
            raise InvalidArgumentError(
                f"EnvRunner(info_keys=...): the policy's extras already have "
                f"{sorted(clash)}, where the infos are recorded; rename that policy output."
            )
        self._shape = shape
        extras[INFOS], extras[INFOS_PRESENT] = {}, {}
        self._add(extras, self.keys)

    def clear(self, extras: dict[str, Any]) -> None:
        """Zeroes a reused buffer's arrays (a sample writes only the entries present),
        adding those of names first reported since it was allocated."""
        for key, values in extras[INFOS].items():
            values.fill(0.0)
            extras[INFOS_PRESENT][key].fill(False)
        self._add(extras, self.keys)

    def record(
        self, extras: dict[str, Any], t: Any, envs: Sequence[int], infos: Sequence[dict]
    ) -> None:
        """Step ``t`` (an int, or one step index per env) of rows ``envs`` (sub-envs, or
        agent slots ``b * A_g + a``), whose infos are ``infos`` in the same order, into
        the buffer whose extras are ``extras``."""
        steps = np.broadcast_to(np.asarray(t), (len(envs),)).tolist()
        if self.every:
            self._record_every(extras, steps, envs, infos)
            return
        if self._unseen:
            for info in infos:
                self._reported.update(name for name, _ in _entries(info, dicts=True))
        for key in self.keys:
            values, present = _rows(extras[INFOS][key]), _rows(extras[INFOS_PRESENT][key])
            for step, env, info in zip(steps, envs, infos):
                value = _lookup(info, key)
                if value is _MISSING:
                    continue
                self._unseen.discard(key)
                number = _number(value)
                if number is None:
                    raise InvalidArgumentError(
                        f"EnvRunner(info_keys=...): {self._label(env)}'s "
                        f"info[{key!r}] is a "
                        f"{type(value).__name__} ({value!r:.80}); only numbers are recorded. "
                        "Name a numeric entry, e.g. 'episode.r' rather than 'episode'."
                    )
                values[step, env] = number
                present[step, env] = True

    def _record_every(
        self, extras: dict[str, Any], steps: list[int], envs: Sequence[int], infos: Sequence[dict]
    ) -> None:
        values, present = extras[INFOS], extras[INFOS_PRESENT]
        for step, env, info in zip(steps, envs, infos):
            for name, value in _entries(info):
                number = _number(value)
                if number is None:
                    numeric = {n for n, v in _entries(info) if _number(v) is not None}
                    raise InvalidArgumentError(
                        f"EnvRunner(info_keys='all'): {self._label(env)}'s "
                        f"info[{name!r}] is a {type(value).__name__} ({value!r:.80}); only "
                        "numbers are recorded as arrays. Name the numeric entries you want "
                        "instead of 'all' (those reported so far: "
                        f"{sorted(numeric | set(self.keys))}), or {self._elsewhere}."
                    )
                if name not in values:
                    if name not in self._reported:  # first reported: every buffer has it
                        self._reported.add(name)
                        self.keys.append(name)
                    self._add(extras, (name,))
                _rows(values[name])[step, env] = number
                _rows(present[name])[step, env] = True

    def complete(self, extras: dict[str, Any]) -> None:
        """``"all"``: gives the buffer every name reported so far, in sorted order."""
        if self.every:
            self._add(extras, self.keys)
            for part in (INFOS, INFOS_PRESENT):
                if list(extras[part]) != sorted(extras[part]):
                    extras[part] = dict(sorted(extras[part].items()))

    def check(self, episode_ended: bool) -> None:
        """Named entries: refuses the names no info has had, once an episode has ended
        (``episode_ended``: in this sample)."""
        if not self._unseen or not episode_ended:
            return
        raise InvalidArgumentError(
            f"EnvRunner(info_keys=...): no sub-env's info had {sorted(self._unseen)} in "
            "any step up to the end of the first episode; is the name misspelt? The infos had "
            f"{sorted(self._reported)} (a dict entry's keys as 'name.key'). Pass names "
            "from that list."
        )

    def get_state(self) -> dict[str, Any]:
        """The names reported so far, and those not seen yet, as JSON values (what a
        checkpoint keeps for :meth:`set_state`)."""
        return {
            "every": self.every,
            "keys": list(self.keys),
            "unseen": sorted(self._unseen),
            "reported": sorted(self._reported),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Takes a :meth:`get_state` of a recorder of the same ``info_keys`` (another's
        is ignored: it saw other names), in place: the groups' recorders share it."""
        if state["every"] != self.every or (not self.every and state["keys"] != self.keys):
            return
        self.keys[:] = state["keys"]
        self._unseen.clear()
        self._unseen.update(state["unseen"])
        self._reported.clear()
        self._reported.update(state["reported"])

    def _add(self, extras: dict[str, Any], names: Sequence[str]) -> None:
        values, present = extras[INFOS], extras[INFOS_PRESENT]
        for name in names:
            if name not in values:
                values[name] = np.zeros(self._shape, np.float64)
                present[name] = np.zeros(self._shape, np.bool_)


def is_recorder_state(state: Any) -> bool:
    """Whether ``state`` (JSON values, e.g. from a file) is one :meth:`InfoRecorder.get_state`
    could have given."""
    lists = ("keys", "unseen", "reported")
    return (
        isinstance(state, dict)
        and set(state) == {"every", *lists}
        and isinstance(state["every"], bool)
        and all(isinstance(state[f], list) for f in lists)
        and all(isinstance(n, str) for f in lists for n in state[f])
        and len(set(state["keys"])) == len(state["keys"])
        and set(state["unseen"]) <= set(state["keys"])
    )


def _rows(array: np.ndarray) -> np.ndarray:
    """``array`` as ``[T, rows]`` (an agent group's ``[T, B, A_g]`` as a view)."""
    return array if array.ndim == 2 else array.reshape(len(array), -1)


def _entries(
    info: dict[str, Any], prefix: str = "", dicts: bool = False
) -> Iterator[tuple[str, Any]]:
    """``info``'s entries that are not dicts (``dicts``: every one), by name (a dict
    entry's as ``name.key``)."""
    for key, value in info.items():
        if not isinstance(value, dict):
            yield f"{prefix}{key}", value
            continue
        if dicts:
            yield f"{prefix}{key}", value
        yield from _entries(value, f"{prefix}{key}.", dicts)


def _number(value: Any) -> float | None:
    """``value`` as a float if it is a real number (a bool, a numpy scalar or a 0-d
    array of one), else None."""
    if isinstance(value, (numbers.Real, np.bool_)):
        return float(value)  # type: ignore[arg-type]
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "biuf":
        return float(value)
    return None


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
