"""The HTTP side of a policy client: its JSON requests, the server's errors raised as
exceptions, and the client core both kinds of client share (connection, kind check,
episodes, metrics)."""

from __future__ import annotations

import json
import os
import re
import uuid
from typing import Any, ClassVar, Self

import httpx
import numpy as np
from gymnasium import spaces

import jaxrunner.errors as errors
from jaxrunner._src.arg_checks import check_int, check_number, check_path
from jaxrunner._src.core.episode import Episode
from jaxrunner._src.services.serve import wire
from jaxrunner._src.services.serve.auth import check_sendable, read_token
from jaxrunner._src.space_arrays import check_value


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


class NoAnswerError(PolicyServerError):
    """A request got no answer (``status`` 0): the connection failed (``code``
    ``network_error``) or the answer took longer than the client's ``timeout_s``
    (``timeout``); httpx's error is its ``__cause__``."""

    @classmethod
    def of(cls, err: httpx.TransportError, method: str, path: str) -> NoAnswerError:
        request = f"{method} {path}"
        if isinstance(err, (httpx.ConnectError, httpx.ConnectTimeout)):
            return cls(
                f"{request}: could not connect to the server ({err!r}); the request was never "
                "sent, so retrying it is safe. Is the server running at this URL?",
                0,
                "network_error",
            )
        timed_out = isinstance(err, httpx.TimeoutException)
        what = "took longer than the client's timeout_s" if timed_out else "failed"
        kind = NoAnswerTimeoutError if timed_out else cls
        return kind(
            f"{request}: the answer {what} ({err!r}); the server may have acted on it. "
            + _retry_advice(method, path),
            0,
            "timeout" if timed_out else "network_error",
        )


class NoAnswerTimeoutError(NoAnswerError, TimeoutError):
    """A :class:`NoAnswerError` whose answer took longer than the client's ``timeout_s``
    (``code`` ``timeout``): a ``TimeoutError``, as the server's own action timeout
    (``ActionTimeoutError``) and every jaxrunner timeout are."""

    # OSError (TimeoutError's base) lays the instance out: unpickling calls cls.__new__,
    # which RuntimeError's, first in the MRO, refuses for this class.
    __new__ = TimeoutError.__new__


def _retry_advice(method: str, path: str) -> str:
    """Whether retrying ``method path`` that may have reached the server is safe."""
    call = path.rsplit("/", 1)[-1]
    if method == "GET":
        return "It changes nothing on the server: retrying it is safe."
    if path == "/v1/episodes":
        return (
            "Retrying starts another episode (one started by this request is ended by the "
            "server's reaper after episode_timeout_s; with an episode_id, the retry answers "
            "409 if it was started)."
        )
    if call in ("action", "log_action"):
        return (
            "The server takes back a step whose answer did not reach the client, so retrying "
            "is safe once the server has noticed (until then the retry answers 409: wait and "
            "retry); only an answer already sent as the client gave up stays recorded."
        )
    if call == "returns":
        return "The reward may have been added: retrying it may add it twice."
    if call in ("end", "end_agents"):
        return "Retrying is safe: it answers 410 (EpisodeNotFoundError, ended=True) if it ended."
    return "Whether it was recorded is unknown: retrying it may record it twice."


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
        422: errors.SpaceMismatchError  # the server's kind (error_handlers._STATUS)
        if code == "space_mismatch"
        else errors.InvalidArgumentTypeError
        if code == "invalid_type"
        else errors.InvalidArgumentError,  # invalid_value, the schema's invalid_request
        # the env's own action timeout, or the env closed: what it raises in process
        503: {"timeout": errors.ActionTimeoutError, "closed": errors.ClosedError}.get(code),
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
    try:
        with http.stream(
            method, path, json=body, content=content, params=params, headers=headers
        ) as response:
            data = _read_answer(response, path, max_bytes)
    except httpx.TransportError as err:
        raise NoAnswerError.of(err, method, path) from err
    if response.status_code >= 400:
        try:
            answer = parse_answer(bytes(data), response.status_code, path)
        except PolicyServerError:
            answer = bytes(data[:200]).decode("utf-8", "replace")
        raise_for(response.status_code, answer)
    answer = parse_answer(bytes(data), response.status_code, path)
    return check_fields(answer, fields, f"{method} {path}", response.status_code)


def _read_answer(response: httpx.Response, path: str, max_bytes: int) -> bytearray:
    """The body of ``response``, decoded, up to ``max_bytes``; else
    :class:`PolicyServerError` (``answer_too_large``, ``invalid_answer``)."""
    data = bytearray()
    try:
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
    except httpx.DecodingError as err:  # (else httpx's own error reaches the caller)
        raise PolicyServerError(
            f"the server's answer to {path} could not be decoded ({err}; Content-Encoding "
            f"{response.headers.get('content-encoding')!r}); is the URL a jaxrunner policy "
            "server?",
            response.status_code,
            "invalid_answer",
        ) from err
    return data


