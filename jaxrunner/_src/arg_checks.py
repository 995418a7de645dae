"""The checks of arguments at jaxrunner's public entry points and in its typed configs,
with one wording for every refusal: ``where(name=value): expected <what>; got <type>``."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
from gymnasium import spaces

from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError

C = TypeVar("C")


def is_int(value: Any, low: float = 1, high: float = math.inf) -> bool:
    """``value`` is an int (numpy ints count, bools do not) in ``[low, high]``."""
    return bool(
        not isinstance(value, (bool, np.bool_))
        and isinstance(value, (int, np.integer))
        and low <= value <= high
    )


def check_int(
    where: str,
    name: str,
    value: Any,
    *,
    low: float = 1,
    high: float = math.inf,
    none: str | None = None,
    hint: str = "",
) -> Any:
    """``value`` as an int in ``[low, high]`` (``low=-math.inf``: any int); with
    ``none`` (what None means, e.g. ``"for automatic"``) None passes too. Else an error
    naming ``where``'s argument."""
    if value is None and none is not None:
        return None
    if value is None or not is_int(value, low, high):
        kind = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        what = f"an int {_interval(low, high, False, False)}".rstrip()
        raise InvalidArgumentError(refusal(where, name, value, what, none, hint, kind))
    return int(value)


def check_number(
    where: str,
    name: str,
    value: Any,
    *,
    low: float = 0.0,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
    none: str | None = None,
    hint: str = "",
) -> Any:
    """``value`` as a float in the interval (``*_open``: its end excluded; never NaN);
    ``none`` as for :func:`check_int`."""
    if value is None and none is not None:
        return None
    real = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )
    if real and value is not None:
        number = float(value)
        below = number <= low if low_open else number < low
        above = number >= high if high_open else number > high
        if not (math.isnan(number) or below or above):
            return number
    what = f"a number {_interval(low, high, low_open, high_open)}"
    raise InvalidArgumentError(refusal(where, name, value, what, none, hint, real))


def check_bool(where: str, name: str, value: Any) -> bool:
    """``value`` as a bool (numpy's counts); a truthy string or int is refused."""
    if not isinstance(value, (bool, np.bool_)):
        what = "True or False"
        raise InvalidArgumentTypeError(refusal(where, name, value, what, None, "", False))
    return bool(value)


def check_path(where: str, name: str, value: Any) -> str:
    """``value`` as a file path (``os.fspath``): a str or ``os.PathLike``, never an int,
    which ``open`` would take as a file descriptor."""
    if not isinstance(value, str | os.PathLike) or not isinstance(os.fspath(value), str):
        what = "a file path (str or os.PathLike)"
        raise InvalidArgumentTypeError(refusal(where, name, value, what, None, "", False))
    return os.fspath(value)


def file_above(path: str | os.PathLike[str]) -> str | None:
    """The nearest existing folder above ``path`` where that is a file (so nothing can be
    created at ``path``), else None."""
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    return None if os.path.isdir(parent) else parent


def check_not_folder(path: str | os.PathLike[str], said: str, example: str) -> None:
    """Refuses a file ``path`` that is a folder, before anything is written: ``said`` names
    it (``"token file /x"``), ``example`` is a file name to suggest in it. A path inside
    a file (``a_file/x``) is refused too: creating its folder would raise later."""
    if os.path.isdir(path):
        raise InvalidArgumentError(
            f"{said} is a folder; give a file's path, e.g. {os.path.join(path, example)}."
        )
    parent = file_above(path)
    if parent is not None:
        raise InvalidArgumentError(
            f"{said}: {parent} is a file, not a folder; give a path in a folder, e.g. "
            f"{os.path.join(os.path.dirname(parent), example)}."
        )


def check_space(where: str, name: str, value: Any) -> spaces.Space:
    """``value`` if it is a gymnasium space; anything else refused by name."""
    if not isinstance(value, spaces.Space):
        raise InvalidArgumentTypeError(
            f"{where}({name}=...): expected a gymnasium space, got {type(value).__name__}."
        )
    return value


