"""The HTTP routes of a :class:`~jaxrunner._src.services.external.MultiAgentExternalEnv`: the
single-agent routes' twins, with ``{agent_id: value}`` objects and the same checks in the
same order (an unknown agent id: 422, before any decoding)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

import jaxrunner._src.services.external.checks as checks
from jaxrunner._src.services.external import MultiAgentExternalEnv
from jaxrunner._src.services.serve import wire
from jaxrunner._src.services.serve.schema import (
    ERRORS,
    AgentActionsOut,
    AgentEndBody,
    AgentLogActionBody,
    AgentObsBody,
    AgentReturnsBody,
    EpisodeId,
    Ok,
    raw,
)

Deliver = Callable[[int, Any, Request], Awaitable[Any]]
"""``deliver(episode_id, future, request)``: the future's result if it reaches the
client (see :func:`jaxrunner._src.services.serve.app.create_app`)."""


def agent_spaces_json(env: MultiAgentExternalEnv) -> dict[str, Any]:
    """``GET /v1/spaces`` of a multi-agent env: each agent's spaces and policy id."""
    return {
        "agents": {
            agent: {
                "observation_space": wire.space_to_json(group.observation_space),
                "action_space": wire.space_to_json(group.action_space),
                "policy_id": group.policy_id,
            }
            for group in env.groups
            for agent in group.agents
        }
    }


def add_multi_agent_routes(
    app: FastAPI,
    env: MultiAgentExternalEnv,
    bearer: Any,
    deliver: Deliver,
    episode_route: Callable[[str, type[BaseModel]], Callable[[Any], Any]],
) -> None:
    """Adds the routes of ``env`` to ``app``: ``bearer`` is the token dependency,
    ``episode_route(name, model)`` declares ``POST /v1/episodes/{episode_id}/<name>``
    (both from :func:`jaxrunner._src.services.serve.app.create_app`)."""
    group_of = {a: g for g in env.groups for a in g.agents}

    def decode(trees: dict[str, Any], call: str, name: str, *, actions: bool = False) -> Any:
        checks.check_agent_dict(trees, env.possible_agents, call, name, empty=True)
        return {
            agent: wire.decode_tree(
                group_of[agent].action_space if actions else group_of[agent].observation_space,
                raw(tree),
                f"{name}[{agent!r}]",
            )
            for agent, tree in trees.items()
        }

    @app.get("/v1/spaces", dependencies=[bearer], responses=ERRORS, tags=["meta"])
    async def get_spaces() -> JSONResponse:
        return JSONResponse(agent_spaces_json(env))

    @episode_route("action", AgentActionsOut)
    async def get_action(
        episode_id: EpisodeId, body: AgentObsBody, request: Request
    ) -> JSONResponse:
        future = env.submit_action(episode_id, decode(body.obs, "get_action", "obs"))
        actions = await deliver(episode_id, future, request)
        encoded = {a: wire.encode_tree(group_of[a].action_space, v) for a, v in actions.items()}
        return JSONResponse({"actions": encoded})

    @episode_route("log_action", Ok)
    async def log_action(
        episode_id: EpisodeId, body: AgentLogActionBody, request: Request
    ) -> JSONResponse:
        obs = decode(body.obs, "log_action", "obs")
        actions = decode(body.actions, "log_action", "actions", actions=True)
        await deliver(episode_id, env.submit_log_action(episode_id, obs, actions), request)
        return JSONResponse({"ok": True})

    @episode_route("returns", Ok)
    async def log_returns(episode_id: EpisodeId, body: AgentReturnsBody) -> JSONResponse:
        env.log_returns(episode_id, body.rewards)
        return JSONResponse({"ok": True})

    @episode_route("end_agents", Ok)
    async def end_agents(episode_id: EpisodeId, body: AgentEndBody) -> JSONResponse:
        obs = decode(body.obs, "end_agents", "obs")
        # Stacks the agents' episodes: in a worker thread, off the event loop.
        await run_in_threadpool(lambda: env.end_agents(episode_id, obs, truncated=body.truncated))
        return JSONResponse({"ok": True})

    @episode_route("end", Ok)
    async def end_episode(episode_id: EpisodeId, body: AgentEndBody) -> JSONResponse:
        obs = decode(body.obs, "end_episode", "obs")
        await run_in_threadpool(lambda: env.end_episode(episode_id, obs, truncated=body.truncated))
        return JSONResponse({"ok": True})
