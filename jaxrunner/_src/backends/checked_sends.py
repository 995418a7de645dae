"""``send`` and ``send_checked`` of a backend that checks the actions' values on
``send``: one method, told whether a runner's policy step already checked them."""

from __future__ import annotations

import abc
from typing import Any

from jaxrunner._src.backends.steps import EnvIds


class ChecksOnSend:
    """A backend whose ``send`` checks the actions' values and ``send_checked`` skips
    that: both are :meth:`_send_actions`."""

    def send(self, actions: Any, env_ids: EnvIds = None) -> None:
        self._send_actions(actions, env_ids, checked=False)

    def send_checked(self, actions: Any, env_ids: EnvIds = None) -> None:
        self._send_actions(actions, env_ids, checked=True)

    @abc.abstractmethod
    def _send_actions(self, actions: Any, env_ids: EnvIds, checked: bool) -> None:
        """``send``, skipping the check of the values where ``checked``."""