def check_config(
    where: str, config: Any, cls: type[C], name: str = "config", home: str = "jaxrunner"
) -> C:
    """``config`` (argument ``name``) as a ``cls`` (None: the defaults, ``cls()``);
    anything else refused, naming ``cls`` in its public module ``home``."""
    if config is None:
        return cls()
    if not isinstance(config, cls):
        got = type(config).__name__
        raise InvalidArgumentTypeError(
            f"{where}({name}=...): expected a {home}.{cls.__name__}, got {got}."
        )
    return config


def _interval(low: float, high: float, low_open: bool, high_open: bool) -> str:
    lo, hi = (str(x) if isinstance(x, int) else f"{x:g}" for x in (low, high))
    if low == -math.inf and high == math.inf:
        return ""
    if high == math.inf and not high_open:
        return f"{'>' if low_open else '>='} {lo}"
    return f"in {'(' if low_open else '['}{lo}, {hi}{')' if high_open else ']'}"


def refusal(
    where: str, name: str, value: Any, what: str, none: str | None, hint: str, kind_ok: bool
) -> str:
    text = f"{where}({name}={value!r:.80}): expected {what}"
    text += f" ({hint})" if hint else ""
    text += f", or None {none}" if none is not None else ""
    text += "" if kind_ok else f"; got {type(value).__name__}"
    return text + "."


def check_seed_count(seeds: Any, num_envs: int, where: str) -> None:
    """Refuses ``reset_batch`` seeds that are not one per sub-env, each an int >= 0 or
    None (before any resets); ``where`` names the vector env."""
    count = len(seeds) if isinstance(seeds, (Sequence, np.ndarray)) else None
    bad = next((i for i, s in enumerate(seeds) if not is_seed(s)), None) if count else None
    if count != num_envs or isinstance(seeds, str) or bad is not None:
        got = f"{count}" if count is not None else f"a {type(seeds).__name__}"
        if bad is not None and count == num_envs:
            got = f"seeds[{bad}]={seeds[bad]!r:.40} ({type(seeds[bad]).__name__})"
        raise InvalidArgumentError(
            f"{where}.reset_batch(seeds=...): expected one seed per sub-env (num_envs="
            f"{num_envs}), each an int >= 0 or None, got {got}. jaxrunner.env_seeds(seed, "
            "num_envs) makes them from one seed."
        )


def is_seed(value: Any) -> bool:
    """``value`` seeds a gymnasium env: an int >= 0 (numpy ints count, bools do not) or
    None."""
    return value is None or is_int(value, low=0)


def check_env_fns(where: str, env_fns: Sequence[Any]) -> None:
    """Refuses anything but a non-empty list of zero-argument env factories."""
    if not isinstance(env_fns, Sequence) or isinstance(env_fns, str):
        raise InvalidArgumentTypeError(
            f"{where}(env_fns=...): expected a list of env factories, one per sub-env, got "
            f"{type(env_fns).__name__}; e.g. [make_env] * n, or jaxrunner.make_vec(make_env, n)."
        )
    if len(env_fns) == 0:
        raise InvalidArgumentError(f"{where} needs at least one env factory, got none.")
    bad = next((i for i, fn in enumerate(env_fns) if not callable(fn)), None)
    if bad is not None:
        raise InvalidArgumentTypeError(
            f"{where}: env_fns[{bad}] is a {type(env_fns[bad]).__name__}, not a factory. Pass "
            "zero-argument functions that build the envs (e.g. lambda: gymnasium.make(...)), "
            "not the envs themselves: each sub-env is built (and rebuilt) by its factory."
        )


def check_dict(where: str, name: str, value: Any, hint: str = "", none: bool = True) -> Any:
    """Refuses ``value`` unless it is a dict (any mapping), or None where ``none``."""
    if (value is None and not none) or (value is not None and not isinstance(value, Mapping)):
        what = "a dict, or None" if none else "a dict"
        raise InvalidArgumentTypeError(refusal(where, name, value, what, None, hint, False))
    return value
