"""The sub-env utilities of an adopted gymnasium vector env: ``call``, ``get_attr``,
``set_attr`` and ``render`` forwarded to it, and its sub-envs one by one."""

from __future__ import annotations

from typing import Any

import gymnasium

from jaxrunner._src.backends.base import BaseVectorEnv
from jaxrunner._src.backends.sub_env_handle import SubEnvHandle
from jaxrunner.errors import InvalidArgumentError


class GymnasiumSubEnvs(BaseVectorEnv):
    """The sub-env utilities over ``env``: a ``SyncVectorEnv``'s own sub-envs, or an
    ``AsyncVectorEnv``'s reached through its worker pipes."""

    # Any: Sync/AsyncVectorEnv (and envs that follow them) have call/get_attr/set_attr.
    env: Any

    def render(self) -> Any:
        self._check_open("render")
        return self.env.render()

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self._check_open("call")
        return self.env.call(name, *args, **kwargs)

    def get_attr(self, name: str) -> Any:
        self._check_open("get_attr")
        return self.env.get_attr(name)

    def set_attr(self, name: str, values: Any) -> None:
        self._check_open("set_attr")
        self.env.set_attr(name, values)

    def get_sub_environments(self) -> list[Any]:
        """A wrapped ``SyncVectorEnv``'s sub-envs themselves, a
        :class:`~jaxrunner._src.backends.sub_env_handle.SubEnvHandle` per sub-env of an
        ``AsyncVectorEnv``; refused for any other (natively vectorized) vector env."""
        self._check_open("get_sub_environments")
        inner = self.env.unwrapped
        if isinstance(inner, gymnasium.vector.SyncVectorEnv):
            return list(inner.envs)
        if isinstance(inner, gymnasium.vector.AsyncVectorEnv):
            return [SubEnvHandle(self, i) for i in range(inner.num_envs)]
        raise InvalidArgumentError(
            f"get_sub_environments(): the adopted {type(inner).__name__} steps its envs as one "
            "batch and has no sub-env objects to return (only gymnasium's SyncVectorEnv and "
            "AsyncVectorEnv have them). Use its call/get_attr/set_attr where it has them, or "
            "make_vec(..., backend='sync') with the env's factory for per-sub-env access."
        )

    def _sub_env_request(self, index: int, method: str, args: tuple) -> Any:
        """A sub-env handle's request, sent to worker ``index`` of the ``AsyncVectorEnv``
        alone as its ``call``/``set_attr`` sends it to every worker."""
        self._check_open(f"get_sub_environments()[{index}].{method}")
        inner = self.env.unwrapped
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
                f"sub-env {index} has ended (gymnasium ends a worker after an error); build a "
                "new vector env."
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
