""":class:`JaxVectorEnv`: pure-JAX envs (gymnax, functional, brax or JaxMARL style) batched
with vmap, sampled in one ``lax.scan``. See docs/backends/jax.md."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space

from jaxrunner._src import space_arrays
from jaxrunner._src.arg_checks import check_bool, check_int, check_space
from jaxrunner._src.backends.functional_env import (
    EnvStep,
    FunctionalEnv,
    brax_functions,
    brax_spaces,
    check_brax_wrappers,
    functions_of,
    to_gymnasium_space,
)
from jaxrunner._src.core.agent_groups import (
    AgentGroup,
    GroupedAgents,
    PolicyMappingFn,
    build_groups,
)
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError, SpaceMismatchError


class JaxVectorEnv(GroupedAgents):
    """``num_envs`` copies of a pure-JAX env, one agent or JaxMARL-style (``agents``,
    ``reset(key)``, ``step_env(key, state, actions)`` with ``dones["__all__"]``), for
    :class:`~jaxrunner.EnvRunner`.

    A one-agent env is one group (policy id ``"default_policy"``) of one agent
    (``"agent_0"``); an ``EnvRunner`` sees it without an agent axis.

    Args:
        env: a gymnax environment, a functional env (see docs/backends/jax.md) or a
            JaxMARL-style env (it has ``agents``). For brax-style envs use
            :meth:`from_brax`.
        env_params: one agent: the params passed to every ``reset``/``step`` call
            (``None``: the env's ``default_params`` if it has them).
        num_envs: B, the number of envs stepped in lockstep.
        observation_space: one agent: a single env's observation space (gymnasium).
            Default: converted from ``env.observation_space(env_params)``.
        action_space: one agent: a single env's action space (gymnasium). Default:
            converted from ``env.action_space(env_params)``.
        policy_mapping_fn: JaxMARL: ``agent_id -> policy_id`` (None: one shared policy
            per distinct pair of spaces).
        dones_are_truncations: JaxMARL: report ``dones`` as ``truncated`` (time limits, as
            in MPE, whose episodes only end at ``max_steps``) instead of ``terminated``.

    Raises:
        SpaceMismatchError: ``reset`` returns observations that differ in structure,
            shape or dtype from the observation space (checked by tracing, no compute).
    """

    multi_agent = False
    """The kind of env (see ``BaseVectorEnv.multi_agent``), set per instance: True for a
    JaxMARL-style env (agents in policy groups), False for one agent."""
    turn_based = False

    def __init__(
        self,
        env: Any,
        env_params: Any = None,
        num_envs: int = 1,
        *,
        observation_space: spaces.Space | None = None,
        action_space: spaces.Space | None = None,
        functions: FunctionalEnv | None = None,
        policy_mapping_fn: PolicyMappingFn | None = None,
        dones_are_truncations: bool = False,
    ) -> None:
        num_envs = check_int("JaxVectorEnv", "num_envs", num_envs)
        if isinstance(env, type):
            raise InvalidArgumentTypeError(
                f"JaxVectorEnv(env=...): got the class {env.__name__}; pass an instance, "
                f"e.g. {env.__name__}()."
            )
        if functions is None and hasattr(env, "agents"):
            given = {"env_params": env_params, "observation_space": observation_space}
            for name, value in {**given, "action_space": action_space}.items():
                if value is not None:
                    raise InvalidArgumentError(
                        f"JaxVectorEnv({name}=...): {type(env).__name__} is a JaxMARL-style "
                        f"env (it has agents), which takes no {name}; its spaces come from "
                        "env.observation_space(agent) and env.action_space(agent). Leave "
                        f"{name}=None"
                        + (" (and num_envs= by keyword)." if name == "env_params" else ".")
                    )
            self._init_agents(
                "JaxVectorEnv", env, num_envs, policy_mapping_fn, dones_are_truncations
            )
            return
        for name, value in (
            ("policy_mapping_fn", policy_mapping_fn is not None),
            ("dones_are_truncations", dones_are_truncations is not False),
        ):
            if value:
                raise InvalidArgumentError(
                    f"JaxVectorEnv({name}=...): {type(env).__name__} is a one-agent env "
                    f"(it has no agents), which takes no {name}; it applies to JaxMARL-style "
                    f"envs only. Leave {name} at its default."
                )
        if isinstance(env_params, int) and not isinstance(env_params, bool):
            raise InvalidArgumentError(
                f"JaxVectorEnv(env_params={env_params}): expected the env's params (None: its "
                "default_params), got an int. env_params is the second argument: pass "
                f"num_envs by keyword (num_envs={env_params})."
            )
        if functions is None:
            functions = functions_of(env)
        if env_params is None:
            env_params = getattr(env, "default_params", None)
        self.env = env
        self.functions: FunctionalEnv | None = functions
        """One env's pure functions (None for a JaxMARL-style env: its own methods)."""
        self.params = env_params
        self.num_envs = num_envs
        self.single_observation_space = self._space(
            observation_space, env, "observation_space", env_params
        )
        self.single_action_space = self._space(action_space, env, "action_space", env_params)
        for name, space in (
            ("observation_space", self.single_observation_space),
            ("action_space", self.single_action_space),
        ):
            space_arrays.check_supported(space, f"JaxVectorEnv {name}")
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.dones_are_truncations = False
        self.groups: tuple[AgentGroup, ...] = (
            AgentGroup.one_agent(self.single_observation_space, self.single_action_space),
        )
        obs = jax.eval_shape(functions.reset, jax.random.key(0), self.params)[0]
        self._check_reset_obs(obs, self.single_observation_space)

    def _init_agents(
        self,
        where: str,
        env: Any,
        num_envs: int,
        policy_mapping_fn: PolicyMappingFn | None,
        dones_are_truncations: bool,
    ) -> None:
        """The JaxMARL-style env's part of ``__init__``: its groups from its agents."""
        for name in ("agents", "reset", "step_env", "observation_space", "action_space"):
            if not hasattr(env, name):
                raise InvalidArgumentTypeError(
                    f"{where}(env=...): {type(env).__name__} has no {name!r}; "
                    "expected a JaxMARL-style env (agents, reset, step_env, observation_space, "
                    "action_space)."
                )
        self.multi_agent = True
        self.env, self.functions, self.params, self.num_envs = env, None, None, num_envs
        self.groups = build_groups(
            list(env.agents),
            lambda a: to_gymnasium_space(
                env.observation_space(a), f"observation_space({a!r})", "JaxVectorEnv"
            ),
            lambda a: to_gymnasium_space(
                env.action_space(a), f"action_space({a!r})", "JaxVectorEnv"
            ),
            policy_mapping_fn,
        )
        obs = jax.eval_shape(env.reset, jax.random.key(0))[0]
        for g in self.groups:
            for agent in g.agents:
                if not isinstance(obs, Mapping) or agent not in obs:
                    got = sorted(obs, key=str) if isinstance(obs, Mapping) else type(obs).__name__
                    raise SpaceMismatchError(
                        f"{where}: {type(env).__name__}'s reset returns observations without "
                        f"agent {agent!r} (got {got}); expected a dict by agent id with every "
                        f"one of env.agents {list(env.agents)}."
                    )
                self._check_reset_obs(obs[agent], g.observation_space, agent)
        self.dones_are_truncations = check_bool(
            where, "dones_are_truncations", dones_are_truncations
        )

    @classmethod
    def from_brax(
        cls,
        env: Any,
        num_envs: int,
        *,
        observation_space: spaces.Space | None = None,
        action_space: spaces.Space | None = None,
    ) -> JaxVectorEnv:
        """Adapts a brax-style env (``reset(rng) -> State``, ``step(state, action) ->
        State``; an unbatched env without ``AutoResetWrapper``).

        Default spaces: observations ``Box(-inf, inf)`` of the shape and dtype ``reset``
        returns; actions ``Box(-1, 1, (env.action_size,), float32)`` (brax's convention).
        """
        check_int("JaxVectorEnv.from_brax", "num_envs", num_envs)  # before env is traced
        check_brax_wrappers(env)
        functions = brax_functions(env)
        observation_space, action_space = brax_spaces(
            env, functions, observation_space, action_space
        )
        return cls(
            env,
            None,
            num_envs,
            observation_space=observation_space,
            action_space=action_space,
            functions=functions,
        )

    def reset(self, keys: jax.Array, params: Any) -> tuple[Any, Any]:
        """Resets B envs, env ``i`` with ``keys[i]``: ``(obs [B, ...], state [B, ...])``
        (JaxMARL: ``obs`` a dict by agent, ``params`` unused)."""
        if self.functions is None:
            return jax.vmap(self.env.reset)(keys)
        return jax.vmap(self.functions.reset, in_axes=(0, None))(keys, params)

    def step(self, keys: jax.Array, state: Any, action: Any, params: Any) -> EnvStep:
        """Steps B one-agent envs (no reset): an :class:`EnvStep` of ``[B, ...]`` arrays."""
        assert self.functions is not None, "a JaxMARL-style env steps with step_agents"
        return jax.vmap(self.functions.step, in_axes=(0, 0, 0, None))(keys, state, action, params)

    def step_agents(self, keys: jax.Array, state: Any, actions: dict[str, Any]) -> tuple:
        """Steps B JaxMARL-style envs (no reset): ``(obs, state, rewards, dones, infos)``,
        dicts by agent id of ``[B, ...]`` arrays (``dones["__all__"]``: the env's)."""
        return jax.vmap(self.env.step_env)(keys, state, actions)

    def close(self) -> None:
        """Nothing to release (kept for the vector-env interface)."""

    def get_sub_environments(self) -> list[Any]:
        """Refused: the envs are one env's pure functions vmapped over a batch of states,
        with no per-env Python object."""
        raise InvalidArgumentError(
            f"{type(self).__name__}.get_sub_environments(): a pure-JAX vector env has no "
            "per-env objects (one env's functions are vmapped over a batch of states held "
            "by the runner's compiled scan; .env is the one env object, shared by all). For "
            "per-sub-env access use a gymnasium env with make_vec(..., backend='sync'), or a "
            "PettingZoo env with make_vec(..., backend='sync')."
        )

    def __enter__(self) -> JaxVectorEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.env).__name__}, num_envs={self.num_envs})"

    @staticmethod
    def _space(given: spaces.Space | None, env: Any, name: str, params: Any) -> spaces.Space:
        if given is not None:
            return check_space("JaxVectorEnv", name, given)
        method = getattr(env, name, None)
        if not callable(method):
            raise InvalidArgumentError(
                f"JaxVectorEnv: {type(env).__name__} has no {name}(params) method; pass "
                f"{name}= (a gymnasium space for one env)."
            )
        try:
            space = method(params)
        except (AttributeError, KeyError, TypeError) as err:  # params of another env
            raise InvalidArgumentError(
                f"JaxVectorEnv: {type(env).__name__}.{name}(env_params) failed "
                f"({type(err).__name__}: {err}); pass this env's params "
                "(env.default_params, or env_params=None for them)."
            ) from err
        return to_gymnasium_space(space, name, "JaxVectorEnv")

    def _check_reset_obs(self, obs: Any, space: spaces.Space, agent: str | None = None) -> None:
        """Invariant 6: the env's observations (``obs``: what ``reset`` returns, shapes
        and dtypes; a JaxMARL-style env's ``agent``'s) have the space's structure, shapes
        and dtypes (dtypes as JAX stores them: float64 spaces are float32 without x64)."""
        expected = space_arrays.allocate(space, ())
        name = type(self.env).__name__
        of_agent = "" if agent is None else f" for agent {agent!r}"
        fix = (
            "Pass a matching observation_space=, or make the env return what its space declares."
            if agent is None
            else f"Make the env return what its observation_space({agent!r}) declares."
        )

        def check(exp: np.ndarray, got: Any) -> None:
            want = jax.dtypes.canonicalize_dtype(exp.dtype)
            if tuple(got.shape) != exp.shape or np.dtype(got.dtype) != want:
                raise space_arrays.mismatch(
                    f"JaxVectorEnv: {name}'s reset returns observations{of_agent}",
                    f"dtype {want} and shape {exp.shape} (the observation space {space})",
                    got,
                    fix,
                )

        try:
            space_arrays.map_structure(space, check, expected, obs)
        except (KeyError, IndexError, TypeError, AttributeError) as err:
            raise SpaceMismatchError(
                f"JaxVectorEnv: the structure of {name}'s observations{of_agent} "
                f"({jax.tree.structure(obs)}) does not match the observation space {space}."
            ) from err


class JaxMultiAgentVectorEnv(JaxVectorEnv):
    """:class:`JaxVectorEnv` of a JaxMARL-style env, built with the multi-agent argument
    order (``env, num_envs``; see :class:`JaxVectorEnv` for the keywords). The env must
    have ``agents``."""

    def __init__(
        self,
        env: Any,
        num_envs: int,
        *,
        policy_mapping_fn: PolicyMappingFn | None = None,
        dones_are_truncations: bool = False,
    ) -> None:
        where = "JaxMultiAgentVectorEnv"
        num_envs = check_int(where, "num_envs", num_envs)
        self._init_agents(where, env, num_envs, policy_mapping_fn, dones_are_truncations)
