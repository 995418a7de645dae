"""The HTTP API of an external env: a FastAPI app, its guard and delivery, and the routes
every env has; each request is checked (guard, schema, wire decoding, space) first."""

from __future__ import annotations

import asyncio
import math
from typing import Annotated, Any

from fastapi import FastAPI, Header, Request, Security
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer

import jaxrunner.errors as errors
from jaxrunner._src.services.external import ExternalEnv, MultiAgentExternalEnv
from jaxrunner._src.services.serve.error_handlers import ClientGone, install_error_handlers
from jaxrunner._src.services.serve.guard import Guard
from jaxrunner._src.services.serve.routes import add_routes
from jaxrunner._src.services.serve.schema import ERRORS, EpisodeCreated, StartEpisode


def _finite(value: Any) -> Any:
    """Metrics as strict JSON: NaN (no episode yet) becomes null."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def create_app(
    env: ExternalEnv | MultiAgentExternalEnv, token: str | None, max_body_bytes: int
) -> tuple[Guard, FastAPI]:
    """The ASGI app serving ``env``: the :class:`Guard`-wrapped app to run, and the
    FastAPI app inside it (for its OpenAPI schema). The health, metrics and start
    routes are here, the episode routes (one set for both kinds) in :mod:`.routes`."""
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

    @app.get("/v1/health", tags=["meta"])
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/metrics", dependencies=[bearer], responses=ERRORS, tags=["meta"])
    async def get_metrics() -> JSONResponse:
        return JSONResponse(_finite(env.get_metrics()))

    @app.post(
        "/v1/episodes",
        status_code=201,
        dependencies=[bearer],
        responses={201: {"model": EpisodeCreated}, **ERRORS},
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

    add_routes(app, env, bearer, deliver)
    install_error_handlers(app)
    return Guard(app, token, max_body_bytes), app


async def _disconnected(request: Request) -> None:
    """Returns once the client has hung up (the body was read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
