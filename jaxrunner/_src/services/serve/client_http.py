"""The HTTP side of a policy client: its connection, JSON requests, and the server's errors
raised as exceptions."""

from __future__ import annotations

import os
import uuid
from typing import Any

import httpx

import jaxrunner.errors as errors
from jaxrunner._src.core.episode import Episode
from jaxrunner._src.services.serve.auth import read_token


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


def raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        detail = response.json()["error"]
        code, message = str(detail["code"]), str(detail["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "http_error", response.text[:200]
    text = f"{message} (HTTP {response.status_code} {code})"
    status = response.status_code
    if status in (404, 410):
        raise errors.EpisodeNotFoundError(text, ended=status == 410)
    kind = {
        409: errors.EpisodeConflictError,
        429: errors.TooManyEpisodesError,
        422: errors.SpaceMismatchError,
    }.get(status)
    if status == 429 and code == "memory_limit":
        kind = errors.MemoryLimitError
    if kind is not None:
        raise kind(text)
    if status == 503 and code == "timeout":
        raise errors.ActionTimeoutError(text)
    raise PolicyServerError(text, status, code)


def open_http(
    url: str,
    token: str | None,
    token_file: str | os.PathLike[str] | None,
    client_id: str | None,
    timeout_s: float,
) -> httpx.Client:
    """The HTTP connection pool of a policy client: its token (given, or read from
    ``token_file``) and client id (random by default) in every request's headers."""
    if token is None and token_file is not None:
        token = read_token(token_file)
    headers = {"X-Client-Id": client_id or f"client-{uuid.uuid4().hex[:12]}"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.Client(
        base_url=url,
        headers=headers,
        timeout=timeout_s,
        # Idle connections expire here before the server's keep-alive (30 s) ends
        # them, so a request never goes out on a connection being closed.
        limits=httpx.Limits(
            max_connections=256, max_keepalive_connections=256, keepalive_expiry=10.0
        ),
    )


def request_json(http: httpx.Client, method: str, path: str, body: Any = None) -> Any:
    """The server's JSON answer to a JSON request; its errors raised as the env's
    (``EpisodeNotFoundError`` for 404/410, ...) or :class:`PolicyServerError`."""
    response = http.request(method, path, json=body)
    raise_for(response)
    return response.json()
