"""The optional ``run()`` thread of the external envs (as RLlib's ExternalEnv)."""

from __future__ import annotations

import threading
from typing import ClassVar

from jaxrunner.errors import InvalidArgumentError


class RunDriven:
    """``run``/``start``/``join`` of the external envs: a subclass overrides :meth:`run`
    to drive its episodes."""

    _run_thread: threading.Thread | None = None
    _run_error: BaseException | None = None
    multi_agent: ClassVar[bool]
    """Agents in policy groups (True) or one agent per episode; picks the server's routes."""

    def run(self) -> None:
        """Override to drive episodes (call start_episode, get_action, ... on self);
        :meth:`start` runs it in a thread of its own."""
        name = type(self).__name__
        raise NotImplementedError(
            f"{name}.run(): subclass {name} and override run() to use start(); or call "
            "start_episode/get_action/... from your own threads."
        )

    def start(self) -> None:
        """Runs :meth:`run` in a daemon thread; :meth:`join` waits and re-raises its error.

        Raises:
            InvalidArgumentError: a thread was already started.
        """
        if self._run_thread is not None:
            raise InvalidArgumentError(
                f"{type(self).__name__}.start(): the run() thread was already started."
            )

        def target() -> None:
            try:
                self.run()
            except BaseException as err:  # handed to join()
                self._run_error = err

        self._run_thread = threading.Thread(
            target=target, name="jaxrunner-external-run", daemon=True
        )
        self._run_thread.start()

    def join(self, timeout_s: float | None = None) -> bool:
        """Waits for the run() thread; returns False if it is still running after
        ``timeout_s`` (True if none was started). Re-raises an exception run() raised."""
        if self._run_thread is None:
            return True
        self._run_thread.join(timeout_s)
        if self._run_error is not None:
            error, self._run_error = self._run_error, None
            raise error
        return not self._run_thread.is_alive()
