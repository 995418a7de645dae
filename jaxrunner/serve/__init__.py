"""Serving external environments over HTTP: ``jr.serve.PolicyServer`` and
``jr.serve.PolicyClient``, and ``jr.serve.MultiAgentPolicyClient`` for a
multi-agent env (extra ``[serve]``: FastAPI, uvicorn, httpx).

Imported lazily, so ``import jaxrunner`` never needs the extra.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "PolicyServer": "jaxrunner.serve.server",
    "ServerConfig": "jaxrunner.serve.server",
    "PolicyClient": "jaxrunner.serve.client",
    "MultiAgentPolicyClient": "jaxrunner.serve.multi_agent_client",
    "PolicyServerError": "jaxrunner.serve.client",
    "ReportError": "jaxrunner.serve.client",
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
