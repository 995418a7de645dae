"""Pure-JAX multi-agent envs in the JaxMARL style, batched for one jitted scan.
See docs/multi-agent.md."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from jaxrunner._src.arg_checks import check_int
from jaxrunner._src.core.agent_groups import (
    AgentGroup,
    GroupedAgents,
    PolicyMappingFn,
    build_groups,
)
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError


def to_gymnasium_space(space: Any) -> spaces.Space:
    """A gymnasium space for a JaxMARL (or gymnax-like) ``Discrete`` or ``Box``."""
    if isinstance(space, spaces.Space):
        return space
    if hasattr(space, "n") and not hasattr(space, "low"):
        return spaces.Discrete(int(space.n))
    if hasattr(space, "low") and hasattr(space, "shape"):
        dtype = np.dtype(getattr(space, "dtype", np.float32))
        shape = tuple(space.shape)
        low = np.broadcast_to(np.asarray(space.low, dtype), shape)
        high = np.broadcast_to(np.asarray(space.high, dtype), shape)
        return spaces.Box(low, high, shape, dtype)
    raise InvalidArgumentTypeError(
        f"JaxMultiAgentVectorEnv: cannot convert the space {space!r} to a gymnasium space; "
        "expected a Discrete (with n) or a Box (with low, high, shape, dtype)."
    )


class JaxMultiAgentVectorEnv(GroupedAgents):
    """``num_envs`` copies of a pure-JAX multi-agent env (JaxMARL style: ``reset(key)``,
    ``step_env(key, state, actions)`` with ``dones["__all__"]``; the runner resets it),
    sampled by :class:`~jaxrunner.MultiAgentRunner` as one jitted ``lax.scan``.

    Args:
        env: the JaxMARL-style env (e.g. ``jaxmarl.make("MPE_simple_spread_v3")``).
        num_envs: B.
        policy_mapping_fn: ``agent_id -> policy_id`` (None: one shared policy per
            distinct pair of spaces).
        dones_are_truncations: report ``dones`` as ``truncated`` (time limits, as in
            MPE, whose episodes only end at ``max_steps``) instead of ``terminated``.
    """

    multi_agent = True
    """The kind of env (see ``BaseVectorEnv.multi_agent``): agents in policy groups."""
    turn_based = False

    def __init__(
        self,
        env: Any,
        num_envs: int,
        *,
        policy_mapping_fn: PolicyMappingFn | None = None,
        dones_are_truncations: bool = False,
    ) -> None:
        for name in ("agents", "reset", "step_env", "observation_space", "action_space"):
            if not hasattr(env, name):
                raise InvalidArgumentTypeError(
                    f"JaxMultiAgentVectorEnv(env=...): {type(env).__name__} has no {name!r}; "
                    "expected a JaxMARL-style env (agents, reset, step_env, observation_space, "
                    "action_space)."
                )
        num_envs = check_int("JaxMultiAgentVectorEnv", "num_envs", num_envs)
        self.env, self.num_envs = env, num_envs
        self.dones_are_truncations = bool(dones_are_truncations)
        self.groups: tuple[AgentGroup, ...] = build_groups(
            list(env.agents),
            lambda a: to_gymnasium_space(env.observation_space(a)),
            lambda a: to_gymnasium_space(env.action_space(a)),
            policy_mapping_fn,
        )

    def close(self) -> None:
        """Nothing to release (kept for the runner's ``stop``)."""

    def get_sub_environments(self) -> list[Any]:
        """Refused: the envs are one env's functions vmapped over a batch of states,
        with no per-env Python object."""
        raise InvalidArgumentError(
            "JaxMultiAgentVectorEnv.get_sub_environments(): a pure-JAX vector env has no "
            "per-env objects (one env's functions are vmapped over a batch of states held "
            "by the runner's compiled scan; .env is the one env object, shared by all). For "
            "per-sub-env access use a PettingZoo env with make_vec(..., "
            "backend='sync')."
        )
