"""FaultPlan injection: envs that crash, hang, die or return garbage, on purpose.

For jaxrunner's tests and for users testing their own setups. Wrap any env with
:class:`FaultyEnv` (or build factories with :func:`faulty_env_fns`, picklable for
worker processes) and say what goes wrong and when with :class:`FaultPlan`. A
:class:`CallLog` counts good and failed calls across processes, so a test can
check the runner's accounting against what the envs really did.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import itertools
import os
import pathlib
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import gymnasium
import numpy as np

from jaxrunner.errors import InvalidArgumentError

FaultKind = Literal["raise", "hang", "exit", "kill", "segfault", "nan_reward", "bad_obs"]
_KINDS = ("raise", "hang", "exit", "kill", "segfault", "nan_reward", "bad_obs")
_STEP_ONLY = ("nan_reward",)


class InjectedError(RuntimeError):
    """What a :class:`FaultPlan` of kind ``"raise"`` raises."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class FaultPlan:
    """One way a sub-env misbehaves, and when."""

    kind: FaultKind = "raise"
    """``raise`` an :class:`InjectedError`; ``hang`` (sleep ``hang_s``); ``exit``
    the process (``os._exit``); ``kill`` it (SIGKILL); ``segfault``; return a
    ``nan_reward``; return a ``bad_obs`` (an extra axis on the observation)."""
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
        if self.call == "reset" and self.kind in _STEP_ONLY:
            raise InvalidArgumentError(
                f"FaultPlan(kind={self.kind!r}) only applies to call='step'."
            )
        if not 0.0 <= self.probability <= 1.0:
            raise InvalidArgumentError(
                f"FaultPlan(probability={self.probability}): expected a number in [0, 1]."
            )
        if any(n < 1 for n in self.at):
            raise InvalidArgumentError(f"FaultPlan(at={self.at}): call numbers start at 1.")


class CallLog:
    """Counts events across processes: one byte appended to ``directory/<name>`` per
    event (``O_APPEND`` writes are atomic), so the count is the file's size.

    Picklable (it is just a path): give it to env factories that run in workers.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = pathlib.Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def record(self, name: str) -> None:
        fd = os.open(self.directory / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, b".")
        finally:
            os.close(fd)

    def count(self, name: str) -> int:
        try:
            return (self.directory / name).stat().st_size
        except FileNotFoundError:
            return 0


_instances = itertools.count()


class FaultyEnv(gymnasium.Wrapper):
    """Wraps an env and injects ``faults``; counts calls in ``log`` if given.

    Events logged: ``step_ok`` (a step returned a good transition), ``step_failed``
    (a step misbehaved: raised, returned garbage; hangs and deaths are logged
    before they happen), ``reset_ok``, ``reset_failed`` and ``made`` (instances).

    Args:
        env: the env to wrap.
        faults: what goes wrong and when.
        log: optional cross-process counter.
        seed: seeds the draws of probabilistic faults (mixed with an instance number,
            so a recreated env draws differently).
    """

    def __init__(
        self,
        env: gymnasium.Env,
        faults: Sequence[FaultPlan] = (),
        log: CallLog | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(env)
        self.faults = tuple(faults)
        self.log = log
        instance = next(_instances)
        if log is not None:
            instance = log.count("made")
            log.record("made")
        self._rng = np.random.default_rng([seed, instance])
        self._calls = {"step": 0, "reset": 0}

    def _due(self, call: str) -> FaultPlan | None:
        self._calls[call] += 1
        number, due = self._calls[call], None
        for fault in self.faults:
            if fault.call != call:
                continue
            # Draw for every probabilistic fault, due or not, so draws stay aligned.
            hit = fault.probability > 0 and self._rng.random() < fault.probability
            if due is None and (number in fault.at or hit):
                due = fault
        return due

    def _fail_now(self, fault: FaultPlan, call: str) -> None:
        """Faults that never return a value."""
        self._record(f"{call}_failed")
        if fault.kind == "raise":
            raise InjectedError(f"FaultyEnv: injected failure in {call} #{self._calls[call]}")
        if fault.kind == "hang":
            time.sleep(fault.hang_s)
            raise InjectedError(f"FaultyEnv: {call} hung for {fault.hang_s} s")
        if fault.kind == "exit":
            os._exit(13)
        if fault.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault.kind == "segfault":
            ctypes.string_at(0)

    def _record(self, name: str) -> None:
        if self.log is not None:
            self.log.record(name)

    def reset(self, **kwargs: Any) -> Any:
        fault = self._due("reset")
        if fault is not None and fault.kind != "bad_obs":
            self._fail_now(fault, "reset")
        obs, info = self.env.reset(**kwargs)
        if fault is not None:  # bad_obs
            self._record("reset_failed")
            return np.asarray(obs)[None], info
        self._record("reset_ok")
        return obs, info

    def step(self, action: Any) -> Any:
        fault = self._due("step")
        if fault is not None and fault.kind not in ("bad_obs", "nan_reward"):
            self._fail_now(fault, "step")
        obs, reward, terminated, truncated, info = self.env.step(action)
        if fault is None:
            self._record("step_ok")
            return obs, reward, terminated, truncated, info
        self._record("step_failed")
        if fault.kind == "nan_reward":
            return obs, float("nan"), terminated, truncated, info
        return np.asarray(obs)[None], reward, terminated, truncated, info


def _make_faulty(
    base: Callable[[], gymnasium.Env], faults: tuple[FaultPlan, ...], log: CallLog | None, seed: int
) -> gymnasium.Env:
    return FaultyEnv(base(), faults, log, seed)


def faulty_env_fns(
    base: Callable[[], gymnasium.Env],
    num_envs: int,
    faults: Sequence[FaultPlan] | dict[int, Sequence[FaultPlan]],
    log: CallLog | None = None,
    seed: int = 0,
) -> list[Callable[[], gymnasium.Env]]:
    """``num_envs`` picklable factories of :class:`FaultyEnv` around ``base()``.

    Args:
        base: a picklable zero-argument env factory (e.g. ``functools.partial(
            gymnasium.make, "CartPole-v1")``).
        num_envs: how many factories.
        faults: the same faults for every env, or a dict ``{env index: faults}``
            (envs not in it behave).
        log: optional cross-process counter shared by all of them.
        seed: seeds probabilistic faults (mixed with the env index).
    """
    per_env = faults if isinstance(faults, dict) else dict.fromkeys(range(num_envs), faults)
    return [
        functools.partial(_make_faulty, base, tuple(per_env.get(i, ())), log, seed * 100_003 + i)
        for i in range(num_envs)
    ]


__all__ = ["CallLog", "FaultPlan", "FaultKind", "FaultyEnv", "InjectedError", "faulty_env_fns"]
