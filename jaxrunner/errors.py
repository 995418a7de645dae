"""jaxrunner's exceptions: each derives from :class:`JaxRunnerError` and from the built-in
it stands for (``except ValueError`` keeps working)."""

from __future__ import annotations

import pickle
from typing import Any


def _rebuild(cls: type[BaseException], args: tuple, state: dict[str, Any]) -> BaseException:
    """Unpickles a :class:`JaxRunnerError` without calling its constructor."""
    error = cls.__new__(cls, *args)
    error.args = args
    cause = state.pop("__cause__", None)
    error.__dict__.update(state)
    if cause is not None:
        error.__cause__ = cause
    return error


class JaxRunnerError(Exception):
    """Base class of every error raised by jaxrunner.

    Every subclass survives ``pickle.loads(pickle.dumps(err))`` (Ray and process
    workers send errors across processes): its message, its attributes and its
    chained cause (replaced by a ``RuntimeError`` with the same text if the cause
    itself cannot be pickled) come back; the constructor is not called again.

    Attributes:
        partial_trajectory: set when the error interrupted ``EnvRunner.sample()``:
            the steps collected before it, as a :class:`jaxrunner.Trajectory`
            (``None`` when no step had completed); for ``EnvRunnerGroup.sample()``,
            the samples of the runners that answered.
        partial_episodes: set when the error interrupted ``EnvRunner.sample_episodes()``
            after some episodes completed: those episodes.
    """

    partial_trajectory: Any = None
    partial_episodes: Any = None

    def __reduce__(self) -> tuple[Any, ...]:
        # BaseException's default calls cls(*args), which subclasses whose
        # constructors take extra arguments (env_index, worker_index) cannot take.
        state = dict(self.__dict__)
        cause = self.__cause__
        try:
            pickle.dumps(cause)
        except Exception:  # a cause that cannot travel: keep what it said
            cause = RuntimeError(f"{type(cause).__qualname__}: {cause}")
        state["__cause__"] = cause
        return (_rebuild, (type(self), self.args, state))


class SpaceMismatchError(JaxRunnerError, ValueError):
    """Data (an observation, action or policy output) does not fit its space."""


class InvalidStepError(JaxRunnerError, ValueError):
    """A sub-env returned something gymnasium's API does not allow
    (a non-finite or non-scalar reward, an info that is not a dict, ...)."""


class InvalidActionError(JaxRunnerError, ValueError):
    """An action batch has the wrong number of actions, shape or dtype."""


class EnvError(JaxRunnerError, RuntimeError):
    """A sub-env raised in ``step()`` or ``reset()``; the original is chained."""

    def __init__(self, message: str, env_index: int) -> None:
        super().__init__(message)
        self.env_index = env_index


class ClosedError(JaxRunnerError, RuntimeError):
    """A vector env or runner was used after ``close()``/``stop()``."""


class RunnerFailedError(JaxRunnerError, RuntimeError):
    """The runner was used again after a ``sample()`` call failed part-way."""


class DispatchConfigError(JaxRunnerError, RuntimeError):
    """A JAX dispatch setting was asked for after JAX's backend had started."""


class InvalidArgumentError(JaxRunnerError, ValueError):
    """An argument has an invalid value."""


class InvalidArgumentTypeError(JaxRunnerError, TypeError):
    """An argument has the wrong type."""


class EnvIndexError(JaxRunnerError, IndexError):
    """A sub-env index is out of range."""


class TooManyEpisodesError(JaxRunnerError, RuntimeError):
    """An external env is at its cap of concurrent episodes (global or per client);
    end some episodes, or raise the cap. Served as HTTP 429."""


class MemoryLimitError(TooManyEpisodesError):
    """An external env's records (live episodes and unpolled finished ones) would
    exceed ``ExternalEnvConfig.max_memory_bytes``; poll or end episodes first.
    Served as HTTP 429 (code ``memory_limit``)."""


class EpisodeNotFoundError(JaxRunnerError, LookupError):
    """No live episode has this id: it was never started, or it has ended
    (``ended`` tells which). Served as HTTP 404 (unknown) or 410 (ended)."""

    def __init__(self, message: str, ended: bool = False) -> None:
        super().__init__(message)
        self.ended = ended


class EpisodeConflictError(JaxRunnerError, RuntimeError):
    """The call does not fit the episode's state: its id is already in use, or
    another call for it is still in flight. Served as HTTP 409."""


class EvaluationIncompleteError(JaxRunnerError, RuntimeError):
    """``evaluate`` took ``max_env_steps`` env steps before every env had completed its
    share of the episodes (an env whose episodes never end, or too small a budget).

    Attributes:
        partial_result: the :class:`jaxrunner.EvaluationResult` of the episodes that
            did complete, each env's first ones.
    """

    partial_result: Any = None


class ActionTimeoutError(JaxRunnerError, TimeoutError):
    """An external env's action (or a wait for episodes) took longer than its timeout."""


class WorkerError(JaxRunnerError, RuntimeError):
    """A worker process of ``backend="process"`` died or broke its protocol. Names the
    worker and the sub-envs it ran; ``worker_index`` and ``env_indices`` say them too."""

    def __init__(self, message: str, worker_index: int, env_indices: range) -> None:
        super().__init__(message)
        self.worker_index = worker_index
        self.env_indices = env_indices


class WorkerTimeoutError(JaxRunnerError, TimeoutError):
    """A worker process of ``backend="process"`` did not answer within its
    ``step_timeout_s``. Names the worker and its sub-envs, like :class:`WorkerError`."""

    def __init__(self, message: str, worker_index: int, env_indices: range) -> None:
        super().__init__(message)
        self.worker_index = worker_index
        self.env_indices = env_indices


class RemoteTimeoutError(JaxRunnerError, TimeoutError):
    """A Ray actor (an env actor of ``backend="ray"`` or a runner of an
    ``EnvRunnerGroup``) did not answer within its timeout, or could not be placed. An env
    actor's missed ``step_timeout_s`` sets ``worker_index`` and ``env_indices`` too, as
    :class:`WorkerError` does."""

    # Set only by an env actor's missed step (absent otherwise).
    worker_index: int
    env_indices: range


class MissingDependencyError(JaxRunnerError, ImportError):
    """An optional dependency is not installed; the message names the extra."""


__all__ = [
    "JaxRunnerError",
    "SpaceMismatchError",
    "InvalidStepError",
    "InvalidActionError",
    "EnvError",
    "ClosedError",
    "RunnerFailedError",
    "DispatchConfigError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "EnvIndexError",
    "TooManyEpisodesError",
    "MemoryLimitError",
    "EpisodeNotFoundError",
    "EpisodeConflictError",
    "EvaluationIncompleteError",
    "ActionTimeoutError",
    "WorkerError",
    "WorkerTimeoutError",
    "RemoteTimeoutError",
    "MissingDependencyError",
]
