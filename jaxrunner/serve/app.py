"""The HTTP API of a :class:`~jaxrunner.ExternalEnv`: a FastAPI app.

Every request passes, in this order, before it can touch any state: the token
check (401), the JSON-only rule (415: pickle and every other format are refused),
the body size cap (413), the schema (422, pydantic, strict types, finite floats),
the wire decoding (422: dtype allowlist, shapes, byte counts) and the space check
(422). Then the env's own rules apply: unknown episode 404, ended episode 410,
conflict 409, caps 429, timeout or closed 503. Errors are
``{"error": {"code": ..., "message": ...}}``, never a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Header, Path, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from jaxrunner import errors
from jaxrunner.external import MAX_EPISODE_ID, ExternalEnv
from jaxrunner.serve import wire
from jaxrunner.serve.auth import token_matches
from jaxrunner.spaces import check_value

logger = logging.getLogger("jaxrunner.serve")

OPEN_PATHS = frozenset({"/v1/health", "/openapi.json"})
"""Paths served without a token: liveness and the published schema only."""

MAX_REPORT_STEPS = 4096


# -- schema ---------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


DType = Literal[wire.DTYPES]  # type: ignore[valid-type]


class WireArray(_Strict):
    """An array: little-endian bytes in base64, a dtype from the allowlist."""

    dtype: DType
    shape: list[Annotated[int, Field(ge=0)]] = Field(max_length=wire.MAX_DIMS)
    data: str


Tree = WireArray | dict[str, Any] | list[Any]
"""An observation or action: one array, or an object/list of them shaped by the space."""
Reward = Annotated[float, Field(allow_inf_nan=False)]
EpisodeId = Annotated[int, Path(ge=0, le=MAX_EPISODE_ID)]


class StartEpisode(_Strict):
    episode_id: Annotated[int, Field(ge=0, le=MAX_EPISODE_ID)] | None = None
    training_enabled: bool = True


class ObsBody(_Strict):
    obs: Tree


class LogActionBody(_Strict):
    obs: Tree
    action: Tree


class ReturnsBody(_Strict):
    reward: Reward
    info: dict[str, Any] | None = None


class EndBody(_Strict):
    obs: Tree
    truncated: bool = False


class ReportBody(_Strict):
    """Steps taken with locally computed actions; ``final_obs`` (if given) ends the
    episode after them."""

    obs: list[Tree] = Field(max_length=MAX_REPORT_STEPS)
    actions: list[Tree] = Field(max_length=MAX_REPORT_STEPS)
    rewards: list[Reward] = Field(max_length=MAX_REPORT_STEPS)
    final_obs: Tree | None = None
    truncated: bool = False


class EpisodeCreated(BaseModel):
    episode_id: int


class ActionOut(BaseModel):
    action: Tree


class Ok(BaseModel):
    ok: bool


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorOut(BaseModel):
    error: ErrorDetail


_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorOut} for status in (401, 404, 409, 410, 413, 415, 422, 429, 503)
}

_STATUS: list[tuple[type[BaseException], int, str]] = [
    (errors.MemoryLimitError, 429, "memory_limit"),
    (errors.TooManyEpisodesError, 429, "too_many_episodes"),
    (errors.EpisodeConflictError, 409, "episode_conflict"),
    (errors.ActionTimeoutError, 503, "timeout"),
    (errors.ClosedError, 503, "closed"),
    (errors.SpaceMismatchError, 422, "invalid_value"),
    (errors.InvalidArgumentError, 422, "invalid_value"),
    (errors.InvalidArgumentTypeError, 422, "invalid_value"),
]


def error_response(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message[:500]}}, status_code=status)


def _raw(tree: Any) -> Any:
    """A validated Tree back to plain JSON values."""
    if isinstance(tree, BaseModel):
        return tree.model_dump()
    return tree


def _finite(value: Any) -> Any:
    """Metrics as strict JSON: NaN (no episode yet) becomes null."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# -- the guard: token, media type and size, before FastAPI reads anything --------------------


