"""The optional ``run()`` thread of an :class:`~jaxrunner.ExternalEnv` (as RLlib's
ExternalEnv: a subclass drives its episodes from a thread of its own)."""

from __future__ import annotations

import threading
from collections.abc import Callable

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


__all__ = ["RunThread"]
