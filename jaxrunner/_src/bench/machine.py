"""What a benchmark figure depends on: the machine, its libraries and its load."""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import platform
from typing import Any

import jax
import numpy as np

from jaxrunner._src.cpu_dispatch import inline_cpu_dispatch


def machine_info() -> dict[str, Any]:
    """Hardware, library versions, this process's JAX CPU dispatch and the load
    averages (1, 5, 15 min)."""
    import flax
    import gymnasium

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": importlib.metadata.version("jaxlib"),
        "flax": flax.__version__,
        "gymnasium": gymnasium.__version__,
        "numpy": np.__version__,
        "jax_devices": [str(d) for d in jax.devices()],
        "jax_cpu_dispatch": "inline" if inline_cpu_dispatch() else "async",
        "loadavg": list(os.getloadavg()),
    }


def autogroup() -> str | None:
    """This session's scheduling group and its nice (Linux autogroup), which decide
    its share of the CPUs on a machine shared with other sessions."""
    try:
        return pathlib.Path("/proc/self/autogroup").read_text().strip()
    except OSError:
        return None
