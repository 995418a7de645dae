"""Backends whose sub-envs step in the calling thread: ``send`` keeps the actions and
``recv`` steps them (the sync backends, single- and multi-agent, and the gymnasium
adapter)."""

from __future__ import annotations

import abc
import collections
from typing import Any

from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.batch_step import EnvIds
from jaxrunner.errors import InvalidArgumentError


class InProcessSends:
    """``send``/``recv`` of a backend whose sub-envs step in the calling thread (a mixin
    of :class:`InProcessVectorEnv` and the sync multi-agent backend): :meth:`send`
    keeps the actions (read, not copied: keep them unchanged until the matching
    :meth:`recv`), and :meth:`recv` steps the oldest send with :meth:`_step`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sent: collections.deque[tuple[Any, slice | None]] = collections.deque()

    @abc.abstractmethod
    def _step(self, actions: Any, rows: slice | None) -> Any:
        """Steps envs ``rows`` (None: all) now; ``step_batch``'s contract."""

    def send(self, actions: Any, env_ids: EnvIds = None) -> None:
        self._check_open("step")  # type: ignore[attr-defined]
        if env_ids is not None and not isinstance(env_ids, slice):
            raise InvalidArgumentError(
                f"{type(self).__name__}.send(env_ids=...): expected None or a slice of env "
                f"indices (this backend steps in lockstep), got {type(env_ids).__name__}."
            )
        self._sent.append((actions, env_ids))

    def recv(self) -> Any:
        self._check_open("step")  # type: ignore[attr-defined]
        if not self._sent:
            raise InvalidArgumentError(
                f"{type(self).__name__}.recv(): no send() is waiting for its results. Call "
                "send(actions, env_ids) first, once per recv()."
            )
        actions, rows = self._sent.popleft()
        return self._step(actions, rows)

    def step_batch(self, actions: Any, rows: slice | None = None) -> Any:
        if self._sent:  # send then recv, as the base defines it: the oldest send answers
            self.send(actions, rows)
            return self.recv()
        self._check_open("step")  # type: ignore[attr-defined]
        return self._step(actions, rows)


class InProcessVectorEnv(InProcessSends, VectorEnv):
    """Base of single-agent backends whose sub-envs step in the calling thread (see
    :class:`InProcessSends`)."""
