"""How ``backend="process"`` lays out and starts its workers: argument checks, the split of
sub-envs over workers, the factories' pickling (by value from ``__main__``), the check
that a script guards its top-level code, and the start method (never a plain ``fork``)."""

from __future__ import annotations

import ast
import functools
import itertools
import math
import multiprocessing
import os
import sys
from collections.abc import Sequence
from multiprocessing.context import BaseContext
from typing import Literal

import cloudpickle
import numpy as np

from jaxrunner._src.backends.process.preload import PRELOAD_MODULE, SCRIPT_IMPORTS
from jaxrunner._src.backends.sub_env_block import EnvFactory
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError

START_METHODS = ("forkserver", "spawn")
DEFAULT_STEP_TIMEOUT_S = 300.0
WORKER_MODULE = "jaxrunner._src.backends.process.worker"
"""What the fork server imports once: the worker side only (numpy, gymnasium,
jaxrunner; no JAX backend, so no JAX thread to fork)."""


ALL_CPUS_FROM_ENVS = 256
"""From this many sub-envs the pipelined backend's workers take every CPU, the main
process's too: their stepping then outweighs its policy (``docs/performance.md``,
process layouts)."""


def available_cpus() -> int:
    """The CPUs this process may use: those it may run on, bounded by its cgroup's CPU
    quota where one is set (a container given 2 CPUs of a 64-core host has 2)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, min(cpus, math.ceil(quota))) if quota is not None else cpus


def cgroup_cpu_quota(
    root: str = "/sys/fs/cgroup", self_cgroup: str = "/proc/self/cgroup"
) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (v2's ``cpu.max``, v1's
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, at ``root`` and in its own cgroup; the
    smallest found wins), or None where there is none or it cannot be read."""
    quotas = []
    for directory in _cgroup_dirs(root, self_cgroup):
        quotas.append(_read_quota(os.path.join(directory, "cpu.max"), None))
        quotas.append(
            _read_quota(
                os.path.join(directory, "cpu.cfs_quota_us"),
                os.path.join(directory, "cpu.cfs_period_us"),
            )
        )
    found = [q for q in quotas if q is not None]
    return min(found) if found else None


def _cgroup_dirs(root: str, self_cgroup: str) -> list[str]:
    """Where the CPU controller's files may be: v2's root and this process's own
    cgroup; v1's ``cpu`` controller directories, with this process's path in them."""
    paths = {"": "", "cpu": ""}  # hierarchy -> this process's path in it
    try:
        with open(self_cgroup) as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "":
                    paths[""] = path
                elif "cpu" in controllers.split(","):
                    paths["cpu"] = path
    except (OSError, ValueError):
        pass
    dirs = [root, os.path.join(root, paths[""].lstrip("/"))]
    for v1 in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        dirs += [os.path.join(root, v1), os.path.join(root, v1, paths["cpu"].lstrip("/"))]
    return list(dict.fromkeys(os.path.normpath(d) for d in dirs))


def _read_quota(quota_file: str, period_file: str | None) -> float | None:
    """A quota in CPUs: v2's ``cpu.max`` (``period_file`` None), or v1's two files."""
    try:
        with open(quota_file) as f:
            fields = f.read().split()
        if period_file is None:
            quota, period = fields[:2]
        else:
            with open(period_file) as f:
                quota, period = fields[0], f.read().split()[0]
        if quota in ("max", "-1"):
            return None
        return int(quota) / int(period) if int(quota) > 0 and int(period) > 0 else None
    except (OSError, ValueError, IndexError):
        return None


def default_num_workers(
    num_envs: int,
    *,
    main_process: Literal["computes", "steps", "waits"] = "computes",
    cpus: int | None = None,
) -> int:
    """One worker per CPU (``cpus``, default :func:`available_cpus`), at least one, at
    most one per sub-env; one CPU is left to the main process where it works while the
    workers step: ``"computes"`` (the policy) below :data:`ALL_CPUS_FROM_ENVS` sub-envs,
    ``"steps"`` (a share of sub-envs) always, ``"waits"`` (lockstep multi-agent) never."""
    cpus = available_cpus() if cpus is None else cpus
    keep = main_process == "steps" or (main_process == "computes" and num_envs < ALL_CPUS_FROM_ENVS)
    return max(1, min(num_envs, cpus - 1 if keep else cpus))


def worker_bounds(
    num_envs: int, envs_per_worker: int | None, num_workers: int | None
) -> list[tuple[int, int]]:
    """The ``[lo, hi)`` sub-env range of each worker (the counts come from a
    ``ProcessConfig``, which checked them)."""
    if envs_per_worker is not None:
        k = int(envs_per_worker)
        return [(lo, min(lo + k, num_envs)) for lo in range(0, num_envs, k)]
    if num_workers is not None and num_workers > num_envs:
        raise InvalidArgumentError(
            f"ProcessVectorEnv(num_workers={num_workers}): more workers than sub-envs "
            f"({num_envs}); every worker needs at least one sub-env."
        )
    count = default_num_workers(num_envs) if num_workers is None else int(num_workers)
    # The runner splits its pipelining splits the same way, so splits fall on workers.
    edges = np.linspace(0, num_envs, count + 1).round().astype(int).tolist()
    return list(itertools.pairwise(edges))


