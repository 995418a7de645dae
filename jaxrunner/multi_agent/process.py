"""``backend="process"`` for multi-agent envs: worker processes, each stepping its own
block of sub-envs with the same step loop as the sync backend
(:class:`~jaxrunner.multi_agent.sub_envs.SubEnvBlock`).

Workers start as the single-agent process backend's do (``forkserver``, factories sent
by ``cloudpickle``: :mod:`jaxrunner.envs.process.launch`). A step sends each worker
its rows of the action batches, then gathers every worker's rows of the group buffers:
all workers step at once, and the results are the sync backend's, row for row.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Sequence
from typing import Any

import cloudpickle
import numpy as np

from jaxrunner.envs.process.launch import multiprocessing_context, pickle_factories, worker_bounds
from jaxrunner.errors import EnvError, JaxRunnerError
from jaxrunner.multi_agent.buffers import GroupBuffers, MultiAgentStep
from jaxrunner.multi_agent.groups import PolicyMappingFn
from jaxrunner.multi_agent.sub_envs import (
    MultiAgentEnvFactory,
    SubEnvBlock,
    check_actions,
    env_groups,
)
from jaxrunner.multi_agent.vector_env import MultiAgentVectorEnv

_FIELDS = ("obs", "acting", "agent_start", "completed", "reward", "terminated", "truncated")


def _snapshot(block: SubEnvBlock, out: MultiAgentStep | None = None) -> tuple:
    """A worker's reply: copies of its buffers (they are reused by the next step)."""
    groups = [
        {name: getattr(buf, name) for name in (*_FIELDS, "next_obs")} for buf in block.buffers
    ]
    infos = out.infos if out is not None else None
    return groups, block.env_done, block.env_reward, block.unassigned_reward, infos


def _worker(conn: Any, payload: bytes, offset: int) -> None:
    """The worker loop: builds its sub-envs, then answers commands until ``close``."""
    block = None
    try:
        env_fns, mapping = cloudpickle.loads(payload)
        envs = [fn() for fn in env_fns]
        block = SubEnvBlock(envs, env_groups(envs[0], mapping), offset)
        conn.send(("ok", (block.groups, block.turn_based)))
        while True:
            command, *args = conn.recv()
            if command == "close":
                break
            try:
                if command == "reset":
                    infos = block.reset(*args)
                    conn.send(("ok", (*_snapshot(block)[:4], infos)))
                else:
                    out = block.step(args[0])  # checked by the main process
                    conn.send(("ok", _snapshot(block, out)))
            except Exception as err:  # sent to the main process, with its traceback
                _send_error(conn, err)
    except Exception as err:
        _send_error(conn, err)
    finally:
        if block is not None:
            block.close()
        conn.close()


def _send_error(conn: Any, err: Exception) -> None:
    """Sends ``err`` (itself if it pickles, else its repr) and its traceback."""
    tb = traceback.format_exc()
    try:
        conn.send(("error", err, tb))
    except Exception:
        conn.send(("error", None, f"{err!r}\n{tb}"))


class ProcessMultiAgentVectorEnv(MultiAgentVectorEnv):
    """Multi-agent sub-envs in worker processes (see the module docstring).

    Args:
        env_fns: zero-argument factories of PettingZoo envs (picklable by cloudpickle).
        policy_mapping_fn: as for the sync backend (picklable).
        num_workers: worker processes (None: one per CPU but one, at most one per env).
    """

    def __init__(
        self,
        env_fns: Sequence[MultiAgentEnvFactory],
        policy_mapping_fn: PolicyMappingFn | None = None,
        *,
        num_workers: int | None = None,
    ) -> None:
        super().__init__()
        self.num_envs = len(env_fns)
        self._bounds = worker_bounds(self.num_envs, None, num_workers)
        ctx = multiprocessing_context("forkserver")
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        try:
            for lo, hi in self._bounds:
                pickle_factories(env_fns[lo:hi], lo)  # a clear error for unpicklable ones
                payload = cloudpickle.dumps((list(env_fns[lo:hi]), policy_mapping_fn))
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_worker, args=(child, payload, lo), daemon=True)
                proc.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(proc)
            replies = [self._reply(k) for k in range(len(self._conns))]
        except BaseException:
            self._closed = True
            self._close_backend()
            raise
        self.groups, self.turn_based = replies[0]
        self._buffers = [GroupBuffers.allocate(g, self.num_envs) for g in self.groups]
        self._env_done = np.zeros(self.num_envs, np.bool_)
        self._env_reward = np.zeros(self.num_envs, np.float64)
        self._unassigned = np.zeros(self.num_envs, np.float64)

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> MultiAgentStep:
        self._check_open("reset_batch")
        for conn, (lo, hi) in zip(self._conns, self._bounds):
            conn.send(("reset", list(seeds[lo:hi]), options))
        return self._gather()

    def step_batch(self, actions: Sequence[Any]) -> MultiAgentStep:
        self._check_open("step_batch")
        check_actions(self.groups, actions, self.num_envs)  # before any worker steps
        for conn, (lo, hi) in zip(self._conns, self._bounds):
            conn.send(("step", [np.asarray(a)[lo:hi] for a in actions]))
        return self._gather()

    def _gather(self) -> MultiAgentStep:
        infos: list[dict[str, Any]] = []
        for k, (lo, hi) in enumerate(self._bounds):
            groups, done, reward, unassigned, part_infos = self._reply(k)
            for buf, arrays in zip(self._buffers, groups):
                for name, value in arrays.items():
                    _copy_rows(getattr(buf, name), value, lo, hi)
            self._env_done[lo:hi] = done
            self._env_reward[lo:hi] = reward
            self._unassigned[lo:hi] = unassigned
            infos.extend(part_infos)
        return MultiAgentStep(
            groups={g.policy_id: buf for g, buf in zip(self.groups, self._buffers)},
            env_done=self._env_done,
            env_reward=self._env_reward,
            unassigned_reward=self._unassigned,
            infos=infos,
        )

    def _reply(self, k: int) -> Any:
        try:
            status, *rest = self._conns[k].recv()
        except EOFError as err:
            raise EnvError(
                f"multi-agent process worker {k} (sub-envs {self._bounds[k]}) died; see its "
                "output above. Recreate the env with jaxrunner.make_multi_agent_vec().",
                self._bounds[k][0],
            ) from err
        if status == "error":
            self._closed = True
            self._close_backend()
            err, tb = rest
            where = f"multi-agent process worker {k} (sub-envs {self._bounds[k]})"
            if err is None:
                raise EnvError(f"{where} failed:\n{tb}", self._bounds[k][0])
            err.add_note(f"--- {where}: worker traceback ---\n{tb}")
            if isinstance(err, JaxRunnerError):
                raise err
            raise EnvError(f"{where}: a sub-env raised {err!r}", self._bounds[k][0]) from err
        return rest[0] if len(rest) == 1 else rest

    def _close_backend(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError, BrokenPipeError):
                conn.send(("close",))
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
        for conn in self._conns:
            conn.close()


def _copy_rows(dst: Any, src: Any, lo: int, hi: int) -> None:
    if isinstance(dst, dict):
        for key in dst:
            _copy_rows(dst[key], src[key], lo, hi)
    elif isinstance(dst, tuple):
        for d, s in zip(dst, src):
            _copy_rows(d, s, lo, hi)
    else:
        dst[lo:hi] = src


__all__ = ["ProcessMultiAgentVectorEnv"]
