"""What the fork server imports once for the workers forked from it: the main script's
top-level imports. A worker runs the script again (Python before 3.14 never preloads
``__main__`` in the fork server: python/cpython#126631), and then finds them loaded."""

from __future__ import annotations

import ast
import contextlib
import importlib
import os
import sys

PRELOAD_MODULE = __name__
SCRIPT_IMPORTS = "JAXRUNNER_SCRIPT_IMPORTS"
"""The environment variable that hands the main script's imports to the fork server."""


def script_imports() -> list[str]:
    """The modules the main script imports at its top level (none outside a script)."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if path is None or not os.path.isfile(path):
        return []
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return [name for name in dict.fromkeys(names) if name != "__future__"]


def _import_quietly(names: str) -> None:
    for name in filter(None, names.split(",")):
        # One that fails here is imported by each worker, as without the preload.
        with contextlib.suppress(Exception):
            importlib.import_module(name)


_import_quietly(os.environ.get(SCRIPT_IMPORTS, ""))
