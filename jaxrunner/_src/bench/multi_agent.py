"""``jaxrunner bench`` on a PettingZoo parallel env (``module:name``), and the
multi-agent loop a user writes by hand."""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from gymnasium import spaces

from jaxrunner._src.arg_checks import check_int
from jaxrunner._src.bench.hand_loop import hand_act, recording_buffers
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.models import mlp_policy


def parallel_env_module(env: str) -> str | None:
    """``"mpe2.simple_spread_v3"`` for ``"mpe2:simple_spread_v3"``, or None for a
    gymnasium id (whose ``module:EnvId`` form names no submodule)."""
    package, sep, name = env.partition(":")
    if not sep or not package or not name.isidentifier():
        return None
    try:
        found = importlib.util.find_spec(f"{package}.{name}")
    except ImportError:  # the package is not installed: not ours to name
        return None
    return None if found is None else found.name


def make_parallel_env(module: str) -> Any:
    make = getattr(importlib.import_module(module), "parallel_env", None)
    if not callable(make):
        raise InvalidArgumentError(
            f"jaxrunner bench --env: {module} has no parallel_env(); the multi-agent bench "
            "measures PettingZoo parallel envs (e.g. mpe2:simple_spread_v3)."
        )
    return make()


def env_factory(env: str) -> Callable[[], Any]:
    """A picklable factory of the PettingZoo env ``env`` (``module:name``)."""
    module = parallel_env_module(env)
    if module is None:
        raise InvalidArgumentError(
            f"env={env!r}: expected a PettingZoo env as module:name, e.g. "
            "mpe2:simple_spread_v3 (the module mpe2.simple_spread_v3 must be installed)."
        )
    return functools.partial(make_parallel_env, module)


def describe(env: str) -> dict[str, Any]:
    instance = env_factory(env)()
    try:
        return {"module": parallel_env_module(env), "agents": list(instance.possible_agents)}
    finally:
        instance.close()


class MultiAgentHandLoop:
    """The loop a user writes by hand for ``num_envs`` PettingZoo parallel envs whose
    agents share their spaces and all act every step until the episode ends (as in
    MPE): each :meth:`rollout` overwrites ``obs``, ``action``, ``log_prob``, ``reward``,
    ``terminated`` and ``truncated``, agent ``agents[a]`` of env ``b`` at step ``t`` at
    ``[t, b, a]``. Env ``b`` is reset with ``seed + b``."""

    def __init__(
        self, env_fn: Callable[[], Any], num_envs: int, rollout_length: int, seed: int
    ) -> None:
        check_int("MultiAgentHandLoop", "num_envs", num_envs)
        check_int("MultiAgentHandLoop", "rollout_length", rollout_length)
        self.num_envs, self.rollout_length = num_envs, rollout_length
        self.envs: list[Any] = []
        try:  # the envs built before a failing one are closed too
            for _ in range(num_envs):
                self.envs.append(env_fn())
            self._build(seed)
        except BaseException:
            self.close()
            raise

    def _build(self, seed: int) -> None:
        first, num_envs, rollout_length = self.envs[0], self.num_envs, self.rollout_length
        self.agents = tuple(first.possible_agents)
        pairs = {a: (first.observation_space(a), first.action_space(a)) for a in self.agents}
        obs_space, action_space = pairs[self.agents[0]]
        for agent, pair in pairs.items():
            if pair != (obs_space, action_space):
                raise InvalidArgumentError(
                    f"MultiAgentHandLoop: agent {agent!r} has other spaces than "
                    f"{self.agents[0]!r}; the hand loop stacks agents that share one "
                    "observation and one action space."
                )
        self.policy = mlp_policy(action_space)
        self.params = self.policy.init(jax.random.key(seed), obs_space)
        self._act = hand_act(self.policy, num_envs * len(self.agents))
        self._discrete = isinstance(action_space, spaces.Discrete)
        self._obs_shape = obs_space.shape
        shape = (rollout_length, num_envs, len(self.agents))
        buffers = recording_buffers(obs_space, action_space, shape)
        self.obs, self.action, self.log_prob, _, self.terminated, self.truncated = buffers
        self.reward = np.zeros(shape, np.float64)  # MPE's rewards exactly
        self._next = [
            self._every_agent(b, env.reset(seed=seed + b)[0]) for b, env in enumerate(self.envs)
        ]
        self._key = jax.random.key(seed)

    def rollout(self) -> int:
        agents, envs, act, params = self.agents, self.envs, self._act, self.params
        num_agents, key = len(agents), self._key
        for t in range(self.rollout_length):
            obs = np.stack([np.stack([o[a] for a in agents]) for o in self._next])
            self.obs[t] = obs
            action, extras, key = act(params, obs.reshape(-1, *self._obs_shape), key)
            action = np.asarray(action).reshape(self.num_envs, num_agents, *self.action.shape[3:])
            self.action[t] = action
            log_prob = np.asarray(extras["log_prob"])
            self.log_prob[t] = log_prob.reshape(self.num_envs, num_agents)
            per_env = action.tolist() if self._discrete else action
            for b, env in enumerate(envs):
                o, r, term, trunc, _ = env.step(dict(zip(agents, per_env[b])))
                for k, a in enumerate(agents):
                    self.reward[t, b, k] = r[a]
                    self.terminated[t, b, k] = term[a]
                    self.truncated[t, b, k] = trunc[a]
                self._next[b] = self._every_agent(b, o if env.agents else env.reset()[0])
        self._key = key
        return self.rollout_length * self.num_envs

    def _every_agent(self, b: int, obs: dict[str, Any]) -> dict[str, Any]:
        if len(obs) != len(self.agents):
            raise InvalidArgumentError(
                f"MultiAgentHandLoop: env {b} goes on with agents {sorted(obs)}, not all of "
                f"{list(self.agents)}; the hand loop stacks every agent every step (as MPE "
                "envs have them)."
            )
        return obs

    def close(self) -> None:
        for env in self.envs:
            env.close()