class ClientCore:
    """What both clients share: the connection, the server's spaces, episodes, metrics."""

    multi_agent: ClassVar[bool]
    """The kind of env this client talks to (the server says it in ``/v1/spaces``)."""

    def __init__(
        self,
        url: str,
        token: str | None,
        token_file: str | os.PathLike[str] | None,
        client_id: str | None,
        timeout_s: float,
        max_answer_bytes: int,
    ) -> None:
        check_int(type(self).__name__, "max_answer_bytes", max_answer_bytes)
        check_number(type(self).__name__, "timeout_s", timeout_s, low_open=True, hint="seconds")
        if token_file is not None:
            check_path(type(self).__name__, "token_file", token_file)
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise errors.InvalidArgumentError(
                f"{type(self).__name__}(url={url!r}): expected the server's http:// or "
                "https:// URL, as PolicyServer.url gives it (e.g. 'http://127.0.0.1:8000')."
            )
        # Checked here: the server refuses other names on every start_episode (422).
        if client_id is not None and not isinstance(client_id, str):
            raise errors.InvalidArgumentTypeError(
                f"{type(self).__name__}(client_id={client_id!r:.80}): expected a str or None, "
                f"got {type(client_id).__name__}."
            )
        if client_id and not re.fullmatch(wire.CLIENT_ID_PATTERN, client_id):
            raise errors.InvalidArgumentError(
                f"{type(self).__name__}(client_id={client_id!r:.80}): expected 1 to 64 ASCII "
                "letters, digits or '_.:-' (the X-Client-Id the server takes), e.g. 'robot-1'; "
                "or None for a random one."
            )
        if token is None and token_file is not None:
            token = read_token(token_file)
        elif token is not None:  # httpx raised UnicodeEncodeError on the first request
            check_sendable(token, f"{type(self).__name__}(token=...)")
        headers = {"X-Client-Id": client_id or f"client-{uuid.uuid4().hex[:12]}"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        self.max_answer_bytes = max_answer_bytes
        try:
            self._http = httpx.Client(
                base_url=url,
                headers=headers,
                timeout=timeout_s,
                # Expiring before the server's keep-alive (30 s): no request on a closing one.
                limits=httpx.Limits(
                    max_connections=256, max_keepalive_connections=256, keepalive_expiry=10.0
                ),
            )
        except httpx.InvalidURL as err:  # (else httpx's own error reaches the caller)
            raise errors.InvalidArgumentError(
                f"{type(self).__name__}(url={url!r}): not a valid URL ({err}); expected the "
                "server's URL as PolicyServer.url gives it (e.g. 'http://127.0.0.1:8000')."
            ) from None
        try:
            self._spaces = self._call("GET", "/v1/spaces")
            if (
                isinstance(self._spaces, dict)
                and ("agents" in self._spaces) is not self.multi_agent
            ):
                other = "single-agent" if self.multi_agent else "multi-agent"
                client = "PolicyClient" if self.multi_agent else "MultiAgentPolicyClient"
                raise errors.InvalidArgumentError(
                    f"{type(self).__name__}({url!r}): the server serves a {other} env; talk "
                    f"to it with jaxrunner.serve.{client}."
                )
            kind = ("agents",) if self.multi_agent else ("observation_space", "action_space")
            check_fields(self._spaces, kind, "GET /v1/spaces", 200)  # (the route answers 200)
        except BaseException:
            self._http.close()
            raise

    def start_episode(self, episode_id: int | None = None, training_enabled: bool = True) -> int:
        """Starts an episode on the server; returns its id."""
        body = {"episode_id": _plain(episode_id), "training_enabled": _plain(training_enabled)}
        return int(self._call("POST", "/v1/episodes", body, fields=("episode_id",))["episode_id"])

    def get_metrics(self) -> dict[str, Any]:
        """The server's metrics."""
        return self._call("GET", "/v1/metrics")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        fields: tuple[str, ...] = (),
    ) -> Any:
        """The server's answer, a JSON object with ``fields`` (else ``invalid_answer``)."""
        self._check_open()
        return request_json(
            self._http,
            method,
            path,
            body,
            params=params,
            max_bytes=self.max_answer_bytes,
            fields=fields,
        )

    def _check_open(self) -> None:
        """Raises ``ClosedError`` after :meth:`close`: every call checks it first."""
        if self._http.is_closed:
            raise errors.ClosedError(
                f"{type(self).__name__}: called after close(); create a new client."
            )

    @staticmethod
    def _encode(space: spaces.Space, value: Any, name: str, *, bounds: bool = True) -> Any:
        return wire.encode_tree(space, check_value(space, value, name, bounds=bounds))

    @staticmethod
    def _decode(space: spaces.Space, tree: Any, name: str) -> Any:
        return check_value(space, wire.decode_tree(space, tree, name), name, bounds=False)


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value JSON takes, as an env in process takes it (the
    server checks it); anything else as it is."""
    return value.item() if isinstance(value, np.generic) else value
