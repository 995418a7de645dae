"""What a fault-injecting env does wrong and when (:class:`FaultPlan`, one instance's
:class:`FaultSchedule`), and a :class:`CallLog` that counts good and failed calls across
processes."""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import os
import pathlib
import signal
import time
from collections.abc import Sequence
from typing import Any, Literal, get_args

import numpy as np

from jaxrunner._src.arg_checks import check_int, check_number, is_int
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError

FaultKind = Literal[
    # Never return: the call raises, sleeps, or takes its process down.
    "raise",  # raise InjectedError
    "hang",  # sleep hang_s, then raise InjectedError
    "exit",  # os._exit(13)
    "kill",  # SIGKILL
    "segfault",  # read address 0
    # Return garbage (the inner call runs first): step only.
    "nan_reward",
    "inf_reward",
    "array_reward",  # an ndarray of shape (2,)
    "list_reward",  # [r, r]
    "flag_not_bool",  # terminated as an int
    # Return garbage: step or reset.
    "bad_obs",  # first array leaf of the observation with an extra leading axis
    "obs_dtype",  # first array leaf cast to another dtype
    "obs_missing_key",  # first key of a dict observation dropped
    "info_not_dict",  # info as a list of (key, value) pairs
]
_KINDS: tuple[str, ...] = get_args(FaultKind)
STEP_ONLY_KINDS = ("nan_reward", "inf_reward", "array_reward", "list_reward", "flag_not_bool")
"""Kinds that break what only ``step`` returns (the reward, the flags)."""


class InjectedError(RuntimeError):
    """What a :class:`FaultPlan` of kind ``"raise"`` (or an ended ``"hang"``) raises."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class FaultPlan:
    """One way a sub-env misbehaves, and when."""

    kind: FaultKind = "raise"
    """What goes wrong (see :data:`FaultKind`): ``raise`` an :class:`InjectedError`;
    ``hang`` (sleep ``hang_s``); ``exit`` the process (``os._exit``); ``kill`` it
    (SIGKILL); ``segfault``; or return garbage: a non-finite (``nan_reward``,
    ``inf_reward``) or non-scalar (``array_reward``, ``list_reward``) reward, an int
    ``terminated`` (``flag_not_bool``), an observation with an extra axis
    (``bad_obs``), another dtype (``obs_dtype``) or a missing dict key
    (``obs_missing_key``), or an info that is not a dict (``info_not_dict``)."""
    call: Literal["step", "reset"] = "step"
    """Which method misbehaves."""
    at: tuple[int, ...] = ()
    """1-based numbers of the calls of ``call`` that misbehave, counted per env
    instance (a recreated env counts from 1 again)."""
    probability: float = 0.0
    """Chance that any other call misbehaves."""
    hang_s: float = 3600.0
    """How long ``hang`` sleeps."""

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise InvalidArgumentError(f"FaultPlan(kind={self.kind!r}): expected one of {_KINDS}.")
        if self.call not in ("step", "reset"):
            raise InvalidArgumentError(
                f"FaultPlan(call={self.call!r}): expected 'step' or 'reset'."
            )
        if self.call == "reset" and self.kind in STEP_ONLY_KINDS:
            raise InvalidArgumentError(
                f"FaultPlan(kind={self.kind!r}) only applies to call='step': reset returns "
                "no reward or flags."
            )
        check_number("FaultPlan", "probability", self.probability, high=1.0)
        check_number("FaultPlan", "hang_s", self.hang_s)
        at = self.at
        if not isinstance(at, (Sequence, np.ndarray)) or isinstance(at, str):
            at = None
        if at is None or not all(is_int(n) for n in at):  # 1.5 would never fire
            raise InvalidArgumentError(
                f"FaultPlan(at={self.at!r}): expected a tuple of call numbers, starting at 1."
            )
        object.__setattr__(self, "at", tuple(int(n) for n in at))  # hashable, plain ints


class CallLog:
    """Counts events across processes: one byte appended to ``directory/<name>`` per
    event (``O_APPEND`` writes are atomic), so the count is the file's size.

    Picklable (it is just a path): give it to env factories that run in workers.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = pathlib.Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def record(self, name: str) -> None:
        """Counts one ``name`` event."""
        fd = os.open(self.directory / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, b".")
        finally:
            os.close(fd)

    def count(self, name: str) -> int:
        """How many ``name`` events were recorded, by any process."""
        try:
            return (self.directory / name).stat().st_size
        except FileNotFoundError:
            return 0


