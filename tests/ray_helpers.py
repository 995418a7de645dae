"""Helpers for the tests that run envs in Ray actors."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest


def kill_actor(actor: Any, ping: str = "num_restarts") -> None:
    """Kills a Ray actor (an env actor; another with the name of a method to call,
    ``ping``) for good and returns once it is dead (``ray.kill`` is asynchronous: a call
    made right after it may still be answered)."""
    import ray

    ray.kill(actor, no_restart=True)
    with pytest.raises(ray.exceptions.RayActorError):
        for _ in range(100):
            ray.get(getattr(actor, ping).remote(), timeout=10)
            time.sleep(0.05)


def loads_jax(actor: Any) -> bool:
    """Whether a Ray env actor's process has imported JAX: it steps its sub-envs with
    numpy, and JAX would cost each actor ~0.6 s of CPU more to start."""
    import ray

    return ray.get(actor.__ray_call__.remote(lambda _: "jax" in sys.modules), timeout=60)
