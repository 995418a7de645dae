"""The sub-envs of an adopted gymnasium vector env, one by one: a ``SyncVectorEnv``'s
env objects, handles on an ``AsyncVectorEnv``'s, a refusal for any other."""

from __future__ import annotations

from typing import Any

import gymnasium

from jaxrunner._src.backends.sub_env_handle import ReachesSubEnvs, SubEnvHandle
from jaxrunner.errors import InvalidArgumentError


def sub_environments(vector_env: ReachesSubEnvs, env: gymnasium.vector.VectorEnv) -> list[Any]:
    """The sub-envs of the adopted gymnasium ``env``: a ``SyncVectorEnv``'s objects, or
    handles on an ``AsyncVectorEnv``'s (reaching :func:`async_request`)."""
    inner = env.unwrapped
    if isinstance(inner, gymnasium.vector.SyncVectorEnv):
        return list(inner.envs)
    if isinstance(inner, gymnasium.vector.AsyncVectorEnv):
        return [SubEnvHandle(vector_env, i) for i in range(inner.num_envs)]
    raise InvalidArgumentError(
        f"get_sub_environments(): the adopted {type(inner).__name__} steps its envs as one "
        "batch and has no sub-env objects to return (only gymnasium's SyncVectorEnv and "
        "AsyncVectorEnv have them). Use its call/get_attr/set_attr where it has them, or "
        "make_vec(..., backend='sync') with the env's factory for per-sub-env access."
    )


def async_request(env: gymnasium.vector.VectorEnv, index: int, method: str, args: tuple) -> Any:
    """A sub-env handle's request, sent to worker ``index`` of the ``AsyncVectorEnv``
    alone with the command its ``call``/``set_attr`` would send every worker. Raises
    what the sub-env raised, and InvalidArgumentError once gymnasium has ended that
    worker for it."""
    inner: Any = env.unwrapped
    if method == "set_attr":
        command, data = "_setattr", args
    elif method == "call":
        command, data = "_call", args
    else:  # get_attr and render: a call of that name, as AsyncVectorEnv does
        command, data = "_call", (args[0] if method == "get_attr" else "render", (), {})
    pipe = inner.parent_pipes[index]
    if pipe is None:
        raise InvalidArgumentError(
            f"get_sub_environments()[{index}].{method}(): the AsyncVectorEnv's worker of "
            f"sub-env {index} has ended (gymnasium ends a worker after an error); build a new "
            "vector env."
        )
    pipe.send((command, data))
    result, ok = pipe.recv()
    if ok:
        return result
    # As AsyncVectorEnv does: the worker queued its error and ended; its pipe is closed.
    _, error_type, error, trace = inner.error_queue.get()
    pipe.close()
    inner.parent_pipes[index] = None
    if not isinstance(error, BaseException):
        error = error_type(error)
    error.add_note(f"jaxrunner: raised in AsyncVectorEnv worker {index}:\n{trace}")
    raise error
