"""Serving external environments over HTTP: ``jr.serve.PolicyServer``, ``PolicyClient`` and
``MultiAgentPolicyClient`` (extra ``[serve]``: FastAPI, uvicorn, httpx; imported lazily, so
``import jaxrunner`` never needs it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jaxrunner._src.services.serve.client import MultiAgentPolicyClient, PolicyClient
    from jaxrunner._src.services.serve.client_http import PolicyServerError, ReportError
    from jaxrunner._src.services.serve.config import ServerConfig
    from jaxrunner._src.services.serve.server import PolicyServer

_EXPORTS = {
    "PolicyServer": "jaxrunner._src.services.serve.server",
    "ServerConfig": "jaxrunner._src.services.serve.config",
    "PolicyClient": "jaxrunner._src.services.serve.client",
    "MultiAgentPolicyClient": "jaxrunner._src.services.serve.client",
    "PolicyServerError": "jaxrunner._src.services.serve.client_http",
    "ReportError": "jaxrunner._src.services.serve.client_http",
}

__all__ = [
    "MultiAgentPolicyClient",
    "PolicyClient",
    "PolicyServer",
    "PolicyServerError",
    "ReportError",
    "ServerConfig",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'jaxrunner.serve' has no attribute {name!r}")
    import importlib

    try:
        module = importlib.import_module(_EXPORTS[name])
    except ImportError as err:
        raise ImportError(
            f"jaxrunner.serve.{name} needs the serve extra: pip install 'jaxrunner[serve]' ({err})"
        ) from err
    return getattr(module, name)
