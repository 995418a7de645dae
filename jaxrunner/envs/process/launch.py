"""How ``backend="process"`` lays out and starts its workers: the checks of the
constructor's arguments, the split of sub-envs over workers, the factories' pickling
and the multiprocessing context (never a plain ``fork``)."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import pickle
import sys
from collections.abc import Callable, Sequence

import gymnasium
import numpy as np

from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError

EnvFactory = Callable[[], gymnasium.Env]
START_METHODS = ("forkserver", "spawn")
DEFAULT_STEP_TIMEOUT_S = 300.0
WORKER_MODULE = "jaxrunner.envs.process.worker"
"""What the fork server imports once: the worker side only (numpy, gymnasium,
jaxrunner; no JAX backend, so no JAX thread to fork)."""


def default_num_workers(num_envs: int) -> int:
    """One worker per CPU this process may run on but one, which the main process
    needs for the policy (on 2 cores, 1 worker did as well as 2: see
    ``benchmarks/results/process_cpu_priority*.json``); at least one, at most one per
    sub-env."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(num_envs, cpus - 1))


def worker_bounds(
    num_envs: int, envs_per_worker: int | None, num_workers: int | None
) -> list[tuple[int, int]]:
    """The ``[lo, hi)`` sub-env range of each worker."""
    for name, value in (("envs_per_worker", envs_per_worker), ("num_workers", num_workers)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1
        ):
            raise InvalidArgumentError(
                f"ProcessVectorEnv({name}={value!r}): expected an int >= 1 (or None for a "
                "default from the CPU count)."
            )
    if envs_per_worker is not None and num_workers is not None:
        raise InvalidArgumentError(
            f"ProcessVectorEnv(envs_per_worker={envs_per_worker}, num_workers={num_workers}): "
            "give one of them; the other follows from num_envs."
        )
    if envs_per_worker is not None:
        k = int(envs_per_worker)
        return [(lo, min(lo + k, num_envs)) for lo in range(0, num_envs, k)]
    if num_workers is not None and num_workers > num_envs:
        raise InvalidArgumentError(
            f"ProcessVectorEnv(num_workers={num_workers}): more workers than sub-envs "
            f"({num_envs}); every worker needs at least one sub-env."
        )
    count = default_num_workers(num_envs) if num_workers is None else int(num_workers)
    # The runner splits its pipelining groups the same way, so groups fall on workers.
    edges = np.linspace(0, num_envs, count + 1).round().astype(int).tolist()
    return list(itertools.pairwise(edges))


def pickle_factories(env_fns: Sequence[EnvFactory], offset: int) -> bytes:
    """The factories as bytes for a worker: ``pickle``, else ``cloudpickle`` (lambdas,
    closures) when it is installed, else a clear error naming the factory."""
    try:
        return pickle.dumps(list(env_fns), protocol=5)
    except Exception as err:
        first_error: Exception = err
    try:
        import cloudpickle
    except ImportError:
        cloudpickle = None
    if cloudpickle is not None:
        try:
            return cloudpickle.dumps(list(env_fns), protocol=5)
        except Exception as err:
            first_error = err
    for j, fn in enumerate(env_fns):
        try:
            (cloudpickle or pickle).dumps(fn)
        except Exception as err:
            first_error, bad = err, offset + j
            break
    else:  # pragma: no cover - the list failed but no element did
        bad = offset
    hint = "" if cloudpickle else " or install cloudpickle (pip install cloudpickle)"
    raise InvalidArgumentTypeError(
        f"backend='process': the factory of sub-env {bad} cannot be sent to a worker "
        f"process ({first_error!r}). Use a module-level function or a functools.partial "
        f"of one{hint}; for gymnasium ids pass the id string to make_vec."
    ) from first_error


def multiprocessing_context(start_method: str) -> multiprocessing.context.BaseContext:
    """The context workers start in; with ``"forkserver"``, one that preloads the
    worker module."""
    if sys.platform == "win32":
        raise InvalidArgumentError(
            "backend='process' needs a Unix-like OS (it passes file descriptors between "
            "processes); use backend='sync' on Windows."
        )
    if start_method not in START_METHODS:
        raise InvalidArgumentError(
            f"ProcessVectorEnv(start_method={start_method!r}): expected one of "
            f"{START_METHODS}. 'fork' is refused: forking a process that has started JAX's "
            "threads can deadlock the child."
        )
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        from multiprocessing import forkserver

        # The fork server imports the worker module once (numpy, gymnasium, jaxrunner:
        # no JAX backend, so no JAX thread), and each worker forks from it in
        # milliseconds. Takes effect when this process starts its fork server.
        preload = list(getattr(forkserver._forkserver, "_preload_modules", ["__main__"]))
        if WORKER_MODULE not in preload:
            ctx.set_forkserver_preload([*preload, WORKER_MODULE])
    return ctx


def check_step_timeout(value: float | None) -> float | None:
    """``step_timeout_s`` as a float (or None: no deadline); refuses anything else."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidArgumentError(
            f"ProcessVectorEnv(step_timeout_s={value!r}): expected a number of seconds > 0, "
            "or None to wait for the workers forever."
        )
    return float(value)
