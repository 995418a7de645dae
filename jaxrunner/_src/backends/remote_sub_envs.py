"""gymnasium's sub-env utilities (``call``, ``get_attr``, ``set_attr``, ``render``): each
checks the env is open, then asks the sub-envs, wherever they live, through three hooks."""

from __future__ import annotations

import abc
from typing import Any

from jaxrunner._src.backends.base import BaseVectorEnv
from jaxrunner._src.backends.sub_env_handle import SubEnvHandle


class RemoteSubEnvs(BaseVectorEnv):
    """``get_sub_environments``, ``call``, ``get_attr``, ``set_attr`` and ``render``
    over sub-envs in other processes (their results must pickle), or in this one."""

    @abc.abstractmethod
    def _ask_one(self, index: int, method: str, args: tuple) -> Any:
        """Runs ``method(*args)`` on sub-env ``index``; its result."""

    @abc.abstractmethod
    def _ask_each(self, method: str, *args: Any) -> tuple[Any, ...]:
        """Runs ``method(*args)`` on every sub-env; their results in index order."""

    @abc.abstractmethod
    def _set_each(self, name: str, values: list[Any]) -> None:
        """Sets attribute ``name`` of sub-env ``i`` to ``values[i]``."""

    def get_sub_environments(self) -> list[SubEnvHandle]:
        """A :class:`~jaxrunner._src.backends.sub_env_handle.SubEnvHandle` per sub-env,
        in index order."""
        self._check_open("get_sub_environments")
        return [SubEnvHandle(self, i) for i in range(self.num_envs)]

    def _sub_env_request(self, index: int, method: str, args: tuple) -> Any:
        self._check_open(f"get_sub_environments()[{index}].{method}")
        return self._ask_one(index, method, args)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        self._check_open("call")
        return self._ask_each("call", name, args, kwargs)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        self._check_open("get_attr")
        return self._ask_each("get_attr", name)

    def set_attr(self, name: str, values: Any) -> None:
        self._check_open("set_attr")
        self._set_each(name, self._values_per_env(name, values))

    def render(self) -> tuple[Any, ...]:
        self._check_open("render")
        return self._ask_each("render")
