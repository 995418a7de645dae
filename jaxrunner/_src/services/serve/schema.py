"""The request and response schema of the policy server (pydantic): strict types, no extra
fields, finite floats, bounded lists (422). Arrays travel as :class:`WireArray`, decoded
by :mod:`.wire`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field

from jaxrunner._src.services.external import MAX_EPISODE_ID
from jaxrunner._src.services.serve import wire

MAX_REPORT_STEPS = 4096
"""The most steps one report request may carry."""
MAX_AGENTS = 1024
"""The most agents one multi-agent request may name."""


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class WireArray(_Strict):
    """An array: little-endian bytes in base64, a dtype from the allowlist."""

    dtype: wire.DType
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
    actions: Tree = Field(alias="action")  # one name for both kinds in the routes


class ReturnsBody(_Strict):
    rewards: Reward = Field(alias="reward")
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


AgentTrees = Annotated[dict[str, Tree], Field(max_length=MAX_AGENTS)]
"""``{agent_id: tree}`` of a multi-agent env's calls."""


class AgentObsBody(_Strict):
    obs: AgentTrees


class AgentLogActionBody(_Strict):
    obs: AgentTrees
    actions: AgentTrees


class AgentReturnsBody(_Strict):
    rewards: Annotated[dict[str, Reward], Field(max_length=MAX_AGENTS)]
    info: dict[str, Any] | None = None


class AgentEndBody(_Strict):
    """Final observations of the agents that end (``end_agents``), or of every agent
    still in the episode (``end``)."""

    obs: AgentTrees
    truncated: bool = False


class AgentActionsOut(BaseModel):
    actions: dict[str, Tree]


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


ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorOut} for status in (401, 404, 409, 410, 413, 415, 422, 429, 503)
}
"""The error responses every route may give (for the OpenAPI schema)."""


def raw(tree: Any) -> Any:
    """A validated Tree back to plain JSON values."""
    if isinstance(tree, BaseModel):
        return tree.model_dump()
    return tree
