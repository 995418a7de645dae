"""The HTTP API of a :class:`~jaxrunner.ExternalEnv`: a FastAPI app and its routes, which
check each request (guard, schema, wire decoding, space) before it touches any state."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI, Header, Query, Request, Security
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

import jaxrunner.errors as errors
from jaxrunner._src.services.external import ExternalEnv, MultiAgentExternalEnv
from jaxrunner._src.services.serve import wire
from jaxrunner._src.services.serve.error_handlers import ClientGone, install_error_handlers
from jaxrunner._src.services.serve.guard import Guard
from jaxrunner._src.services.serve.multi_agent_routes import add_multi_agent_routes
from jaxrunner._src.services.serve.schema import (
    ERRORS,
    ActionOut,
    EndBody,
    EpisodeCreated,
    EpisodeId,
    LogActionBody,
    ObsBody,
    Ok,
    ReportBody,
    ReturnsBody,
    StartEpisode,
    raw,
)
from jaxrunner._src.space_arrays import check_value


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
    FastAPI app inside it (for its OpenAPI schema). A multi-agent env gets the
    routes of :mod:`.multi_agent_routes` instead of the single-agent episode routes;
    both share the guard, the health, metrics and start routes and the delivery."""
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

    def episode_route(name: str, model: type[BaseModel] = Ok) -> Callable[[Any], Any]:
        """``POST /v1/episodes/{episode_id}/<name>``, answering ``model``."""
        return app.post(
            f"/v1/episodes/{{episode_id}}/{name}",
            dependencies=[bearer],
            responses={200: {"model": model}, **ERRORS},
            tags=["episodes"],
        )

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

    if env.multi_agent is True:  # the kind the env declares picks the episode routes
        add_multi_agent_routes(app, env, bearer, deliver, episode_route)
        install_error_handlers(app)
        return Guard(app, token, max_body_bytes), app
    obs_space, action_space = env.observation_space, env.action_space

    def decode(obj: Any, where: str, space: Any = obs_space) -> Any:
        return wire.decode_tree(space, raw(obj), where)

    @app.get("/v1/spaces", dependencies=[bearer], responses=ERRORS, tags=["meta"])
    async def get_spaces() -> JSONResponse:
        return JSONResponse(
            {
                "observation_space": wire.space_to_json(obs_space),
                "action_space": wire.space_to_json(action_space),
            }
        )

    @app.get("/v1/params", dependencies=[bearer], responses=ERRORS, tags=["params"])
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

    @episode_route("action", ActionOut)
    async def get_action(episode_id: EpisodeId, body: ObsBody, request: Request) -> JSONResponse:
        future = env.submit_action(episode_id, decode(body.obs, "obs"))
        action = await deliver(episode_id, future, request)
        return JSONResponse({"action": wire.encode_tree(action_space, action)})

    @episode_route("log_action")
    async def log_action(
        episode_id: EpisodeId, body: LogActionBody, request: Request
    ) -> JSONResponse:
        obs = decode(body.obs, "obs")
        action = decode(body.action, "action", action_space)
        await deliver(episode_id, env.submit_log_action(episode_id, obs, action), request)
        return JSONResponse({"ok": True})

    @episode_route("returns")
    async def log_returns(episode_id: EpisodeId, body: ReturnsBody) -> JSONResponse:
        env.log_returns(episode_id, body.reward, body.info)
        return JSONResponse({"ok": True})

    @episode_route("end")
    async def end_episode(episode_id: EpisodeId, body: EndBody) -> JSONResponse:
        def end() -> None:  # stacks the whole episode: in a worker thread, off the loop
            env.end_episode(episode_id, decode(body.obs, "obs"), truncated=body.truncated)

        await run_in_threadpool(end)
        return JSONResponse({"ok": True})

    @episode_route("report")
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
            await run_in_threadpool(env.end_episode, episode_id, final, truncated=body.truncated)
        return JSONResponse({"ok": True})

    install_error_handlers(app)
    return Guard(app, token, max_body_bytes), app


async def _disconnected(request: Request) -> None:
    """Returns once the client has hung up (the body was read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
