"""Errors of the policy server as HTTP answers: ``{"error": {"code": ..., "message": ...}}``
with the status of the error's kind, never a traceback (anything unexpected: logged, 500)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

import jaxrunner.errors as errors

logger = logging.getLogger("jaxrunner.serve")

_STATUS: list[tuple[type[BaseException], int, str]] = [
    (errors.MemoryLimitError, 429, "memory_limit"),
    (errors.TooManyEpisodesError, 429, "too_many_episodes"),
    (errors.EpisodeConflictError, 409, "episode_conflict"),
    (errors.ActionTimeoutError, 503, "timeout"),
    (errors.ClosedError, 503, "closed"),
    (errors.SpaceMismatchError, 422, "space_mismatch"),
    (errors.InvalidArgumentError, 422, "invalid_value"),
    (errors.InvalidArgumentTypeError, 422, "invalid_type"),
]
"""Status and code of each error kind, the first that matches (a client raises the
same kind again from the code: ``client_http.raise_for``)."""


def error_response(status: int, code: str, message: str) -> JSONResponse:
    """The error answer: ``{"error": {"code": code, "message": message}}`` (the
    message cut at 500 characters)."""
    return JSONResponse({"error": {"code": code, "message": message[:500]}}, status_code=status)


class ClientGone(Exception):
    """The client hung up before its answer was sent (the response goes nowhere)."""


def install_error_handlers(app: FastAPI) -> None:
    """Makes ``app`` answer every error as :func:`error_response` does."""

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone) -> JSONResponse:
        return error_response(400, "client_gone", "the client hung up before the answer.")

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()))
        return error_response(422, "invalid_request", f"{where}: {first.get('msg', 'invalid')}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:  # FastAPI could not parse the body
            return error_response(400, "invalid_json", "the request body is not valid JSON.")
        code = {404: "not_found", 405: "method_not_allowed", 501: "not_implemented"}.get(
            exc.status_code, "bad_request"
        )
        return error_response(exc.status_code, code, str(exc.detail))

    @app.exception_handler(errors.JaxRunnerError)
    async def jaxrunner_error(request: Request, exc: errors.JaxRunnerError) -> JSONResponse:
        if isinstance(exc, errors.EpisodeNotFoundError):
            if exc.ended:
                return error_response(410, "episode_ended", str(exc))
            return error_response(404, "episode_not_found", str(exc))
        for kind, status, code in _STATUS:
            if isinstance(exc, kind):
                return error_response(status, code, str(exc))
        logger.exception("unexpected jaxrunner error", exc_info=exc)
        return error_response(500, "internal", "internal server error")

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("internal error", exc_info=exc)
        return error_response(500, "internal", "internal server error")
