"""What ``backend="ray"`` does differently for each kind of env (actions per actor, replies
into rows, failed slots): :class:`GymnasiumRows` and :class:`AgentRows` (PettingZoo)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.multi_agent.action_check import ActionCheck
from jaxrunner._src.backends.ray.env_actor import AgentEnvWorker, BlockReply, EnvWorker
from jaxrunner._src.backends.steps import (
    AgentStepBuffers,
    BatchStep,
    MultiAgentStep,
    StepBuffers,
    StepViews,
    fail_slot,
    span,
)
from jaxrunner._src.backends.sub_env_block import PerSize
from jaxrunner.errors import SpaceMismatchError


class Answer(NamedTuple):
    """What an actor's reply says besides the rows it wrote (indices are global)."""

    infos: Sequence[dict[str, Any]]  # one per env of the reply's rows
    failed: np.ndarray | None  # its rows' failed mask (None: none failed)
    errors: dict[int, BaseException]
    reset_infos: dict[int, dict[str, Any]]


class GymnasiumRows:
    """Gymnasium sub-envs: a :class:`BatchStep` over :class:`StepBuffers`."""

    worker: type = EnvWorker
    worker_args: tuple = ()
    ready_first = True  # unless RayConfig.ready_first says otherwise

    def describe(self, vec: Any, described: list[Any], unit_rows: list[slice]) -> None:
        """Checks the actors' spaces are equal; sets the vector env's spaces and
        metadata; allocates the buffers and the action checks (``checks[num](actions)``,
        built once per batch size)."""
        obs_space, action_space, metadata, render_mode = described[0]
        for u, (other_obs, other_action, _, _) in enumerate(described):
            if other_obs != obs_space or other_action != action_space:
                raise SpaceMismatchError(
                    f"the sub-envs of Ray env actor {u} (envs {unit_rows[u]}) have spaces "
                    f"{other_obs}, {other_action}; actor 0's have {obs_space}, {action_space}. "
                    "Every sub-env of a vector env must have equal spaces. Check the factory."
                )
        vec._take_spaces(obs_space, action_space, metadata, render_mode)
        self.space = obs_space
        self.buffers = StepBuffers(obs_space, vec.num_envs)
        self._action_space = action_space
        self.checks = PerSize(functools.partial(space_arrays.action_batch_check, action_space))

    def part(self, actions: Any, at: slice | np.ndarray) -> Any:
        return space_arrays.map_structure(self._action_space, lambda a: np.asarray(a)[at], actions)

    def put(self, out: BatchStep, rows: slice) -> Answer:
        """An actor's step (its errors and reset infos by global index) written to ``rows``."""
        b, space = self.buffers, self.space
        space_arrays.copy_into(space, b.obs, out.obs, rows)
        space_arrays.copy_into(space, b.next_obs, out.next_obs, rows)
        b.reward[rows] = out.reward
        b.terminated[rows] = out.terminated
        b.truncated[rows] = out.truncated
        return Answer(out.infos, out.failed, out.errors or {}, dict(out.reset_infos))

    def put_reset(self, reply: tuple[Any, list[dict[str, Any]]], rows: slice) -> Answer:
        """An actor's reset (observations, infos) written to ``rows``."""
        obs, infos = reply
        space_arrays.copy_into(self.space, self.buffers.obs, obs, rows)
        return Answer(infos, None, {}, {})

    def fail(self, index: int, reset: tuple[Any, Any], k: int) -> None:
        """Env ``index``'s slot holds no transition; its observation is its new sub-env's,
        row ``k`` of its new actor's ``reset`` reply."""
        obs = space_arrays.rows(self.space, reset[0], slice(k, k + 1))
        space_arrays.copy_into(self.space, self.buffers.obs, obs, slice(index, index + 1))
        fail_slot(self.buffers, self.space, index)

    def step(self, lo: int, hi: int, whole: bool, *fields: Any) -> BatchStep:
        """Envs ``[lo, hi)``'s step (``env_ids`` None where ``whole``): ``fields`` are
        the infos, reset infos, failed mask and errors."""
        return self.buffers.batch_step(self.space, None if whole else slice(lo, hi), *fields)

    def merge(self, steps: list[BatchStep]) -> BatchStep:
        """Several actors' steps as one (rows in actor order)."""
        steps.sort(key=lambda r: span(r).start)
        return self.buffers.merge(self.space, steps)

    def reset_result(self, infos: list[dict[str, Any]], *_: Any) -> Any:
        return self.buffers.obs, infos

    def reset_at_result(self, reply: Any, unit: slice, index: int) -> Any:
        obs, info = reply
        space_arrays.copy_into(self.space, self.buffers.obs, obs, index)
        return space_arrays.take(self.space, self.buffers.obs, index), info


