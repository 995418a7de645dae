"""The bodies of the env actors of ``backend="ray"``: a block of sub-envs stepped by the
shared step loop (a ``GymnasiumBlock``, or an ``AgentBlock`` for PettingZoo envs)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import gymnasium
import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.agent_block import AgentBlock, env_groups
from jaxrunner._src.backends.base import check_equal_spaces, env_spaces
from jaxrunner._src.backends.gymnasium_block import GymnasiumBlock
from jaxrunner._src.backends.ray.progress import SharedMarks, attach
from jaxrunner._src.backends.restarts import RestartPolicy, closing_on_error
from jaxrunner._src.backends.steps import FIELDS, BatchStep, MultiAgentStep, StepBuffers
from jaxrunner._src.backends.sub_env_block import (
    EnvFactory,
    PerSize,
    SubEnvBlock,
    build_envs,
    failed_mask,
    pickled,
)
from jaxrunner._src.core.agent_groups import AgentGroup, PolicyMappingFn


class ActorBody:
    """What every env actor does with its block of sub-envs beside stepping."""

    block: SubEnvBlock
    failed: BaseException | None = None
    """What building the sub-envs raised: ``describe()`` returns it in place of the
    description (Ray keeps only the text of an error an actor's constructor raises)."""

    @contextlib.contextmanager
    def _building(self) -> Iterator[None]:
        try:
            yield
        except Exception as err:
            self.failed = err if pickled(err) else RuntimeError(repr(err))

    def num_restarts(self) -> int:
        return self.block.num_restarts

    def call(self, name: str, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        return self._on_each("call", name, [(name, args, kwargs)] * len(self.block.envs))

    def get_attr(self, name: str) -> list[Any]:
        return self._on_each("get_attr", name, [(name,)] * len(self.block.envs))

    def set_attr(self, name: str, values: list[Any]) -> None:
        self._on_each("set_attr", name, [(name, value) for value in values])

    def _on_each(self, method: str, name: str, per_env: list[tuple]) -> list[Any]:
        """``method`` run on each sub-env in turn (``per_env[j]``: its args); an error
        names the sub-env and the call, which the driver cannot tell (it re-raises it)."""
        results = []
        for j, args in enumerate(per_env):
            i = self.block.offset + j
            try:
                results.append(self.block.on_sub_env(i, method, args))
            except Exception as err:
                err.add_note(f"jaxrunner: raised by sub-env {i} in {method}({name!r})")
                raise
        return results

    def render(self) -> list[Any]:
        return self.block.render()

    def on_sub_env(self, index: int, method: str, args: tuple) -> Any:
        return self.block.on_sub_env(index, method, args)

    def close(self) -> None:
        self.block.close()


class EnvWorker(ActorBody):
    """The body of one env actor: a :class:`GymnasiumBlock` over sub-envs ``offset..``,
    built from its factories. Returns copies of its rows (Ray serializes return values)
    and portable errors."""

    block: GymnasiumBlock

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        restart_policy: RestartPolicy | None,
        offset: int,
        *,
        progress: SharedMarks | None = None,
    ) -> None:
        with self._building():
            envs = build_envs(env_fns, offset)
            with closing_on_error(envs):
                check_equal_spaces(env_spaces(envs, offset), offset)
            first = envs[0]
            self.space, self.rows = first.observation_space, slice(offset, offset + len(envs))
            self._described = (self.space, first.action_space, first.metadata, first.render_mode)
            self._actions = PerSize(
                functools.partial(space_arrays.make_action_splitter, first.action_space)
            )
            # By global index, as the block writes them (the rows before offset stay untouched).
            buffers = StepBuffers(self.space, self.rows.stop)
            self.block = GymnasiumBlock(
                envs, env_fns, offset, buffers, self.space, restart_policy, attach(progress)
            )

    def describe(
        self,
    ) -> tuple[gymnasium.Space, gymnasium.Space, dict[str, Any], Any] | BaseException:
        return self._described if self.failed is None else self.failed

    def reset(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None
    ) -> tuple[Any, list[dict[str, Any]]]:
        infos = self.block.reset(seeds, options)
        return space_arrays.rows(self.space, self.block.buffers.obs, self.rows), infos

    def reset_at(
        self, index: int, seed: int | None, options: dict[str, Any] | None
    ) -> tuple[Any, dict[str, Any]]:
        i = self.rows.start + index
        info = self.block.reset_or_restart(i, seed, options)
        return space_arrays.take(self.space, self.block.buffers.obs, i), info

    def step(self, lo: int, hi: int, actions: Any) -> BatchStep:
        """Steps rows ``[lo, hi)`` of the block (``actions`` holds those rows)."""
        lo, hi = self.rows.start + lo, self.rows.start + hi
        out = self.block.step(lo, hi, self._actions[hi - lo](actions))
        # Errors cross a process boundary: one that does not survive pickling goes as its repr.
        errors = {i: e if pickled(e) else RuntimeError(repr(e)) for i, e in out.errors.items()}
        failed = failed_mask(out.failed, lo, hi)
        return self.block.buffers.batch_step(
            self.space, slice(lo, hi), out.infos, out.reset_infos, failed, errors or None
        )


class BlockReply(NamedTuple):
    """An actor's answer to ``reset``/``step``: copies of its rows of the buffers (Ray
    serializes them), its infos, and its failures by global env index."""

    groups: list[dict[str, Any]]
    env_done: np.ndarray
    env_reward: np.ndarray
    unassigned_reward: np.ndarray
    infos: Sequence[dict[str, Any]]
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
        *,
        progress: SharedMarks | None = None,
    ) -> None:
        with self._building():
            envs = build_envs(env_fns, offset)
            with closing_on_error(envs):
                groups = env_groups(envs[0], policy_mapping_fn)
                self.block = AgentBlock(
                    envs,
                    groups,
                    offset,
                    fns=env_fns,
                    restart_policy=restart_policy,
                    status=attach(progress),
                )

    def describe(self) -> tuple[tuple[AgentGroup, ...], bool] | BaseException:
        return (self.block.groups, self.block.turn_based) if self.failed is None else self.failed

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
            {name: space_arrays.tree_map(lambda x: x[rows], getattr(buf, name)) for name in FIELDS}
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
