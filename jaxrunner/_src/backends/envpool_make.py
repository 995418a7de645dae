"""``make_vec(..., backend="envpool")``: EnvPool's sync mode, its async mode, or sync pools
stepped in turn, by the arguments (docs/backends/envpool.md)."""

from __future__ import annotations

from typing import Any

from jaxrunner._src.arg_checks import check_bool, check_int
from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.envpool import EnvPoolVectorEnv
from jaxrunner._src.backends.envpool_async import EnvPoolAsyncVectorEnv
from jaxrunner._src.backends.envpool_pools import EnvPoolPoolsVectorEnv
from jaxrunner.errors import InvalidArgumentError


def make_envpool_vec(
    task_id: str,
    num_envs: int,
    batch_size: int | None = None,
    num_pools: int = 1,
    **kwargs: Any,
) -> VectorEnv:
    """``make_vec(task_id, num_envs, backend="envpool", **kwargs)``: sync mode, or with
    ``batch_size < num_envs`` EnvPool's async mode
    (:class:`~jaxrunner._src.backends.envpool_async.EnvPoolAsyncVectorEnv`), which the runner
    samples ready-first; with ``num_pools > 1``, that many sync pools stepped in turn
    (:class:`~jaxrunner._src.backends.envpool_pools.EnvPoolPoolsVectorEnv`)."""
    where = "make_vec"
    check_int(where, "batch_size", batch_size, none="for sync mode")
    check_int(where, "num_pools", num_pools, hint="1: one pool")
    check_bool(where, "keep_reset_steps", kwargs.get("keep_reset_steps", True))
    # EnvPool's C++ aborts the whole process on a negative thread count.
    check_int(where, "num_threads", kwargs.get("num_threads", 0), low=0, hint="0: EnvPool's own")
    if batch_size is not None and batch_size != num_envs:  # async mode
        if num_pools > 1:
            raise InvalidArgumentError(
                f"make_vec(backend='envpool', batch_size={batch_size}, num_pools={num_pools}): "
                "pools step in sync mode; pass batch_size (async mode) or num_pools, not both."
            )
        return EnvPoolAsyncVectorEnv(task_id, num_envs, batch_size, **kwargs)
    if num_pools > 1:
        return EnvPoolPoolsVectorEnv(task_id, num_envs, num_pools, **kwargs)
    return EnvPoolVectorEnv(task_id, num_envs, **kwargs)
