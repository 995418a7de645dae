"""Restarting failed sub-envs: the ``RestartPolicy`` and the bounded, backed-off
recreation. See docs/fault-tolerance.md."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import gymnasium

from jaxrunner._src.arg_checks import check_int, check_number, refusal
from jaxrunner.errors import EnvError, InvalidArgumentError, InvalidArgumentTypeError

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RestartPolicy:
    """How a failed sub-env is recreated."""

    max_attempts: int = 3
    """Recreations (make + reset) tried in a row before giving up and raising."""
    backoff_s: float = 0.0
    """Wait before the second attempt; doubled after each further failure."""
    max_backoff_s: float = 5.0
    """Upper bound of the wait between attempts."""

    def __post_init__(self) -> None:
        check_int("RestartPolicy", "max_attempts", self.max_attempts)
        check_number("RestartPolicy", "backoff_s", self.backoff_s)
        check_number("RestartPolicy", "max_backoff_s", self.max_backoff_s)
        if not self.backoff_s <= self.max_backoff_s:
            raise InvalidArgumentError(
                f"RestartPolicy(backoff_s={self.backoff_s}, max_backoff_s={self.max_backoff_s}):"
                " expected 0 <= backoff_s <= max_backoff_s."
            )

    def waits(self) -> list[float]:
        """The wait before each attempt (none before the first)."""
        waits, wait = [0.0], self.backoff_s
        for _ in range(self.max_attempts - 1):
            waits.append(wait)
            wait = min(2 * wait, self.max_backoff_s) if wait else 0.0
        return waits


def retry(
    attempt: Callable[[], T],
    policy: RestartPolicy,
    cause: BaseException,
    give_up: Callable[[BaseException], BaseException],
) -> T:
    """Calls ``attempt`` (which cleans up after itself when it raises) until it returns,
    at most ``policy.max_attempts`` times, waiting ``policy.waits()`` before each try: the
    one retry-with-backoff of every backend. Once every attempt failed, raises
    ``give_up(last_error)`` from ``cause``, its ``recreation_error`` the last error."""
    last: BaseException | None = None
    for wait in policy.waits():
        time.sleep(wait)
        try:
            return attempt()
        except Exception as err:
            last = err
    assert last is not None  # internal: max_attempts >= 1
    error = give_up(last)
    error.recreation_error = last  # type: ignore[attr-defined]
    raise error from cause


def recreation_failed(
    index: int, cause: BaseException, policy: RestartPolicy, last: BaseException
) -> EnvError:
    """The error once ``policy``'s every attempt to recreate failed sub-env ``index``
    failed, the last with ``last``."""
    return EnvError(
        f"sub-env {index} failed ({cause!r}) and could not be recreated: "
        f"{policy.max_attempts} attempts in a row failed, the last with {last!r}. Fix the "
        "env factory, or raise RestartPolicy(max_attempts=...) / backoff_s.",
        index,
    )


def close_quietly(env: gymnasium.Env) -> None:
    """Closes a sub-env that already failed; its close may fail too and must not mask
    the original error."""
    with contextlib.suppress(Exception):
        env.close()


@contextlib.contextmanager
def closing_on_error(envs: Sequence[Any]) -> Iterator[None]:
    """Closes ``envs`` (quietly) if the body raises, then lets the error through."""
    try:
        yield
    except BaseException:
        for env in envs:
            close_quietly(env)
        raise


def check_restart_policy(where: str, value: Any) -> None:
    """Refuses a ``restart_policy`` that is neither None nor a RestartPolicy (a bool
    would otherwise fail at the first sub-env failure, far from its cause)."""
    if value is not None and not isinstance(value, RestartPolicy):
        what = "a jaxrunner.RestartPolicy (e.g. jr.RestartPolicy(): failed sub-envs restart)"
        none = "to let failures raise"
        raise InvalidArgumentTypeError(
            refusal(where, "restart_policy", value, what, none, "", False)
        )
