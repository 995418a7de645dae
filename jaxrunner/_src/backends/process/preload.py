"""What the fork server imports once for the workers forked from it: the main script's
top-level imports, handed over in :data:`SCRIPT_IMPORTS` (``launch.script_imports``). A
worker runs the script again (Python before 3.14 never preloads ``__main__`` in the fork
server: python/cpython#126631), and then finds them loaded."""

from __future__ import annotations

import contextlib
import importlib
import os

PRELOAD_MODULE = __name__
SCRIPT_IMPORTS = "JAXRUNNER_SCRIPT_IMPORTS"
"""The environment variable that hands the main script's imports to the fork server."""

for _name in filter(None, os.environ.get(SCRIPT_IMPORTS, "").split(",")):
    # One that fails here is imported by each worker, as without the preload.
    with contextlib.suppress(Exception):
        importlib.import_module(_name)
