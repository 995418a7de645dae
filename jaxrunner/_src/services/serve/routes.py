"""The HTTP API of an external env: a FastAPI app (error answers, guard) whose routes serve
both kinds of env, the env's wire (:class:`OneAgent`, :class:`Agents`) reading the bodies;
each request is checked (guard, schema, wire decoding, space) before it touches any state."""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations, and
# their dependencies are the env's wire, chosen when the routes are made.
import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request, Security
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

import jaxrunner._src.services.external.checks as checks
import jaxrunner.errors as errors
from jaxrunner._src.services.external import ExternalEnv, MultiAgentExternalEnv
from jaxrunner._src.services.serve import wire
from jaxrunner._src.services.serve.error_handlers import ClientGone, install_error_handlers
from jaxrunner._src.services.serve.guard import Guard
from jaxrunner._src.services.serve.schema import (
    ERRORS,
    ActionOut,
    AgentActionsOut,
    AgentEndBody,
    AgentLogActionBody,
    AgentObsBody,
    AgentReturnsBody,
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

Reader = Callable[..., Awaitable[Any]]
"""A dependency that reads a request's body into the env's arguments."""
OFF_LOOP_AGENTS = 8
"""Calls naming more agents are decoded, checked and answered in a worker thread (a
1,024-agent body takes tens of ms: it would stall every connection's answers)."""


async def off_loop(heavy: bool, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``: in a worker thread if ``heavy``, else here on the event loop."""
    return await run_in_threadpool(fn, *args) if heavy else fn(*args)


def with_body(read: Reader, model: type[BaseModel]) -> Reader:
    """``read`` with its ``body`` annotated ``model``, the kind's body model: FastAPI
    reads the request body from the annotation."""
    read.__annotations__["body"] = model
    return read


class OneAgent:
    """The wire of an :class:`~jaxrunner.ExternalEnv`: each value one tree."""

    obs_body, logged_body, returns_body, end_body = ObsBody, LogActionBody, ReturnsBody, EndBody
    action_out = ActionOut

    def __init__(self, env: ExternalEnv) -> None:
        self.env = env

    @staticmethod
    def heavy(value: Any) -> bool:
        return False  # one agent's value: never worth a thread hop

    def params(self, policy_id: str | None) -> tuple[Any, int]:
        if policy_id is not None:
            raise errors.InvalidArgumentError(
                f"GET /v1/params?policy_id={policy_id!r}: the env has one policy; leave "
                "policy_id out."
            )
        return self.env.get_params()

    def spaces(self) -> dict[str, Any]:
        return {name: wire.space_to_json(space) for name, space in self.env.get_spaces().items()}

    def decode(self, tree: Any, call: str, *, actions: bool = False) -> Any:
        if actions:
            return wire.decode_tree(self.env.action_space, raw(tree), "action")
        return wire.decode_tree(self.env.observation_space, raw(tree), "obs")

    def answer(self, action: Any) -> dict[str, Any]:
        return {"action": wire.encode_tree(self.env.action_space, action)}


class Agents:
    """The wire of a ``MultiAgentExternalEnv``: ``{agent_id: tree}`` objects, the agent
    ids checked before any decoding (an unknown one: 422)."""

    obs_body, logged_body, returns_body = AgentObsBody, AgentLogActionBody, AgentReturnsBody
    end_body, action_out = AgentEndBody, AgentActionsOut

    def __init__(self, env: MultiAgentExternalEnv) -> None:
        self.group_of = {a: g for g in env.groups for a in g.agents}
        self.env = env

    @staticmethod
    def heavy(values: Any) -> bool:
        return len(values) > OFF_LOOP_AGENTS

    def params(self, policy_id: str | None) -> tuple[Any, int]:
        if policy_id is None and len(self.env.policy_ids) > 1:  # one: it (as get_params)
            raise errors.InvalidArgumentError(
                "GET /v1/params: which policy's? Pass ?policy_id=<id>; the env's policies "
                f"are {list(self.env.policy_ids)}."
            )
        return self.env.get_params(policy_id)

    def spaces(self) -> dict[str, Any]:
        return {
            "agents": {
                agent: {
                    "observation_space": wire.space_to_json(group.observation_space),
                    "action_space": wire.space_to_json(group.action_space),
                    "policy_id": group.policy_id,
                }
                for agent, group in self.group_of.items()
            }
        }

    def decode(self, trees: Any, call: str, *, actions: bool = False) -> Any:
        name = "actions" if actions else "obs"
        checks.check_agent_dict(trees, self.env.possible_agents, call, name, empty=True)
        return {
            agent: wire.decode_tree(
                self.group_of[agent].action_space
                if actions
                else self.group_of[agent].observation_space,
                raw(tree),
                f"{name}[{agent!r}]",
            )
            for agent, tree in trees.items()
        }

    def answer(self, actions: dict[str, Any]) -> dict[str, Any]:
        group_of = self.group_of
        encoded = {a: wire.encode_tree(group_of[a].action_space, v) for a, v in actions.items()}
        return {"actions": encoded}


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
    FastAPI app inside it (for its OpenAPI schema), with its routes. The multi-agent wire
    adds ``end_agents``; the single-agent one local inference's ``report``."""
    app = FastAPI(
        title="jaxrunner policy server",
        version="1",
        description="Agents that run elsewhere call in for actions and report experience. "
        "Arrays are JSON objects {dtype, shape, data(base64, little-endian)}.",
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(app)
    served = Guard(app, token, max_body_bytes), app
    bearer = Security(HTTPBearer(auto_error=False, description="the server's token"))
    timeout_s = env.config.action_timeout_s
    kind = Agents(env) if env.multi_agent is True else OneAgent(env)
    params_cache: dict[str | None, tuple[int, Any]] = {}

    # The readers of the bodies (FastAPI dependencies): each checked, decoded (off the
    # event loop if heavy) and handed to the route as the env's arguments.
    async def read_obs(body: Any) -> Any:
        return await off_loop(kind.heavy(body.obs), kind.decode, body.obs, "get_action")

    def read_final_obs(call: str) -> Reader:
        async def read(body: Any) -> tuple[Any, bool]:
            return await off_loop(kind.heavy(body.obs), kind.decode, body.obs, call), body.truncated

        return with_body(read, kind.end_body)

    def decode_logged(body: Any) -> tuple[Any, Any]:
        obs = kind.decode(body.obs, "log_action")
        return obs, kind.decode(body.actions, "log_action", actions=True)

    async def read_logged(body: Any) -> tuple[Any, Any]:
        return await off_loop(kind.heavy(body.obs), decode_logged, body)

    async def read_rewards(body: Any) -> tuple[Any, ...]:
        return body.rewards, body.info

    with_body(read_obs, kind.obs_body)
    with_body(read_logged, kind.logged_body)
    with_body(read_rewards, kind.returns_body)

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
            Header(pattern=wire.CLIENT_ID_PATTERN, description="caps are per client"),
        ] = None,
    ) -> JSONResponse:
        peer = request.client.host if request.client else "unknown"
        client = x_client_id or f"peer:{peer}"
        episode_id = env.start_episode(body.episode_id, body.training_enabled, client=client)
        return JSONResponse({"episode_id": episode_id}, status_code=201)

    def episode_route(name: str, model: type[BaseModel], call: str | None = None) -> Any:
        return app.post(
            f"/v1/episodes/{{episode_id}}/{name}",
            dependencies=[bearer],
            responses={200: {"model": model}, **ERRORS},
            tags=["episodes"],
            name=call,  # the handler's name in the schema (None: its function's)
        )

    def end_route(name: str, call: str, end: Callable[..., None]) -> None:
        """The route of ``end`` (the env's ``end_episode`` or ``end_agents``)."""

        @episode_route(name, Ok, call)
        async def end_call(
            episode_id: EpisodeId,
            final: Annotated[tuple[Any, bool], Depends(read_final_obs(call))],
        ) -> JSONResponse:
            obs, truncated = final
            # Stacks episodes: in a worker thread, off the event loop.
            await run_in_threadpool(lambda: end(episode_id, obs, truncated=truncated))
            return JSONResponse({"ok": True})

    @app.get("/v1/spaces", dependencies=[bearer], responses=ERRORS, tags=["meta"])
    async def get_spaces() -> JSONResponse:
        return JSONResponse(kind.spaces())

    @app.get("/v1/params", dependencies=[bearer], responses=ERRORS, tags=["params"])
    async def get_params(
        since: Annotated[int | None, Query(ge=0, description="skip params if unchanged")] = None,
        policy_id: Annotated[str | None, Query(description="multi-agent: whose params")] = None,
    ) -> JSONResponse:
        params, version = kind.params(policy_id)
        if since == version:
            return JSONResponse({"version": version, "params": None})
        cached = params_cache.get(policy_id)
        if cached is None or cached[0] != version:
            cached = version, await run_in_threadpool(wire.encode_params, params)
            params_cache[policy_id] = cached
        return JSONResponse({"version": version, "params": cached[1]})

    @episode_route("action", kind.action_out)
    async def get_action(
        episode_id: EpisodeId,
        obs: Annotated[Any, Depends(read_obs)],
        request: Request,
    ) -> JSONResponse:
        future = await off_loop(kind.heavy(obs), env.submit_action, episode_id, obs)
        action = await deliver(episode_id, future, request)
        return JSONResponse(await off_loop(kind.heavy(obs), kind.answer, action))

    @episode_route("log_action", Ok)
    async def log_action(
        episode_id: EpisodeId,
        logged: Annotated[tuple[Any, Any], Depends(read_logged)],
        request: Request,
    ) -> JSONResponse:
        future = await off_loop(kind.heavy(logged[0]), env.submit_log_action, episode_id, *logged)
        await deliver(episode_id, future, request)
        return JSONResponse({"ok": True})

    @episode_route("returns", Ok)
    async def log_returns(
        episode_id: EpisodeId, rewards: Annotated[tuple[Any, ...], Depends(read_rewards)]
    ) -> JSONResponse:
        env.log_returns(episode_id, *rewards)
        return JSONResponse({"ok": True})

    end_route("end", "end_episode", env.end_episode)
    if env.multi_agent is True:
        end_route("end_agents", "end_agents", env.end_agents)

        # Not in the schema: a clear refusal instead of a bare 404 for a client that tries.
        @app.post("/v1/episodes/{episode_id}/report", include_in_schema=False)
        async def no_report(episode_id: EpisodeId) -> JSONResponse:
            raise HTTPException(
                501,
                f"POST /v1/episodes/{episode_id}/report: reporting locally computed steps "
                "(inference='local') serves single-agent envs only; a multi-agent client asks "
                "the server for each action (MultiAgentPolicyClient), or logs actions chosen "
                "elsewhere with log_action.",
            )

        return served
    # What a single-agent client that computes its actions itself (inference="local") sends.
    obs_space, action_space = env.observation_space, env.action_space

    def decode(obj: Any, where: str, space: Any = obs_space) -> Any:
        return wire.decode_tree(space, raw(obj), where)

    @episode_route("report", Ok)
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

    return served


async def _disconnected(request: Request) -> None:
    """Returns once the client has hung up (the body was read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
