"""The HTTP API of an external env: a FastAPI app with its routes (:mod:`.routes`), error
answers and guard; each request is checked (guard, schema, wire decoding, space) first."""

from __future__ import annotations

from fastapi import FastAPI, Security
from fastapi.security import HTTPBearer

from jaxrunner._src.services.external import ExternalEnv, MultiAgentExternalEnv
from jaxrunner._src.services.serve.error_handlers import install_error_handlers
from jaxrunner._src.services.serve.guard import Guard
from jaxrunner._src.services.serve.routes import add_routes


def create_app(
    env: ExternalEnv | MultiAgentExternalEnv, token: str | None, max_body_bytes: int
) -> tuple[Guard, FastAPI]:
    """The ASGI app serving ``env``: the :class:`Guard`-wrapped app to run, and the
    FastAPI app inside it (for its OpenAPI schema), with the routes of :mod:`.routes`."""
    app = FastAPI(
        title="jaxrunner policy server",
        version="1",
        description="Agents that run elsewhere call in for actions and report experience. "
        "Arrays are JSON objects {dtype, shape, data(base64, little-endian)}.",
        docs_url=None,
        redoc_url=None,
    )
    bearer = Security(HTTPBearer(auto_error=False, description="the server's token"))
    add_routes(app, env, bearer)
    install_error_handlers(app)
    return Guard(app, token, max_body_bytes), app
