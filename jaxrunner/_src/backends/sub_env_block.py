"""The one step loop of the host backends (sync, each process worker, each Ray actor): a
block of sub-envs stepped in turn, validated, restarted and autoreset (SAME_STEP)."""

from __future__ import annotations

import abc
import pickle
from collections.abc import Callable, Iterator, MutableSequence, Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxrunner._src.backends.env_api import check_env
from jaxrunner._src.backends.restarts import RestartPolicy, close_quietly, recreation_failed, retry
from jaxrunner._src.backends.sub_env_handle import run_on_env
from jaxrunner._src.core.seeds import restart_seed
from jaxrunner.errors import EnvError, JaxRunnerError

EnvFactory = Callable[[], Any]
"""A zero-argument callable returning a sub-env (a gymnasium env, or a PettingZoo
``ParallelEnv`` or ``AECEnv``)."""

# Per sub-env progress of a step, in the caller's ``status`` array: NOT_RUN (set by the
# sender before a step), RUNNING while env.step runs (left after a step that failed),
# DONE once it returned a valid transition. A dead worker's or actor's shared marks
# tell the main process which of its steps were done and which never ran.
NOT_RUN, RUNNING, DONE = 0, 1, 2
Marks = MutableSequence[int] | np.ndarray
"""Where a block writes its marks (a process worker's or Ray actor's are shared)."""


class SubEnvRaised(EnvError):
    """A sub-env's own code raised ``err`` (or its repr, for a worker's error) in ``call``
    (``"step"``, ``"reset"``, ``"factory"``); the original is its ``__cause__``.
    ``agent_id``: in a turn-based multi-agent env, the agent whose turn it was."""

    def __init__(
        self, err: BaseException | str, env_index: int, call: str, agent_id: str | None = None
    ) -> None:
        who = f"sub-env {env_index}" + ("" if agent_id is None else f" (agent {agent_id!r})")
        what = err if isinstance(err, str) else repr(err)
        super().__init__(f"{who} raised in {call}(): {what}", env_index)
        if not isinstance(err, str):  # held in a step's errors too, not only raised
            self.__cause__ = err
        self.call = call
        self.agent_id = agent_id


def with_env_index(err: Exception, env_index: int) -> Exception:
    """``err`` (a jaxrunner check's, about sub-env ``env_index``) with its ``env_index``
    set where the check left it unset, as either block raises it."""
    if getattr(err, "env_index", None) is None:
        err.env_index = env_index  # type: ignore[attr-defined]
    return err


def original(err: BaseException) -> BaseException:
    """The sub-env's own exception behind a :class:`SubEnvRaised` (else ``err``)."""
    return err.__cause__ if isinstance(err, SubEnvRaised) and err.__cause__ else err


class StepResult(NamedTuple):
    """What :meth:`SubEnvBlock.step` returns besides what it wrote to the buffers."""

    infos: list[dict[str, Any]]
    """Step infos of ``[lo, hi)`` in order (``{}`` for a failed step)."""
    reset_infos: dict[int, dict[str, Any]]
    """Infos of the autoresets, by global index."""
    failed: list[int]
    """Global indices whose step failed (restarted; their slots hold no transition)."""
    errors: dict[int, BaseException]
    """Every failure (step, or autoreset after a good step), by global index."""


def failed_mask(failed: Sequence[int], lo: int, hi: int) -> np.ndarray | None:
    """Sub-envs ``failed`` (global indices in ``[lo, hi)``) as a ``[hi - lo]`` bool
    mask; None when ``failed`` is empty."""
    if not failed:
        return None
    mask = np.zeros(hi - lo, np.bool_)
    mask[np.asarray(failed) - lo] = True
    return mask


