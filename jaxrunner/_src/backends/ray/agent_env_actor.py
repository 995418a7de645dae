"""The body of one multi-agent env actor of ``backend="ray"``, and the reply it sends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxrunner._src.backends.multi_agent.agent_block import (
    AgentBlock,
    env_groups,
)
from jaxrunner._src.backends.multi_agent.buffers import FIELDS, AgentStepBuffers, MultiAgentStep
from jaxrunner._src.backends.ray.env_actor import ActorBody
from jaxrunner._src.backends.restarts import RestartPolicy, close_quietly
from jaxrunner._src.backends.sub_env_block import EnvFactory, build_envs
from jaxrunner._src.core.agent_groups import AgentGroup, PolicyMappingFn


class BlockReply(NamedTuple):
    """An actor's answer to ``reset``/``step``: copies of its rows of the buffers (Ray
    serializes them), its infos, and its failures by global env index."""

    groups: list[dict[str, Any]]
    env_done: np.ndarray
    env_reward: np.ndarray
    unassigned_reward: np.ndarray
    infos: list[dict[str, Any]]
    failed: np.ndarray | None
    errors: dict[int, BaseException] | None


class AgentEnvWorker(ActorBody):
    """The body of one multi-agent env actor: a :class:`AgentBlock` over sub-envs
    ``offset..``, built from its factories."""

    block: AgentBlock

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        restart_policy: RestartPolicy | None,
        offset: int,
        policy_mapping_fn: PolicyMappingFn | None,
    ) -> None:
        envs = build_envs(env_fns, offset)
        try:
            groups = env_groups(envs[0], policy_mapping_fn)
            self.block = AgentBlock(
                envs, groups, offset, fns=env_fns, restart_policy=restart_policy
            )
        except BaseException:
            for env in envs:
                close_quietly(env)
            raise

    def describe(self) -> tuple[tuple[AgentGroup, ...], bool]:
        return self.block.groups, self.block.turn_based

    def reset(self, seeds: Sequence[int | None], options: dict[str, Any] | None) -> BlockReply:
        return self._reply(self.block.result(self.block.reset(seeds, options)))

    def reset_at(self, index: int, seed: int | None, options: dict[str, Any] | None) -> BlockReply:
        infos: list[dict[str, Any]] = [{} for _ in self.block.envs]
        infos[index] = self.block.reset_or_restart(self.block.offset + index, seed, options)
        return self._reply(self.block.result(infos))

    def step(self, lo: int, hi: int, actions: Sequence[Any]) -> BlockReply:
        """Steps rows ``[lo, hi)`` of the block (``actions`` holds those rows; checked
        before any actor steps); the reply holds those rows only."""
        infos, errors = self.block.step_rows(lo, hi, actions)
        return self._reply(self.block.result(infos, errors), slice(lo, hi))

    def _reply(self, out: MultiAgentStep, rows: slice = slice(None)) -> BlockReply:
        groups = [
            {name: jax.tree.map(lambda x: x[rows], getattr(buf, name)) for name in FIELDS}
            for buf in self.block.buffers
        ]
        return BlockReply(
            groups,
            out.env_done[rows],
            out.env_reward[rows],
            out.unassigned_reward[rows],
            out.infos,
            None if out.failed is None else out.failed[rows],
            out.errors,
        )


def put_reply(b: AgentStepBuffers, reply: BlockReply, rows: slice) -> None:
    """An actor's reply written to ``rows`` of the buffers."""
    for buf, arrays in zip(b.groups, reply.groups):
        for name, value in arrays.items():
            _copy_rows(getattr(buf, name), value, rows)
    b.env_done[rows] = reply.env_done
    b.env_reward[rows] = reply.env_reward
    b.unassigned_reward[rows] = reply.unassigned_reward


def _copy_rows(dst: Any, src: Any, rows: slice) -> None:
    if isinstance(dst, dict):
        for key in dst:
            _copy_rows(dst[key], src[key], rows)
    elif isinstance(dst, tuple):
        for d, s in zip(dst, src):
            _copy_rows(d, s, rows)
    else:
        dst[rows] = src
