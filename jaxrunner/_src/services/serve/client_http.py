"""The HTTP side of a policy client: its JSON requests, and the server's errors raised as
exceptions."""

from __future__ import annotations

import json
from typing import Any

import httpx

import jaxrunner.errors as errors
from jaxrunner._src.core.episode import Episode


class PolicyServerError(errors.JaxRunnerError, RuntimeError):
    """The server refused a request (401, 413, 415, ...) or failed.

    Attributes:
        status: the HTTP status.
        code: the server's error code (``"unauthorized"``, ...).
    """

    def __init__(self, message: str, status: int, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


class ReportError(PolicyServerError):
    """A locally run episode could not be reported whole (``inference="local"``).

    Nothing is lost: the first ``steps_reported`` steps are on the server, in an
    episode ended there as truncated at the next observation (so its slot is free),
    unless the failure left unknown whether the last request arrived (a network
    error: then the server's reaper ends it after ``episode_timeout_s``); all of
    them, reported or not, are in ``episode``.

    Attributes:
        episode: the whole episode as run locally.
        steps_reported: how many of its first steps the server recorded.
        ended_on_server: whether the server's episode was ended (its slot freed).
    """

    def __init__(
        self,
        message: str,
        status: int,
        code: str,
        *,
        episode: Episode | None,
        steps_reported: int,
        ended_on_server: bool,
    ) -> None:
        super().__init__(message, status, code)
        self.episode = episode
        self.steps_reported = steps_reported
        self.ended_on_server = ended_on_server


MAX_ANSWER_BYTES = 32 << 20
"""The default bound on one answer of the server (a client's ``max_answer_bytes``)."""


def parse_answer(data: bytes, status: int, path: str) -> Any:
    """An answer's JSON; :class:`PolicyServerError` (``invalid_answer``) if it is none."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as err:
        why = "nested too deeply" if isinstance(err, RecursionError) else "not valid JSON"
        raise PolicyServerError(
            f"the server's answer to {path} is {why} ({len(data)} bytes); is the URL a "
            "jaxrunner policy server?",
            status,
            "invalid_answer",
        ) from None


_INVALID = {
    "space_mismatch": errors.SpaceMismatchError,
    "invalid_type": errors.InvalidArgumentTypeError,
}
"""The 422 codes of the server's error kinds (``error_handlers._STATUS``) other than
``invalid_value`` and the schema's ``invalid_request``, both InvalidArgumentError."""


def raise_for(status: int, answer: Any) -> None:
    """Raises the server's error answer (``answer`` its parsed JSON) as the env's error
    (``EpisodeNotFoundError`` for 404/410, ...) or as :class:`PolicyServerError`."""
    try:
        detail = answer["error"]
        code, message = str(detail["code"]), str(detail["message"])
    except (KeyError, TypeError):
        code, message = "http_error", str(answer)[:200]
    text = f"{message} (HTTP {status} {code})"
    if status in (404, 410):
        raise errors.EpisodeNotFoundError(text, ended=status == 410)
    kind = {
        409: errors.EpisodeConflictError,
        429: errors.MemoryLimitError if code == "memory_limit" else errors.TooManyEpisodesError,
        422: _INVALID.get(code, errors.InvalidArgumentError),  # the server's own kind
        503: errors.ActionTimeoutError if code == "timeout" else None,
    }.get(status)
    if kind is not None:
        raise kind(text)
    raise PolicyServerError(text, status, code)


def check_fields(answer: Any, fields: tuple[str, ...], request: str, status: int) -> Any:
    """``answer``, a JSON object with ``fields``; else :class:`PolicyServerError`
    (``invalid_answer``)."""
    missing = [f for f in fields if not isinstance(answer, dict) or f not in answer]
    if missing:
        raise PolicyServerError(
            f"the server's answer to {request} has no {', '.join(map(repr, missing))}; is the "
            "URL a jaxrunner policy server of the same version?",
            status,
            "invalid_answer",
        )
    return answer


def request_json(
    http: httpx.Client,
    method: str,
    path: str,
    body: Any = None,
    *,
    content: bytes | None = None,
    params: dict[str, Any] | None = None,
    max_bytes: int = MAX_ANSWER_BYTES,
    fields: tuple[str, ...] = (),
) -> Any:
    """The server's JSON answer to a request (``body`` as JSON, or ``content`` already
    encoded), read up to ``max_bytes``, an object with ``fields``; errors raised as
    :func:`raise_for` does, or as :class:`PolicyServerError` (``answer_too_large``,
    ``invalid_answer``)."""
    headers = None if content is None else {"Content-Type": "application/json"}
    with http.stream(
        method, path, json=body, content=content, params=params, headers=headers
    ) as response:
        data = bytearray()
        for chunk in response.iter_bytes():  # decoded: a compressed answer is bounded too
            data += chunk
            if len(data) > max_bytes:
                raise PolicyServerError(
                    f"the server's answer to {path} is longer than max_answer_bytes="
                    f"{max_bytes}; it was not read whole. Raise the client's "
                    "max_answer_bytes if the server is yours (params of a large policy).",
                    response.status_code,
                    "answer_too_large",
                )
    if response.status_code >= 400:
        try:
            answer = parse_answer(bytes(data), response.status_code, path)
        except PolicyServerError:
            answer = bytes(data[:200]).decode("utf-8", "replace")
        raise_for(response.status_code, answer)
    answer = parse_answer(bytes(data), response.status_code, path)
    return check_fields(answer, fields, f"{method} {path}", response.status_code)
