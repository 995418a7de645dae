"""A worker's error, rebuilt as an exception of the main process with the worker's
traceback chained (never re-raised without it)."""

from __future__ import annotations

import pickle

from jaxrunner._src.backends.process.protocol import RemoteError
from jaxrunner._src.backends.sub_env_block import SubEnvRaised
from jaxrunner.errors import EnvError, WorkerError


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker process, as text. Chained as
    the ``__cause__`` of that exception when it reaches the main process."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


def remote_exception(remote: RemoteError, w: int, envs: range, place: str) -> BaseException:
    """The error of worker ``w`` (sub-envs ``envs``; ``place`` as errors name it:
    ``"worker 2"``, or ``"the main process"``) as an exception of this process;
    its ``__cause__`` is set (the worker's traceback, or the original exception with
    the traceback chained to it)."""
    trace = RemoteTraceback(remote.traceback)
    original = _unpickle(remote.exception)
    if original is not None:
        original.__cause__ = trace
    cause = original if original is not None else trace
    i = remote.env_index
    error: BaseException
    if remote.kind == "recreate":
        error = EnvError(remote.description, i)
        error.recreation_error = _unpickle(remote.recreation)  # type: ignore[attr-defined]
    elif remote.kind == "env" and remote.call == "factory":
        error = EnvError(f"the factory of sub-env {i} raised in {place}: {remote.description}", i)
        error.agent_id = remote.agent_id  # type: ignore[attr-defined]
    elif remote.kind == "env":  # as the sync backend raises it
        error = SubEnvRaised(remote.description, i, remote.call, remote.agent_id)
    elif original is not None:  # a jaxrunner check, or a failing call/get_attr
        error, cause = original, trace
    else:
        error = WorkerError(
            f"{place} (sub-envs {envs.start}..{envs.stop - 1}) raised {remote.description}",
            w,
            envs,
        )
        cause = trace
    error.__cause__ = cause
    return error


def _unpickle(payload: bytes | None) -> BaseException | None:
    if payload is None:
        return None
    try:
        return pickle.loads(payload)
    except Exception:
        return None
