"""The guard of the policy server, before FastAPI reads anything: the health answer, the
token (401; only :data:`OPEN_PATHS` go without), JSON only (415) and the body size cap
(413, also for a body that streams past it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.responses import JSONResponse

from jaxrunner._src.services.serve.auth import carries_token
from jaxrunner._src.services.serve.error_handlers import error_response

OPEN_PATHS = frozenset({"/v1/health", "/openapi.json"})
"""Paths served without a token: liveness and the published schema only."""
HEALTH = JSONResponse({"status": "ok"})
"""``GET /v1/health``'s answer, given here: the liveness probe anyone may send is the
cheapest request to flood with, so it costs no routing (the app's route documents it)."""


class Guard:
    """Pure ASGI middleware enforcing the token, JSON bodies and the size cap."""

    def __init__(self, app: Any, token: str | None, max_body_bytes: int) -> None:
        self.app, self.token, self.max_body_bytes = app, token, max_body_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == "/v1/health" and scope["method"] == "GET":
            await HEALTH(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope["headers"]}
        if self.token is not None and scope["path"] not in OPEN_PATHS:
            if not carries_token(scope["headers"], self.token):
                await error_response(
                    401,
                    "unauthorized",
                    "missing or wrong token, or several Authorization headers: send one "
                    "'Authorization: Bearer <token>' with the token from the server's token file.",
                )(scope, receive, send)
                return
        if scope["method"] in ("POST", "PUT", "PATCH"):
            media = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            if media != b"application/json":
                await error_response(
                    415,
                    "unsupported_media_type",
                    f"bodies must be JSON (Content-Type: application/json), got "
                    f"{media.decode('latin-1')[:60]!r}; pickle and other formats are refused.",
                )(scope, receive, send)
                return
            declared = headers.get(b"content-length")
            if declared is not None and (
                not declared.isdigit() or int(declared) > self.max_body_bytes
            ):
                await self._too_large(scope, receive, send)
                return
            body = bytearray()
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                body += message.get("body", b"")
                if len(body) > self.max_body_bytes:
                    await self._too_large(scope, receive, send)
                    return
                if not message.get("more_body", False):
                    break
            replayed = False

            async def replay() -> dict:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": bytes(body), "more_body": False}
                return await receive()

            await self.app(scope, replay, send)
            return
        await self.app(scope, receive, send)

    async def _too_large(self, scope: dict, receive: Callable, send: Callable) -> None:
        await error_response(
            413, "too_large", f"the request body exceeds the limit of {self.max_body_bytes} bytes."
        )(scope, receive, send)