class SubEnvBlock(abc.ABC):
    """Sub-envs ``[offset, offset + len(envs))`` of a vector env (owned), stepped in turn.

    Without a ``restart_policy`` a failure raises (:class:`SubEnvRaised` for the env's
    own exceptions). With one, the sub-env is recreated from ``fns`` and reset (seeded
    if it was), a failed step holds no transition, and a failed reset after a good step
    keeps that step's. ``status``: the per-sub-env progress marks (a process worker's are
    shared; None: kept privately).
    """

    def __init__(
        self,
        envs: Sequence[Any],
        fns: Sequence[EnvFactory],
        offset: int,
        restart_policy: RestartPolicy | None,
        status: Marks | None = None,
    ) -> None:
        # A list is kept as is: the sync backend's ``envs`` is this list.
        self.envs = envs if isinstance(envs, list) else list(envs)
        self.offset, self.restart_policy = offset, restart_policy
        self.fns = list(fns)
        self.status: Marks = status if status is not None else bytearray(offset + len(self.envs))
        self.num_restarts = 0
        """Sub-envs recreated after a failure."""
        self._seeds: list[int | None] = [None] * len(self.envs)
        """Each sub-env's last reset seed (None: never seeded)."""
        self._restarts = [0] * len(self.envs)
        """Each sub-env's restarts since that seeded reset (its restarts' seeds)."""

    @abc.abstractmethod
    def step(self, lo: int, hi: int, actions: Any) -> StepResult:
        """Steps sub-envs ``[lo, hi)`` (global indices), SAME_STEP autoreset included."""

    @abc.abstractmethod
    def reset_one(self, i: int, seed: int | None, options: dict[str, Any] | None) -> dict:
        """Resets sub-env ``i`` (global index) into the buffers; returns its checked
        infos, or raises a :class:`~jaxrunner.errors.JaxRunnerError` naming it."""

    @abc.abstractmethod
    def _fresh(self, j: int, env: Any, seed: int | None) -> dict[str, Any]:
        """Takes new sub-env ``env`` as ``envs[j]``'s replacement and resets it with
        ``seed`` into the buffers (one restart attempt: raises where it is refused)."""

    @abc.abstractmethod
    def _fail_slot(self, i: int) -> None:
        """Sub-env ``i``'s slots of the step under way hold no transition."""

    def reset(self, seeds: Sequence[int | None], options: dict[str, Any] | None) -> list[dict]:
        """Resets every sub-env (``seeds[j]`` for ``envs[j]``), as :meth:`reset_or_restart`."""
        return [
            self.reset_or_restart(self.offset + j, seed, options) for j, seed in enumerate(seeds)
        ]

    def reset_or_restart(self, i: int, seed: int | None, options: dict[str, Any] | None) -> dict:
        """:meth:`reset_one`, or with a restart policy, a restart where it fails."""
        try:
            return self.reset_one(i, seed, options)
        except JaxRunnerError as err:
            if self.restart_policy is None:
                raise
            self._seeded(i, seed)  # the restart's seed is drawn from the one this reset had
            return self.restart(i, original(err), failed_step=False)

    def _seeded(self, i: int, seed: int | None) -> None:
        """Notes sub-env ``i``'s reset seed: its restarts draw theirs from it."""
        if seed is not None:
            j = i - self.offset
            self._seeds[j], self._restarts[j] = seed, 0

    def restart(self, i: int, cause: BaseException, failed_step: bool) -> dict:
        """Replaces sub-env ``i`` by a new, reset one and returns its reset infos; an
        EnvError (``cause`` chained) when every attempt fails."""
        policy, fns = self.restart_policy, self.fns
        assert policy is not None  # internal: only called with a policy
        j = i - self.offset
        close_quietly(self.envs[j])
        self._restarts[j] += 1
        seed = self._seeds[j]  # a seeded env restarts seeded: runs stay reproducible
        seed = None if seed is None else restart_seed(seed, self._restarts[j])

        def attempt() -> dict[str, Any]:
            env = check_env(fns[j](), i)
            try:
                return self._fresh(j, env, seed)
            except BaseException:
                close_quietly(env)
                raise

        info = retry(attempt, policy, cause, lambda last: recreation_failed(i, cause, policy, last))
        self.num_restarts += 1
        if failed_step:
            self._fail_slot(i)
        return info

    def restart_state(self, j: int) -> tuple[int | None, int]:
        """``envs[j]``'s last reset seed and its restarts since (its next restart's seed)."""
        return self._seeds[j], self._restarts[j]

    def set_restart_state(self, j: int, state: tuple[int | None, int]) -> None:
        """Takes a :meth:`restart_state` as ``envs[j]``'s."""
        self._seeds[j], self._restarts[j] = state

    def call(self, name: str, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        return [run_on_env(env, "call", (name, args, kwargs)) for env in self.envs]

    def get_attr(self, name: str) -> list[Any]:
        return [run_on_env(env, "get_attr", (name,)) for env in self.envs]

    def set_attr(self, name: str, values: Sequence[Any]) -> None:
        for env, value in zip(self.envs, values):
            run_on_env(env, "set_attr", (name, value))

    def render(self) -> list[Any]:
        return [env.render() for env in self.envs]

    def on_sub_env(self, index: int, method: str, args: tuple) -> Any:
        """A ``SubEnvHandle`` request, run on sub-env ``index`` (global) alone."""
        return run_on_env(self.envs[index - self.offset], method, args)

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []


def build_envs(fns: Sequence[EnvFactory], offset: int) -> list[Any]:
    """Calls the factories (``fns[j]`` is sub-env ``offset + j``); on failure closes
    what it built and raises :class:`SubEnvRaised` (call ``"factory"``)."""
    envs: list[Any] = []
    try:
        for j, fn in enumerate(fns):
            try:
                env = fn()
            except Exception as err:
                raise SubEnvRaised(err, offset + j, "factory") from err
            envs.append(check_env(env, offset + j))
    except BaseException:
        for env in envs:
            env.close()
        raise
    return envs


def stepped_runs(
    lo: int, hi: int, pending: dict[int, Any], fail: Callable[[int], BaseException], failed: dict
) -> Iterator[tuple[int, int]]:
    """The runs ``(start, stop)`` of rows ``[lo, hi)`` not in ``pending``, lazily; each
    pending row ``i`` fails as it is reached (``failed[i] = fail(i)``)."""
    start = lo
    for i in range(lo, hi):
        if i in pending:
            if start < i:
                yield start, i
            failed[i] = fail(i)
            start = i + 1
    if start < hi:
        yield start, hi


def pickled(err: BaseException | None) -> bytes | None:
    """``err`` pickled, or None if it does not survive the round trip."""
    if err is None:
        return None
    try:
        payload = pickle.dumps(err)
        pickle.loads(payload)  # some exceptions pickle but cannot be rebuilt
    except Exception:
        return None
    return payload


class PerSize(dict[int, Callable[[Any], Any]]):
    """``build(size)`` (an action check), built once per batch size: ``self[size]``."""

    def __init__(self, build: Callable[[int], Callable[[Any], Any]]) -> None:
        super().__init__()
        self.build = build

    def __missing__(self, size: int) -> Callable[[Any], Any]:
        made = self[size] = self.build(size)
        return made