class AgentRows:
    """PettingZoo sub-envs: a :class:`MultiAgentStep` over :class:`AgentStepBuffers`."""

    worker: type = AgentEnvWorker
    ready_first = False  # unless RayConfig.ready_first says otherwise
    merge = None  # never merged: the multi-agent sampler acts on envs of one step count

    def __init__(self, worker_args: tuple = ()) -> None:
        self.worker_args = worker_args

    def describe(self, vec: Any, described: list[Any], unit_rows: list[slice]) -> None:
        """Checks the actors' agents are equal; sets the vector env's groups; allocates
        the buffers and the action checks."""
        vec.groups, vec.turn_based = described[0]
        for u, other in enumerate(described):
            if other != described[0]:
                raise SpaceMismatchError(
                    f"the sub-envs of Ray env actor {u} have agent groups {other[0]}, actor "
                    f"0's have {vec.groups}; every sub-env must have the same agents and "
                    "spaces. Check the factory."
                )
        self.groups = vec.groups
        self.buffers = AgentStepBuffers.allocate(vec.groups, vec.num_envs)
        self._views = StepViews(self.buffers, vec.policy_ids)
        self.checks = PerSize(functools.partial(ActionCheck, self.groups))

    def part(self, actions: Sequence[Any], at: slice | np.ndarray) -> list[Any]:
        return [
            space_arrays.map_structure(g.action_space, lambda x: np.asarray(x)[at], a)
            for g, a in zip(self.groups, actions)
        ]

    def put(self, reply: BlockReply, rows: slice) -> Answer:
        """An actor's reply (its errors by global index) written to ``rows``."""
        _put_reply(self.buffers, reply, rows)
        return Answer(reply.infos, reply.failed, reply.errors or {}, {})

    put_reset = put

    def fail(self, index: int, reset: BlockReply, k: int) -> None:
        """Env ``index``'s row holds no transition; who acts next, on what, is its new
        sub-env's, row ``k`` of its new actor's ``reset`` reply."""
        _put_reply(self.buffers, reset, slice(index, index + 1), slice(k, k + 1))
        self.buffers.fail_row(index)

    def step(self, lo: int, hi: int, whole: bool, *fields: Any) -> MultiAgentStep:
        infos, _, failed, errors = fields  # no reset infos: put() gives none
        return self._views.step(lo, hi, infos, failed, errors)

    def reset_result(self, infos: list[dict[str, Any]], *fields: Any) -> MultiAgentStep:
        return self.step(0, len(infos), True, infos, *fields)

    def reset_at_result(self, reply: BlockReply, unit: slice, index: int) -> dict[str, Any]:
        _put_reply(self.buffers, reply, unit)
        return reply.infos[index - unit.start]


def _put_reply(
    b: AgentStepBuffers, reply: BlockReply, rows: slice, part: slice = slice(None)
) -> None:
    """Rows ``part`` of an actor's reply written to ``rows`` of the buffers."""

    def put(dst: Any, src: Any) -> None:
        dst[rows] = src[part]

    for buf, arrays in zip(b.groups, reply.groups):
        for name, value in arrays.items():
            space_arrays.tree_map(put, getattr(buf, name), value)
    b.env_done[rows] = reply.env_done[part]
    b.env_reward[rows] = reply.env_reward[part]
    b.unassigned_reward[rows] = reply.unassigned_reward[part]
