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

from jaxrunner.errors import ClosedError, InvalidArgumentError
from jaxrunner.multi_agent.buffers import MultiAgentStep
from jaxrunner.multi_agent.groups import GroupedAgents, PolicyMappingFn
from jaxrunner.multi_agent.sub_envs import MultiAgentEnvFactory, SubEnvBlock, env_groups


class MultiAgentVectorEnv(GroupedAgents, abc.ABC):
    """Base of the multi-agent backends (see the module docstring)."""

    num_envs: int
    turn_based: bool
    """AEC sub-envs: one agent acts per step."""

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
    """

    def __init__(
        self,
        env_fns: Sequence[MultiAgentEnvFactory],
        policy_mapping_fn: PolicyMappingFn | None = None,
    ) -> None:
        super().__init__()
        if len(env_fns) == 0:
            raise InvalidArgumentError("make_multi_agent_vec: num_envs must be >= 1, got 0.")
        envs: list[Any] = []
        try:
            for fn in env_fns:
                envs.append(fn())
            self.groups = env_groups(envs[0], policy_mapping_fn)
            self._block = SubEnvBlock(envs, self.groups)
        except BaseException:
            for env in envs:
                env.close()
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

    def get_sub_environments(self) -> list[Any]:
        return list(self._block.envs)

    def _close_backend(self) -> None:
        self._block.close()


__all__ = ["MultiAgentVectorEnv", "SyncMultiAgentVectorEnv"]
