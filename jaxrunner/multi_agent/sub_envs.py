"""A block of PettingZoo sub-envs with their group buffers: the step loop every
multi-agent backend runs (the sync vector env in this process, each process worker
for its own block)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxrunner import spaces as jr_spaces
from jaxrunner.envs.sub_envs import SubEnvRaised
from jaxrunner.errors import InvalidActionError, JaxRunnerError, SpaceMismatchError
from jaxrunner.multi_agent.buffers import GroupBuffers, MultiAgentStep
from jaxrunner.multi_agent.drivers import AECDriver, Driver, Layout, make_driver
from jaxrunner.multi_agent.groups import AgentGroup, PolicyMappingFn, build_groups

MultiAgentEnvFactory = Callable[[], Any]
"""A zero-argument callable returning a PettingZoo ``ParallelEnv`` or ``AECEnv``."""


def env_groups(env: Any, policy_mapping_fn: PolicyMappingFn | None) -> tuple[AgentGroup, ...]:
    """The groups of a PettingZoo env's ``possible_agents``."""
    return build_groups(
        env.possible_agents, env.observation_space, env.action_space, policy_mapping_fn
    )


class SubEnvBlock:
    """Sub-envs ``offset .. offset + len(envs)`` of a vector env, stepped in turn into
    their own ``[n, A_g, ...]`` buffers.

    Args:
        envs: the sub-envs (PettingZoo parallel or AEC envs, all of one kind).
        groups: the agent groups (equal for every sub-env).
        offset: the global index of the first sub-env (for error messages).
    """

    def __init__(self, envs: Sequence[Any], groups: Sequence[AgentGroup], offset: int = 0) -> None:
        self.envs, self.groups, self.offset = list(envs), tuple(groups), offset
        n = len(self.envs)
        for i, env in enumerate(self.envs):
            if tuple(env.possible_agents) != tuple(self.envs[0].possible_agents):
                raise SpaceMismatchError(
                    f"multi-agent sub-env {offset + i} has possible_agents "
                    f"{list(env.possible_agents)}, sub-env {offset} has "
                    f"{list(self.envs[0].possible_agents)}; every sub-env must have the same "
                    "agents. Check the factory."
                )
        self.buffers = [GroupBuffers.allocate(group, n) for group in self.groups]
        self.check_actions = ActionCheck(self.groups, n)
        layout = Layout(self.groups, self.buffers, offset)
        self.drivers: list[Driver] = [make_driver(env, i, layout) for i, env in enumerate(envs)]
        self.turn_based = isinstance(self.drivers[0], AECDriver)
        """AEC sub-envs: one agent acts per step."""
        self.env_done = np.zeros(n, np.bool_)
        self.env_reward = np.zeros(n, np.float64)
        self.unassigned_reward = np.zeros(n, np.float64)
        self._groups_by_id = {g.policy_id: buf for g, buf in zip(self.groups, self.buffers)}

    def reset(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """Resets every sub-env (sub-env ``i`` with ``seeds[i]``)."""
        infos = []
        for buf in self.buffers:
            buf.completed[:] = False
        for driver, seed in zip(self.drivers, seeds):
            try:
                infos.append(driver.reset(seed, options))
            except Exception as err:
                raise located(err, driver, "reset") from _cause(err)
        return infos

    def step(self, actions: Sequence[Any]) -> MultiAgentStep:
        """One step of every sub-env; ``actions[g]`` is group ``g``'s ``[n, A_g, ...]``
        batch (only the acting agents' entries are read)."""
        infos = []
        same_step = not self.turn_based
        for buf in self.buffers:  # every row at once; the drivers set what they write
            buf.clear_step(same_step)
        env_done, env_reward, unassigned_reward = (
            self.env_done,
            self.env_reward,
            self.unassigned_reward,
        )
        env_done[:] = False
        unassigned_reward[:] = 0.0
        for b, driver in enumerate(self.drivers):
            try:
                done, reward, unassigned, info = driver.step(actions)
            except Exception as err:
                raise located(err, driver, "step") from _cause(err)
            env_reward[b] = reward
            if done:  # rare: written only then
                env_done[b], unassigned_reward[b] = True, unassigned
            infos.append(info)
        return self.result(infos)

    def result(self, infos: list[dict[str, Any]]) -> MultiAgentStep:
        return MultiAgentStep(
            groups=self._groups_by_id,
            env_done=self.env_done,
            env_reward=self.env_reward,
            unassigned_reward=self.unassigned_reward,
            infos=infos,
        )

    def close(self) -> None:
        for env in self.envs:
            env.close()


def located(err: Exception, driver: Driver, call: str) -> Exception:
    """``err`` from ``driver``'s sub-env as the error to raise: jaxrunner's own checks
    (which already name the sub-env and agent) as they are, with ``env_index`` set;
    anything the env's code raised as a :class:`~jaxrunner.envs.sub_envs.SubEnvRaised`
    naming the sub-env (and, in a turn-based env, the agent whose turn it was), the
    original chained."""
    if isinstance(err, JaxRunnerError):
        if getattr(err, "env_index", None) is None:
            err.env_index = driver.env_index  # type: ignore[attr-defined]
        return err
    agent = driver.env.agent_selection if isinstance(driver, AECDriver) else None
    return SubEnvRaised(err, driver.env_index, call, agent if isinstance(agent, str) else None)


def _cause(err: Exception) -> BaseException | None:
    """What :func:`located`'s error chains: the env's exception (ours keep their own)."""
    return err.__cause__ if isinstance(err, JaxRunnerError) else err


class ActionCheck:
    """Validates every group's ``[B, A_g, ...]`` action batch as a whole, before any
    sub-env steps (shapes and dtypes; nothing is cast). A call returns the actions.

    The common case (one numpy array per group, of the expected shape and dtype kind)
    is tested inline; anything else goes through
    :func:`~jaxrunner.spaces.check_action_batch`, which names what is wrong.

    Raises (from a call):
        InvalidActionError: a batch of the wrong structure, shape or dtype.
    """

    def __init__(self, groups: Sequence[AgentGroup], num_envs: int) -> None:
        self.groups, self.num_envs = tuple(groups), num_envs
        self._fast: list[tuple[tuple[int, ...], str]] | None = []
        for group in self.groups:
            space = group.action_space
            if type(space) not in jr_spaces.LEAF_TYPES:
                self._fast = None
                break
            shape, dtype = jr_spaces.leaf_spec(space)
            kinds = "iu" if dtype.kind in "iu" else "f" if dtype.kind == "f" else ""
            self._fast.append(((num_envs, group.num_agents, *shape), kinds))

    def __call__(self, actions: Sequence[Any]) -> Sequence[Any]:
        fast = self._fast
        if fast is not None and len(actions) == len(fast):
            for batch, (shape, kinds) in zip(actions, fast):
                if not (
                    type(batch) is np.ndarray and batch.shape == shape and batch.dtype.kind in kinds
                ):
                    break
            else:
                return actions
        return self._check(actions)

    def _check(self, actions: Sequence[Any]) -> Sequence[Any]:
        groups, num_envs = self.groups, self.num_envs
        if len(actions) != len(groups):
            raise InvalidActionError(
                f"multi-agent step: expected one action batch per group ({len(groups)}: "
                f"{[g.policy_id for g in groups]}), got {len(actions)}."
            )
        for group, batch in zip(groups, actions):
            rows = num_envs * group.num_agents
            lead = (num_envs, group.num_agents)

            def flat(x: Any, lead: tuple[int, int] = lead, group: AgentGroup = group) -> Any:
                shape = np.shape(x)
                if shape[:2] != lead:
                    raise InvalidActionError(
                        f"multi-agent step: group {group.policy_id!r} expected actions of "
                        f"leading shape [B, A_g] = {lead}, got shape {shape}."
                    )
                return np.asarray(x).reshape(-1, *shape[2:])

            jr_spaces.check_action_batch(group.action_space, jax.tree.map(flat, batch), rows)
        return actions


__all__ = ["ActionCheck", "MultiAgentEnvFactory", "SubEnvBlock", "env_groups", "located"]
