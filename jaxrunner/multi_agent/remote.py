"""Multi-agent sub-envs stepped elsewhere (worker processes, Ray actors): each remote
holds a block of sub-envs (:class:`~jaxrunner.multi_agent.sub_envs.SubEnvBlock`, the
sync backend's step loop) and answers a reset or a step with its rows of the group
buffers; this side gathers them into ``[B, A_g, ...]`` buffers of its own. Every remote
steps at once, and the results are the sync backend's, row for row."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrunner.envs.sub_envs import build_envs
from jaxrunner.faults import RestartPolicy, close_quietly
from jaxrunner.multi_agent.buffers import GroupBuffers, MultiAgentStep
from jaxrunner.multi_agent.groups import AgentGroup
from jaxrunner.multi_agent.sub_envs import ActionCheck, SubEnvBlock, env_groups
from jaxrunner.multi_agent.vector_env import MultiAgentVectorEnv

_FIELDS = (
    "obs",
    "acting",
    "agent_start",
    "completed",
    "reward",
    "terminated",
    "truncated",
    "next_obs",
)

Reply = tuple[
    list[dict[str, Any]],
    np.ndarray,
    np.ndarray,
    np.ndarray,
    list[dict[str, Any]],
    "np.ndarray | None",
    "dict[int, BaseException] | None",
]
"""A remote block's answer: its group buffers, env_done, env_reward, unassigned_reward,
infos, failed rows and errors (by global env index)."""


class BlockServer:
    """The remote side: a block of sub-envs built from pickled factories."""

    def __init__(
        self,
        env_fns: Sequence[Any],
        mapping: Any,
        offset: int,
        restart_policy: RestartPolicy | None = None,
    ) -> None:
        envs = build_envs(env_fns, offset)
        try:
            groups = env_groups(envs[0], mapping)
            self.block = SubEnvBlock(
                envs, groups, offset, fns=env_fns, restart_policy=restart_policy
            )
        except BaseException:
            for env in envs:
                close_quietly(env)
            raise

    def describe(self) -> tuple[tuple[AgentGroup, ...], bool]:
        return self.block.groups, self.block.turn_based

    def reset(self, seeds: Sequence[int | None], options: dict[str, Any] | None) -> Reply:
        infos = self.block.reset(seeds, options)
        return self._reply(self.block.result(infos))

    def step(self, actions: Sequence[Any]) -> Reply:
        # checked by the caller, before any remote steps
        return self._reply(self.block.step(actions))

    def call(self, name: str, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        return self.block.call(name, args, kwargs)

    def get_attr(self, name: str) -> list[Any]:
        return self.block.get_attr(name)

    def set_attr(self, name: str, values: list[Any]) -> None:
        self.block.set_attr(name, values)

    def render(self) -> list[Any]:
        return self.block.render()

    def reset_at(self, index: int, seed: int | None, options: dict[str, Any] | None) -> Reply:
        infos = [{} for _ in self.block.envs]
        infos[index - self.block.offset] = self.block.reset_at(index, seed, options)
        return self._reply(self.block.result(infos))

    def get_num_restarts(self) -> int:
        return self.block.num_restarts

    def _reply(self, out: MultiAgentStep) -> Reply:
        groups = [{name: getattr(buf, name) for name in _FIELDS} for buf in self.block.buffers]
        return (
            groups,
            out.env_done,
            out.env_reward,
            out.unassigned_reward,
            out.infos,
            out.failed,
            out.errors,
        )

    def close(self) -> None:
        self.block.close()


class RemoteBlocksVectorEnv(MultiAgentVectorEnv):
    """Base of the backends whose blocks of sub-envs live elsewhere.

    Subclasses start the remotes, set ``groups``, ``turn_based`` and ``_bounds`` (each
    remote's ``[lo, hi)`` sub-envs), call :meth:`_allocate`, and implement
    :meth:`_call_all` (send one command to every remote, return their replies in
    order) and :meth:`_close_backend`.
    """

    _bounds: list[tuple[int, int]]

    def _allocate(self) -> None:
        self._buffers = [GroupBuffers.allocate(g, self.num_envs) for g in self.groups]
        self._env_done = np.zeros(self.num_envs, np.bool_)
        self._env_reward = np.zeros(self.num_envs, np.float64)
        self._unassigned = np.zeros(self.num_envs, np.float64)
        self._failed = np.zeros(self.num_envs, np.bool_)
        self._check_actions = ActionCheck(self.groups, self.num_envs)

    @abc.abstractmethod
    def _call_all(self, method: str, args_per_remote: list[tuple]) -> list[Reply]:
        """Calls ``method(*args)`` on every remote at once; their replies, in order."""

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> MultiAgentStep:
        self._check_open("reset_batch")
        args = [(list(seeds[lo:hi]), options) for lo, hi in self._bounds]
        return self._gather(self._call_all("reset", args))

    def step_batch(self, actions: Sequence[Any]) -> MultiAgentStep:
        self._check_open("step_batch")
        self._check_actions(actions)  # before any remote steps
        args = [([np.asarray(a)[lo:hi] for a in actions],) for lo, hi in self._bounds]
        return self._gather(self._call_all("step", args))

    def _gather(self, replies: list[Reply]) -> MultiAgentStep:
        """The remotes' replies (one per block, in order) as one step of every env."""
        self._failed[:] = False
        infos: list[dict[str, Any]] = []
        errors: dict[int, BaseException] = {}
        for k, reply in enumerate(replies):
            infos.extend(self._gather_block(k, reply, errors))
        return self._step_result(infos, errors)

    def _gather_block(
        self, k: int, reply: Reply, errors: dict[int, BaseException]
    ) -> list[dict[str, Any]]:
        """Copies block ``k``'s reply into this side's buffers; returns its infos."""
        lo, hi = self._bounds[k]
        groups, done, reward, unassigned, infos, failed, block_errors = reply
        for buf, arrays in zip(self._buffers, groups):
            for name, value in arrays.items():
                _copy_rows(getattr(buf, name), value, lo, hi)
        self._env_done[lo:hi] = done
        self._env_reward[lo:hi] = reward
        self._unassigned[lo:hi] = unassigned
        self._failed[lo:hi] = False if failed is None else failed
        errors.update(block_errors or {})
        return infos

    def _step_result(
        self, infos: list[dict[str, Any]], errors: dict[int, BaseException]
    ) -> MultiAgentStep:
        return MultiAgentStep(
            groups={g.policy_id: buf for g, buf in zip(self.groups, self._buffers)},
            env_done=self._env_done,
            env_reward=self._env_reward,
            unassigned_reward=self._unassigned,
            infos=infos,
            failed=self._failed if self._failed.any() else None,
            errors=errors or None,
        )

    @abc.abstractmethod
    def _call_one(self, k: int, method: str, args: tuple) -> Any:
        """Calls ``method(*args)`` on remote ``k``; its reply."""

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        self._check_open("reset_at")
        self._check_index(index)
        k = next(k for k, (lo, hi) in enumerate(self._bounds) if lo <= index < hi)
        infos = self._gather_block(k, self._call_one(k, "reset_at", (index, seed, options)), {})
        return infos[index - self._bounds[k][0]]

    def get_num_restarts(self) -> int:
        return sum(self._call_all("get_num_restarts", [()] * len(self._bounds)))

    def _each_env(self, method: str, args: tuple) -> tuple[Any, ...]:
        """``method(*args)`` on every remote block; their per-env results, in env order."""
        return tuple(x for part in self._call_all(method, [args] * len(self._bounds)) for x in part)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method ``name`` (or reads attribute ``name``) on every sub-env; the
        results must pickle."""
        self._check_open("call")
        return self._each_env("call", (name, args, kwargs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        self._check_open("get_attr")
        return self._each_env("get_attr", (name,))

    def set_attr(self, name: str, values: Any) -> None:
        self._check_open("set_attr")
        values = self._values_per_env(name, values)
        self._call_all("set_attr", [(name, values[lo:hi]) for lo, hi in self._bounds])

    def render(self) -> tuple[Any, ...]:
        self._check_open("render")
        return self._each_env("render", ())


def _copy_rows(dst: Any, src: Any, lo: int, hi: int) -> None:
    if isinstance(dst, dict):
        for key in dst:
            _copy_rows(dst[key], src[key], lo, hi)
    elif isinstance(dst, tuple):
        for d, s in zip(dst, src):
            _copy_rows(d, s, lo, hi)
    else:
        dst[lo:hi] = src


__all__ = ["BlockServer", "RemoteBlocksVectorEnv", "Reply"]
