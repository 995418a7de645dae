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

Reply = tuple[list[dict[str, Any]], np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]
"""A remote block's answer: its group buffers, env_done, env_reward, unassigned_reward
and infos."""


class BlockServer:
    """The remote side: a block of sub-envs built from pickled factories."""

    def __init__(self, env_fns: Sequence[Any], mapping: Any, offset: int) -> None:
        envs = [fn() for fn in env_fns]
        self.block = SubEnvBlock(envs, env_groups(envs[0], mapping), offset)

    def describe(self) -> tuple[tuple[AgentGroup, ...], bool]:
        return self.block.groups, self.block.turn_based

    def reset(self, seeds: Sequence[int | None], options: dict[str, Any] | None) -> Reply:
        infos = self.block.reset(seeds, options)
        return self._reply(infos)

    def step(self, actions: Sequence[Any]) -> Reply:
        out = self.block.step(actions)  # checked by the caller, before any remote steps
        return self._reply(out.infos)

    def _reply(self, infos: list[dict[str, Any]]) -> Reply:
        block = self.block
        groups = [{name: getattr(buf, name) for name in _FIELDS} for buf in block.buffers]
        return groups, block.env_done, block.env_reward, block.unassigned_reward, infos

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
        infos: list[dict[str, Any]] = []
        for (lo, hi), (groups, done, reward, unassigned, part) in zip(self._bounds, replies):
            for buf, arrays in zip(self._buffers, groups):
                for name, value in arrays.items():
                    _copy_rows(getattr(buf, name), value, lo, hi)
            self._env_done[lo:hi] = done
            self._env_reward[lo:hi] = reward
            self._unassigned[lo:hi] = unassigned
            infos.extend(part)
        return MultiAgentStep(
            groups={g.policy_id: buf for g, buf in zip(self.groups, self._buffers)},
            env_done=self._env_done,
            env_reward=self._env_reward,
            unassigned_reward=self._unassigned,
            infos=infos,
        )


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
