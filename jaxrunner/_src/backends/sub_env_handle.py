"""One sub-env that lives elsewhere (a worker process, a Ray actor, an ``AsyncVectorEnv``
worker), as ``get_sub_environments()`` returns it. Must not start JAX."""

from __future__ import annotations

from typing import Any, Protocol

import gymnasium

SUB_ENV_METHODS = ("call", "get_attr", "set_attr", "render")
"""What a request may ask of one sub-env (a :class:`SubEnvHandle` method each)."""


class ReachesSubEnvs(Protocol):
    """A vector env that can send one sub-env a request (what a handle holds)."""

    def _sub_env_request(self, index: int, method: str, args: tuple) -> Any:
        """Runs ``method(*args)`` of :func:`run_on_env` on sub-env ``index`` wherever it
        lives; its result. Raises ``ClosedError`` once the vector env is closed."""
        ...


class SubEnvHandle:
    """Sub-env ``index`` of a vector env whose sub-envs live elsewhere.

    The handle names a slot of the vector env, not an object: after the sub-env is
    recreated (a restart) or its worker or actor replaced, it reaches the new one.
    Arguments and results cross a process boundary, so they must pickle. Once the
    vector env is closed, every method raises :class:`~jaxrunner.errors.ClosedError`.
    """

    __slots__ = ("_vector_env", "index")

    def __init__(self, vector_env: ReachesSubEnvs, index: int) -> None:
        self._vector_env = vector_env
        self.index = index
        """The sub-env's index in the vector env."""

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Calls method ``name`` of the sub-env (or reads attribute ``name``)."""
        return self._vector_env._sub_env_request(self.index, "call", (name, args, kwargs))

    def get_attr(self, name: str) -> Any:
        """Attribute ``name`` of the sub-env."""
        return self._vector_env._sub_env_request(self.index, "get_attr", (name,))

    def set_attr(self, name: str, value: Any) -> None:
        """Sets attribute ``name`` of the sub-env (no other sub-env is touched)."""
        self._vector_env._sub_env_request(self.index, "set_attr", (name, value))

    def render(self) -> Any:
        """The sub-env's ``render()``."""
        return self._vector_env._sub_env_request(self.index, "render", ())

    def __repr__(self) -> str:
        return f"SubEnvHandle({type(self._vector_env).__name__}, index={self.index})"


def run_on_env(env: Any, method: str, args: tuple) -> Any:
    """What a :class:`SubEnvHandle` request ``method(*args)`` does, run on the sub-env
    object in the process holding it. Attributes are found as the vector envs'
    ``call``/``get_attr``/``set_attr`` find them: through a gymnasium env's wrappers
    (``get_wrapper_attr``), directly on any other env (PettingZoo's)."""
    wrapped = isinstance(env, gymnasium.Env)
    if method == "call":
        name, call_args, kwargs = args
        attr = env.get_wrapper_attr(name) if wrapped else getattr(env, name)
        return attr(*call_args, **kwargs) if callable(attr) else attr
    if method == "get_attr":
        (name,) = args
        return env.get_wrapper_attr(name) if wrapped else getattr(env, name)
    if method == "set_attr":
        name, value = args
        if wrapped:
            env.set_wrapper_attr(name, value)
        else:
            setattr(env, name, value)
        return None
    if method == "render":
        return env.render()
    raise ValueError(f"run_on_env: unknown method {method!r}; expected one of {SUB_ENV_METHODS}.")