def pickle_factories(env_fns: Sequence[EnvFactory], offset: int) -> bytes:
    """The factories as bytes for a worker, by ``cloudpickle`` (anything defined in
    ``__main__`` travels by value); one that cannot be sent raises an error naming it."""
    try:
        return cloudpickle.dumps(list(env_fns), protocol=5)
    except Exception as err:
        first_error: Exception = err
    for j, fn in enumerate(env_fns):
        try:
            cloudpickle.dumps(fn)
        except Exception as err:
            first_error, bad = err, offset + j
            break
    else:  # pragma: no cover - the list failed but no element did
        bad = offset
    raise InvalidArgumentTypeError(
        f"backend='process': the factory of sub-env {bad} cannot be sent to a worker "
        f"process ({first_error!r}). Make it a function (or class) that holds nothing "
        "process-bound (open files, locks, sockets); for gymnasium ids pass the id string "
        "to make_vec."
    ) from first_error


def check_main_guard(chosen_by: str | None = None) -> None:
    """Refuses to start workers from a script's unguarded top-level code, which each
    worker would run again as it imports the script (and then die unexplained).
    ``chosen_by``: what chose the process backend (``backend="auto"``), for the error."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None or not os.path.isfile(path):
        return  # a notebook, ``python -c``, stdin: nothing is re-imported
    frame = sys._getframe(1)
    while frame is not None and not (
        frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"
    ):
        frame = frame.f_back
    if frame is None:
        return  # not called from the script's top-level code
    line = frame.f_lineno
    if any(lo <= line <= hi for lo, hi in _main_guard_lines(path)):
        return
    guard = '`if __name__ == "__main__":`'
    started, other_way = "backend='process' was started", ""
    if chosen_by is not None:  # the caller did not name the process backend
        started = f"{chosen_by}, started"
        other_way = (
            ', or pass backend="sync" to keep the sub-envs in this process (the choice is '
            "measured: the same script may choose sync on another run or machine)"
        )
    raise InvalidArgumentError(
        f"{started} from the top level of {path} (line {line}), outside an {guard} block. "
        "Its workers import that script and would run this code again. Put the code that "
        f"builds and runs the envs under {guard} (e.g. in a main() called from there)"
        f"{other_way}."
    )


@functools.lru_cache(maxsize=2)
def _parse(path: str) -> ast.Module | None:
    """The script at ``path`` parsed (None: unreadable), once per process: each process
    backend reads its imports, and its guard where it starts from top-level code."""
    try:
        with open(path, encoding="utf-8") as f:
            return ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None


def script_imports() -> list[str]:
    """The modules the main script imports at its top level (none outside a script)."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    tree = _parse(path) if path is not None and os.path.isfile(path) else None
    names: list[str] = []
    for node in [] if tree is None else tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return [name for name in dict.fromkeys(names) if name != "__future__"]


def _main_guard_lines(path: str) -> list[tuple[int, int]]:
    """The line ranges of the top-level ``if __name__ == "__main__":`` blocks."""
    tree = _parse(path)
    if tree is None:
        return [(1, sys.maxsize)]  # cannot tell: let it start
    ranges = []
    for node in tree.body:
        if isinstance(node, ast.If) and _is_main_test(node.test):
            ranges.append((node.lineno, node.end_lineno or node.lineno))
    return ranges


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either order)."""
    if not isinstance(test, ast.Compare) or [type(op) for op in test.ops] != [ast.Eq]:
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    constants = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and constants == ["__main__"]


def multiprocessing_context(start_method: str) -> BaseContext:
    """The context workers start in (``start_method`` checked by ``ProcessConfig``); with
    ``"forkserver"``, one that preloads the worker module."""
    if sys.platform == "win32":
        raise InvalidArgumentError(
            "backend='process' needs a Unix-like OS (it passes file descriptors between "
            "processes); use backend='sync' on Windows."
        )
    check_main_guard()
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        from multiprocessing import forkserver

        # The fork server imports the worker module, JAX (no backend, so no thread) and
        # the main script's top-level imports once; each worker forks from it in
        # milliseconds. Takes effect as this process starts its fork server.
        preload = list(getattr(forkserver._forkserver, "_preload_modules", ["__main__"]))
        missing = [m for m in (WORKER_MODULE, "jax", PRELOAD_MODULE) if m not in preload]
        if missing:
            ctx.set_forkserver_preload([*preload, *missing])
        saved = os.environ.get(SCRIPT_IMPORTS)
        os.environ[SCRIPT_IMPORTS] = ",".join(script_imports())
        try:
            forkserver.ensure_running()
        finally:
            if saved is None:
                del os.environ[SCRIPT_IMPORTS]
            else:
                os.environ[SCRIPT_IMPORTS] = saved
    return ctx