# Per (run, seed), schedules made here without a log: the n-th draws from rng([s, n]).
_made_per_seed: collections.Counter[tuple[str | None, int]] = collections.Counter()


def check_plans(where: str, faults: Any) -> tuple[FaultPlan, ...]:
    """``faults`` as a tuple of :class:`FaultPlan`; anything else refused by name."""
    items = () if not isinstance(faults, Sequence) or isinstance(faults, str) else faults
    bad = next((f for f in items if not isinstance(f, FaultPlan)), None)
    if items is not faults or bad is not None:
        got = type(faults).__name__ if items is not faults else f"an item {bad!r:.60}"
        raise InvalidArgumentTypeError(
            f"{where}(faults=...): expected a list of jaxrunner.testing.FaultPlan, got {got}."
        )
    return tuple(items)


def check_log_and_seed(where: str, log: Any, seed: Any) -> None:
    """Refuses a ``log`` that is not a :class:`CallLog` and a ``seed`` that is not an int
    >= 0, by name (not at the first call of an env, maybe in a worker)."""
    if log is not None and not isinstance(log, CallLog):
        raise InvalidArgumentTypeError(
            f"{where}(log={log!r:.60}): expected a jaxrunner.testing.CallLog or None, got "
            f"{type(log).__name__}; e.g. log=CallLog(directory)."
        )
    check_int(where, "seed", seed, low=0)


class FaultSchedule:
    """Which calls of one env instance misbehave (what every fault-injecting wrapper
    shares): a call misbehaves as the first of ``faults`` for it that is due (its number in
    ``at``, or the probability draw hit). Faults that never return happen in :meth:`due`;
    garbage faults are returned for the wrapper to apply.

    Args:
        faults: what goes wrong and when.
        log: optional cross-process counter (see :class:`FaultyEnv` for its events);
            this records ``made``.
        seed: seeds the draws of probabilistic faults, mixed with how many instances
            with this seed were made before (counted in ``log`` if given, else in this
            process), so a recreated env draws differently.
        owner: the wrapper's name, for the messages of injected errors.
        run: without a log, instances are counted per ``(run, seed)``:
            :func:`~.faults.faulty_env_fns` gives each call's factories their own run,
            so the same run made again in this process draws the same faults.
    """

    def __init__(
        self,
        faults: Sequence[FaultPlan],
        log: CallLog | None = None,
        seed: int = 0,
        owner: str = "FaultyEnv",
        run: str | None = None,
    ) -> None:
        self.faults, self.log, self.owner = check_plans(owner, faults), log, owner
        check_log_and_seed(owner, log, seed)
        if log is not None:  # numbered per seed: concurrent workers' envs draw alike
            instance = log.count(f"made-{seed}")
            log.record(f"made-{seed}")
            log.record("made")
        else:
            instance = _made_per_seed[run, seed]
            _made_per_seed[run, seed] += 1
        self._rng = np.random.default_rng([seed, instance])
        self.calls = {"step": 0, "reset": 0}
        """How many times each method was called (failed calls included)."""

    def due(self, call: str) -> FaultPlan | None:
        """Counts one call of ``call``; returns the garbage fault due for it (None: the
        call behaves). A due fault is logged ``<call>_failed``; one that never returns
        happens here."""
        self.calls[call] += 1
        number, due = self.calls[call], None
        for fault in self.faults:
            if fault.call != call:
                continue
            # Draw for every probabilistic fault, due or not, so draws stay aligned.
            hit = fault.probability > 0 and self._rng.random() < fault.probability
            if due is None and (number in fault.at or hit):
                due = fault
        if due is None:
            return None
        self.record(f"{call}_failed")
        # The faults that never return a value happen here.
        if due.kind == "raise":
            raise InjectedError(f"{self.owner}: injected failure in {call} #{number}")
        if due.kind == "hang":
            time.sleep(due.hang_s)
            raise InjectedError(f"{self.owner}: {call} hung for {due.hang_s} s")
        if due.kind == "exit":
            os._exit(13)
        if due.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if due.kind == "segfault":
            ctypes.string_at(0)
        return due

    def ok(self, call: str) -> None:
        """Logs a call that behaved."""
        self.record(f"{call}_ok")

    def record(self, name: str) -> None:
        if self.log is not None:
            self.log.record(name)