class Guard:
    """Pure ASGI middleware enforcing the token, JSON bodies and the size cap."""

    def __init__(self, app: Any, token: str | None, max_body_bytes: int) -> None:
        self.app, self.token, self.max_body_bytes = app, token, max_body_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope["headers"]}
        if self.token is not None and scope["path"] not in OPEN_PATHS:
            auth = headers.get(b"authorization", b"").decode("latin-1")
            if not token_matches(auth, self.token):
                await error_response(
                    401,
                    "unauthorized",
                    "missing or wrong token: send 'Authorization: Bearer <token>' with the token "
                    "from the server's token file.",
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


# -- the app --------------------------------------------------------------------------------


def create_app(env: ExternalEnv, token: str | None, max_body_bytes: int) -> tuple[Guard, FastAPI]:
    """The ASGI app serving ``env``: the :class:`Guard`-wrapped app to run, and the
    FastAPI app inside it (for its OpenAPI schema)."""
    obs_space, action_space = env.observation_space, env.action_space
    timeout_s = env.config.action_timeout_s
    app = FastAPI(
        title="jaxrunner policy server",
        version="1",
        description="Agents that run elsewhere call in for actions and report experience. "
        "Arrays are JSON objects {dtype, shape, data(base64, little-endian)}.",
        docs_url=None,
        redoc_url=None,
    )
    bearer = Security(HTTPBearer(auto_error=False, description="the server's token"))
    params_cache: dict[str, Any] = {}

    async def deliver(episode_id: int, future: Any, request: Request) -> Any:
        """The future's result, recorded only if it reaches the client: on timeout or
        a client that hangs up it is withdrawn (cancelled, never recorded); one that
        came back for a client gone by then is retracted. Both are counted in
        ``num_dropped_steps``."""
        result = asyncio.wrap_future(future)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait(
                {result, gone}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            gone.cancel()
        if result not in done:
            if future.cancel():  # still pending: withdrawn, nothing recorded
                if gone in done:
                    raise ClientGone()
                raise errors.ActionTimeoutError(
                    f"the policy did not answer within {timeout_s} s; the request was "
                    "withdrawn (nothing recorded): retry it."
                )
            await asyncio.wait({result})  # being recorded right now: deliver it
        value = result.result()
        if await request.is_disconnected():
            env.retract_action(episode_id, future)
            raise ClientGone()
        return value

    def decode(obj: Any, where: str, space: Any = obs_space) -> Any:
        return wire.decode_tree(space, _raw(obj), where)

    @app.get("/v1/health", tags=["meta"])
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/spaces", dependencies=[bearer], responses=_ERRORS, tags=["meta"])
    async def get_spaces() -> JSONResponse:
        return JSONResponse(
            {
                "observation_space": wire.space_to_json(obs_space),
                "action_space": wire.space_to_json(action_space),
            }
        )

    @app.get("/v1/metrics", dependencies=[bearer], responses=_ERRORS, tags=["meta"])
    async def get_metrics() -> JSONResponse:
        return JSONResponse(_finite(env.get_metrics()))

    @app.get("/v1/params", dependencies=[bearer], responses=_ERRORS, tags=["params"])
    async def get_params(
        since: Annotated[int | None, Query(ge=0, description="skip params if unchanged")] = None,
    ) -> JSONResponse:
        params, version = env.get_params()
        if since == version:
            return JSONResponse({"version": version, "params": None})
        if params_cache.get("version") != version:
            encoded = await run_in_threadpool(wire.encode_params, params)
            params_cache.update(version=version, params=encoded)
        return JSONResponse({"version": version, "params": params_cache["params"]})

    @app.post(
        "/v1/episodes",
        status_code=201,
        dependencies=[bearer],
        responses={201: {"model": EpisodeCreated}, **_ERRORS},
        tags=["episodes"],
    )
    async def start_episode(
        body: StartEpisode,
        request: Request,
        x_client_id: Annotated[
            str | None,
            Header(pattern=r"^[A-Za-z0-9_.:-]{1,64}$", description="caps are per client"),
        ] = None,
    ) -> JSONResponse:
        peer = request.client.host if request.client else "unknown"
        client = x_client_id or f"peer:{peer}"
        episode_id = env.start_episode(body.episode_id, body.training_enabled, client=client)
        return JSONResponse({"episode_id": episode_id}, status_code=201)

    @app.post(
        "/v1/episodes/{episode_id}/action",
        dependencies=[bearer],
        responses={200: {"model": ActionOut}, **_ERRORS},
        tags=["episodes"],
    )
    async def get_action(episode_id: EpisodeId, body: ObsBody, request: Request) -> JSONResponse:
        future = env.submit_action(episode_id, decode(body.obs, "obs"))
        action = await deliver(episode_id, future, request)
        return JSONResponse({"action": wire.encode_tree(action_space, action)})

    @app.post(
        "/v1/episodes/{episode_id}/log_action",
        dependencies=[bearer],
        responses={200: {"model": Ok}, **_ERRORS},
        tags=["episodes"],
    )
    async def log_action(
        episode_id: EpisodeId, body: LogActionBody, request: Request
    ) -> JSONResponse:
        obs = decode(body.obs, "obs")
        action = decode(body.action, "action", action_space)
        await deliver(episode_id, env.submit_log_action(episode_id, obs, action), request)
        return JSONResponse({"ok": True})

    @app.post(
        "/v1/episodes/{episode_id}/returns",
        dependencies=[bearer],
        responses={200: {"model": Ok}, **_ERRORS},
        tags=["episodes"],
    )
    async def log_returns(episode_id: EpisodeId, body: ReturnsBody) -> JSONResponse:
        env.log_returns(episode_id, body.reward, body.info)
        return JSONResponse({"ok": True})

    @app.post(
        "/v1/episodes/{episode_id}/end",
        dependencies=[bearer],
        responses={200: {"model": Ok}, **_ERRORS},
        tags=["episodes"],
    )
    async def end_episode(episode_id: EpisodeId, body: EndBody) -> JSONResponse:
        env.end_episode(episode_id, decode(body.obs, "obs"), truncated=body.truncated)
        return JSONResponse({"ok": True})

    @app.post(
        "/v1/episodes/{episode_id}/report",
        dependencies=[bearer],
        responses={200: {"model": Ok}, **_ERRORS},
        tags=["episodes"],
    )
    async def report(episode_id: EpisodeId, body: ReportBody) -> JSONResponse:
        def decode_all() -> tuple[list[Any], list[Any], Any]:
            # Up to MAX_REPORT_STEPS arrays: in a worker thread, off the event loop.
            obs = [decode(o, f"obs[{t}]") for t, o in enumerate(body.obs)]
            actions = [decode(a, f"actions[{t}]", action_space) for t, a in enumerate(body.actions)]
            final = None
            if body.final_obs is not None:
                final = check_value(obs_space, decode(body.final_obs, "final_obs"), "final_obs")
            return obs, actions, final

        obs, actions, final = await run_in_threadpool(decode_all)
        await run_in_threadpool(env.log_steps, episode_id, obs, actions, body.rewards)
        if final is not None:
            env.end_episode(episode_id, final, truncated=body.truncated)
        return JSONResponse({"ok": True})

    _install_error_handlers(app)
    return Guard(app, token, max_body_bytes), app


class ClientGone(Exception):
    """The client hung up before its answer was sent (the response goes nowhere)."""


async def _disconnected(request: Request) -> None:
    """Returns once the client has hung up (the body was read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _install_error_handlers(app: FastAPI) -> None:
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
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "bad_request")
        return error_response(exc.status_code, code, str(exc.detail))

    @app.exception_handler(errors.EpisodeNotFoundError)
    async def not_found(request: Request, exc: errors.EpisodeNotFoundError) -> JSONResponse:
        if exc.ended:
            return error_response(410, "episode_ended", str(exc))
        return error_response(404, "episode_not_found", str(exc))

    @app.exception_handler(errors.JaxRunnerError)
    async def jaxrunner_error(request: Request, exc: errors.JaxRunnerError) -> JSONResponse:
        for kind, status, code in _STATUS:
            if isinstance(exc, kind):
                return error_response(status, code, str(exc))
        logger.exception("unexpected jaxrunner error", exc_info=exc)
        return error_response(500, "internal", "internal server error")

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("internal error", exc_info=exc)
        return error_response(500, "internal", "internal server error")


__all__ = ["OPEN_PATHS", "Guard", "create_app", "error_response"]
