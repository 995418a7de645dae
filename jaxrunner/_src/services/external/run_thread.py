"""The optional ``run()`` thread of an :class:`~jaxrunner.ExternalEnv` (as RLlib's
ExternalEnv: a subclass drives its episodes from a thread of its own)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import ClassVar

from jaxrunner.errors import InvalidArgumentError


class RunThread:
    """Runs a callable once in a daemon thread; :meth:`join` re-raises its error."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, run: Callable[[], None]) -> None:
        """Starts ``run`` in a daemon thread.

        Raises:
            InvalidArgumentError: a thread was already started.
        """
        if self._thread is not None:
            raise InvalidArgumentError("ExternalEnv.start(): the run() thread was already started.")

        def target() -> None:
            try:
                run()
            except BaseException as err:  # handed to join()
                self._error = err

        self._thread = threading.Thread(target=target, name="jaxrunner-external-run", daemon=True)
        self._thread.start()

    def join(self, timeout_s: float | None = None) -> bool:
        """Waits for the thread; returns False if it is still running after
        ``timeout_s`` (True if none was started). Re-raises an exception it raised."""
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return not self._thread.is_alive()


class RunDriven:
    """``run``/``start``/``join`` of the external envs (single- and multi-agent): a
    subclass overrides :meth:`run` to drive its episodes, :meth:`start` runs it in a
    thread of its own. The env sets ``_run_thread`` in its constructor."""

    _run_thread: RunThread
    multi_agent: ClassVar[bool]
    """The kind of env each subclass declares: agents in policy groups (True) or one
    agent per episode; the policy server reads it to pick its routes."""

    def run(self) -> None:
        """Override to drive episodes (call start_episode, get_action, ... on self);
        :meth:`start` runs it in a thread of its own."""
        name = type(self).__name__
        raise NotImplementedError(
            f"{name}.run(): subclass {name} and override run() to use start(); or call "
            "start_episode/get_action/... from your own threads."
        )

    def start(self) -> None:
        """Runs :meth:`run` in a daemon thread; :meth:`join` waits and re-raises its error."""
        self._run_thread.start(self.run)

    def join(self, timeout_s: float | None = None) -> bool:
        """Waits for the run() thread; returns False if it is still running after
        ``timeout_s``. Re-raises an exception run() raised."""
        return self._run_thread.join(timeout_s)
