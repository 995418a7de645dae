"""Multi-agent vector envs: B PettingZoo sub-envs stepped together into group arrays.

Contract (every multi-agent backend keeps it; the tests check it against the envs
stepped by hand):

* ``reset_batch(seeds)`` resets sub-env ``i`` with ``seeds[i]`` and returns a
  :class:`~jaxrunner.multi_agent.buffers.MultiAgentStep` whose group buffers say who
  acts first (``acting``) on what (``obs``).
* ``step_batch(actions)`` steps every sub-env once; ``actions[g]`` is group ``g``'s
  ``[B, A_g, ...]`` batch, read only where ``acting``. It returns the completed
  transitions (``completed``, ``reward``, flags, ``next_obs``: the agent's final
  observation where its episode ended) and who acts next. Where an env's episode ended
  (``env_done``) it was reset in the same step (SAME_STEP), and ``obs`` is the new
  episode's.
* Results are views of the env's buffers, valid until its next call.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from jaxrunner.envs.sub_envs import build_envs
from jaxrunner.errors import ClosedError, EnvIndexError, InvalidArgumentError
from jaxrunner.faults import RestartPolicy, close_quietly
from jaxrunner.multi_agent.buffers import MultiAgentStep
from jaxrunner.multi_agent.groups import GroupedAgents, PolicyMappingFn
from jaxrunner.multi_agent.sub_envs import MultiAgentEnvFactory, SubEnvBlock, env_groups


class MultiAgentVectorEnv(GroupedAgents, abc.ABC):
    """Base of the multi-agent backends (see the module docstring)."""

    num_envs: int
    turn_based: bool
    """AEC sub-envs: one agent acts per step."""
    restart_policy: RestartPolicy | None = None
    """How failed sub-envs are recreated (None: failures raise)."""

    def __init__(self) -> None:
        self._closed = False

    @abc.abstractmethod
    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> MultiAgentStep:
        """Resets every sub-env; see the module docstring."""

    @abc.abstractmethod
    def step_batch(self, actions: Sequence[Any]) -> MultiAgentStep:
        """Steps every sub-env once; see the module docstring."""

    @abc.abstractmethod
    def _close_backend(self) -> None:
        """Releases the sub-envs (called once)."""

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close_backend()

    @abc.abstractmethod
    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Resets sub-env ``index`` alone (the others are untouched); returns its reset
        infos. Its row of the buffers then holds the new episode's first agents."""

    @abc.abstractmethod
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method ``name`` (or reads attribute ``name``) on every sub-env."""

    @abc.abstractmethod
    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of every sub-env."""

    @abc.abstractmethod
    def set_attr(self, name: str, values: Any) -> None:
        """Sets attribute ``name`` of every sub-env (one value per sub-env, or one for
        all)."""

    @abc.abstractmethod
    def render(self) -> tuple[Any, ...]:
        """Every sub-env's ``render()``."""

    @abc.abstractmethod
    def get_num_restarts(self) -> int:
        """Sub-envs recreated after a failure so far (with a ``restart_policy``)."""

    def _check_index(self, index: Any) -> None:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.num_envs:
            raise EnvIndexError(
                f"reset_at(index={index!r}): index must be in [0, {self.num_envs})."
            )

    def _values_per_env(self, name: str, values: Any) -> list[Any]:
        """``set_attr``'s values: one per sub-env, or one value for all."""
        if not isinstance(values, (list, tuple)):
            return [values] * self.num_envs
        if len(values) != self.num_envs:
            raise InvalidArgumentError(
                f"set_attr({name!r}, values): need one value per sub-env ({self.num_envs}), "
                f"got {len(values)}."
            )
        return list(values)

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise ClosedError(
                f"{type(self).__name__}.{what}() called after close(); create a new one with "
                "jaxrunner.make_multi_agent_vec()."
            )

    def __enter__(self) -> MultiAgentVectorEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncMultiAgentVectorEnv(MultiAgentVectorEnv):
    """Every sub-env in this process, stepped in turn.

    Args:
        env_fns: zero-argument factories of PettingZoo envs, one per sub-env.
        policy_mapping_fn: ``agent_id -> policy_id`` (None: one shared policy per
            distinct pair of observation and action spaces).
        restart_policy: failed sub-envs are recreated as it says, and their step yields
            no transition (``MultiAgentStep.failed``); None (default): failures raise.
    """

    def __init__(
        self,
        env_fns: Sequence[MultiAgentEnvFactory],
        policy_mapping_fn: PolicyMappingFn | None = None,
        *,
        restart_policy: RestartPolicy | None = None,
    ) -> None:
        super().__init__()
        if len(env_fns) == 0:
            raise InvalidArgumentError("make_multi_agent_vec: num_envs must be >= 1, got 0.")
        self.restart_policy = restart_policy
        envs = build_envs(env_fns, 0)
        try:
            self.groups = env_groups(envs[0], policy_mapping_fn)
            self._block = SubEnvBlock(envs, self.groups, fns=env_fns, restart_policy=restart_policy)
        except BaseException:
            for env in envs:
                close_quietly(env)
            self._closed = True
            raise
        self.num_envs = len(envs)
        self.turn_based = self._block.turn_based

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> MultiAgentStep:
        self._check_open("reset_batch")
        return self._block.result(self._block.reset(seeds, options))

    def step_batch(self, actions: Sequence[Any]) -> MultiAgentStep:
        self._check_open("step_batch")
        return self._block.step(self._block.check_actions(actions))

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        self._check_open("reset_at")
        self._check_index(index)
        return self._block.reset_at(index, seed, options)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        self._check_open("call")
        return tuple(self._block.call(name, args, kwargs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        self._check_open("get_attr")
        return tuple(self._block.get_attr(name))

    def set_attr(self, name: str, values: Any) -> None:
        self._check_open("set_attr")
        self._block.set_attr(name, self._values_per_env(name, values))

    def render(self) -> tuple[Any, ...]:
        self._check_open("render")
        return tuple(self._block.render())

    def get_num_restarts(self) -> int:
        self._check_open("get_num_restarts")
        return self._block.num_restarts

    def get_sub_environments(self) -> list[Any]:
        """The sub-envs themselves (this process holds them)."""
        return list(self._block.envs)

    def _close_backend(self) -> None:
        self._block.close()


__all__ = ["MultiAgentVectorEnv", "SyncMultiAgentVectorEnv"]
