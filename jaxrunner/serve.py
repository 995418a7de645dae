"""Serving external environments over HTTP: ``jr.serve.PolicyServer``, ``PolicyClient`` and
``MultiAgentPolicyClient`` (extra ``[serve]``: FastAPI, uvicorn, httpx; imported lazily, so
``import jaxrunner`` never needs it)."""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "PolicyServer": "jaxrunner._src.services.serve.server",
    "ServerConfig": "jaxrunner._src.services.serve.config",
    "PolicyClient": "jaxrunner._src.services.serve.client",
    "MultiAgentPolicyClient": "jaxrunner._src.services.serve.client",
    "PolicyServerError": "jaxrunner._src.services.serve.client_http",
    "ReportError": "jaxrunner._src.services.serve.client_http",
}

__all__ = sorted(_EXPORTS)


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
