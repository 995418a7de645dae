"""The loops a user writes by hand, jaxrunner's speed references: CleanRL's recording
loop around a vector env, and gymnax's ``lax.scan``. See docs/design.md."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import gymnasium
import jax
import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.arg_checks import check_int
from jaxrunner._src.backends.jax_env import JaxVectorEnv
from jaxrunner._src.bench.workloads import get_workload
from jaxrunner._src.core.policy import Policy
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.models import mlp_policy

REFERENCES: dict[str, str] = {
    "sync": "gymnasium SyncVectorEnv",
    "async": "gymnasium AsyncVectorEnv",
    "native": "gymnasium native vector env",
    "envpool": "EnvPool, sync mode",
    "scan": "gymnax lax.scan",
    "pettingzoo": "a list of PettingZoo parallel envs, stepped one by one",
}
"""Each hand loop of ``jaxrunner bench``, by what it drives (the peer libraries' loops
are in ``benchmarks/peer_loops.py``)."""


def hand_act(policy: Policy, num_envs: int) -> Callable[[Any, Any, jax.Array], Any]:
    """The jitted policy step a user would write, one key split per step:
    ``(params, obs, key) -> (action, extras, key)``."""

    @jax.jit
    def act(params: Any, obs: Any, key: jax.Array) -> tuple[Any, Any, jax.Array]:
        key, sub = jax.random.split(key)
        action, extras, _ = policy.apply_fn(params, obs, None, jax.random.split(sub, num_envs))
        return action, extras, key

    return act


def single_spaces(envs: Any) -> tuple[gymnasium.Space, gymnasium.Space]:
    """A vector env's single observation and action spaces (EnvPool's have no
    ``single_`` prefix)."""
    obs = getattr(envs, "single_observation_space", None) or envs.observation_space
    action = getattr(envs, "single_action_space", None) or envs.action_space
    return obs, action


def recording_buffers(
    obs_space: gymnasium.Space, action_space: gymnasium.Space, shape: tuple[int, ...]
) -> tuple[Any, ...]:
    """Zeroed obs, action, log_prob, reward, terminated and truncated buffers of
    ``shape`` (CleanRL's)."""
    return (
        space_arrays.allocate(obs_space, shape),
        space_arrays.allocate(action_space, shape),
        np.zeros(shape, np.float32),
        np.zeros(shape, np.float32),
        np.zeros(shape, np.bool_),
        np.zeros(shape, np.bool_),
    )


class RecordingHandLoop:
    """CleanRL's collection loop around a vector env and the benchmark MLP: each
    :meth:`rollout` overwrites ``obs`` (acted on), ``action``, ``log_prob``, ``reward``,
    ``terminated`` and ``truncated``, step ``t`` of env ``b`` at ``[t, b]``."""

    def __init__(
        self,
        envs: Any,
        rollout_length: int,
        seed: int,
        *,
        seeded_reset: bool = True,
        policy: Policy | None = None,
        next_step_reset: bool = False,
    ) -> None:
        """``seeded_reset``: False for envs seeded when built (EnvPool). ``next_step_reset``:
        the envs reset on the step after an episode's end (EnvPool, PufferLib), a step
        :meth:`rollout` leaves out of its count. ``policy`` None: the benchmark MLP."""
        check_int("RecordingHandLoop", "rollout_length", rollout_length)
        obs_space, action_space = single_spaces(envs)
        self.envs, self.num_envs, self.rollout_length = envs, int(envs.num_envs), rollout_length
        self.policy = mlp_policy(action_space) if policy is None else policy
        # A user clips Box actions for the env (the runner does too), and records them
        # as sampled.
        self._clip = None
        if isinstance(action_space, gymnasium.spaces.Box):
            self._clip = (action_space.low, action_space.high)
        self._ended = np.zeros(self.num_envs, np.bool_) if next_step_reset else None
        self.params = self.policy.init(jax.random.key(seed), obs_space)
        self._act = hand_act(self.policy, self.num_envs)
        shape = (rollout_length, self.num_envs)
        self.obs, self.action, self.log_prob, self.reward, self.terminated, self.truncated = (
            recording_buffers(obs_space, action_space, shape)
        )
        self._next_obs, _ = envs.reset(seed=seed) if seeded_reset else envs.reset()
        self._key = jax.random.key(seed)

    def rollout(self) -> int:
        """Steps the envs ``rollout_length`` times, recording; returns env steps done."""
        envs, act, params, clip = self.envs, self._act, self.params, self._clip
        next_obs, key, ended = self._next_obs, self._key, self._ended
        resets = 0
        for t in range(self.rollout_length):
            self.obs[t] = next_obs
            action, extras, key = act(params, next_obs, key)
            action, log_prob = np.asarray(action), np.asarray(extras["log_prob"])
            self.action[t] = action
            self.log_prob[t] = log_prob
            if clip is not None:
                action = np.clip(action, *clip)
            next_obs, reward, terminated, truncated, _ = envs.step(action)
            self.reward[t] = reward
            self.terminated[t] = terminated
            self.truncated[t] = truncated
            if ended is not None:  # this step reset the envs that had ended
                resets += int(np.count_nonzero(ended))
                ended = self.terminated[t] | self.truncated[t]
        self._next_obs, self._key, self._ended = next_obs, key, ended
        return self.rollout_length * self.num_envs - resets


def env_makers(env: str, workload: str | None) -> tuple[Callable[[], Any], str, dict[str, Any]]:
    """A factory of one sub-env (the workload's, else ``gymnasium.make(env)``), and
    EnvPool's id and options for the same env."""
    if workload is None:
        return functools.partial(gymnasium.make, env), env, {}
    spec = get_workload(workload)
    return spec.make, spec.envpool_id, spec.envpool_kwargs


def reference_envs(
    reference: str, env: str, num_envs: int, seed: int, workload: str | None = None
) -> tuple[Any, bool]:
    """The vector env a user drives by hand for ``reference`` (``"sync"``, ``"async"``,
    ``"native"`` or ``"envpool"``), and whether its reset takes a seed."""
    same_step = gymnasium.vector.AutoresetMode.SAME_STEP
    make, envpool_id, envpool_kwargs = env_makers(env, workload)
    if reference == "sync":
        return gymnasium.vector.SyncVectorEnv([make] * num_envs, autoreset_mode=same_step), True
    if reference == "async":
        # forkserver, not fork: forking a process whose JAX threads run can deadlock.
        envs = gymnasium.vector.AsyncVectorEnv(
            [make] * num_envs, autoreset_mode=same_step, context="forkserver"
        )
        return envs, True
    if reference == "native":
        return gymnasium.make_vec(env, num_envs, vectorization_mode="vector_entry_point"), True
    if reference == "envpool":
        import envpool  # type: ignore[import-not-found]  # an optional extra

        # batch_size == num_envs: every step waits for every env (sync mode).
        envs = envpool.make_gymnasium(
            envpool_id, num_envs=num_envs, batch_size=num_envs, seed=seed, **envpool_kwargs
        )
        return envs, False
    raise InvalidArgumentError(
        f"reference_envs(reference={reference!r}): expected one of ['sync', 'async', 'native', "
        "'envpool'] (a peer library's loop is built by benchmarks/peer_child.py)."
    )


def build_hand_scan(
    num_envs: int, rollout_length: int, seed: int, env_id: str = "CartPole-v1"
) -> Callable[[], int]:
    """A gymnax user's loop: one jitted ``lax.scan`` over ``vmap(env.step)`` with the
    benchmark MLP, recording obs, action, reward, flags, the final observation and the
    log-prob on device. Returns ``rollout() -> env steps done`` (waiting for the scan)."""
    import gymnax  # type: ignore[import-not-found]  # an optional extra

    env, env_params = gymnax.make(env_id)
    spaces = JaxVectorEnv(env, env_params, 1)
    policy = mlp_policy(spaces.single_action_space)
    params = policy.init(jax.random.key(seed), spaces.single_observation_space)
    step_envs = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def rollout(params: Any, carry: Any) -> tuple[Any, Any]:
        def step(carry: Any, _: None) -> tuple[Any, Any]:
            obs, state, key = carry
            key, act_key, env_key = jax.random.split(key, 3)
            action, extras, _ = policy.apply_fn(
                params, obs, None, jax.random.split(act_key, num_envs)
            )
            next_obs, state, reward, terminated, truncated, info = step_envs(
                jax.random.split(env_key, num_envs), state, action, env_params
            )
            final_obs = info["final_observation"]
            transition = (obs, action, reward, terminated, truncated, final_obs, extras["log_prob"])
            return (next_obs, state, key), transition

        return jax.lax.scan(step, carry, None, rollout_length)

    key, reset_key = jax.random.split(jax.random.key(seed))
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(reset_key, num_envs), env_params
    )
    carry = (obs, state, key)
    compiled = jax.jit(rollout, donate_argnums=1)

    def run() -> int:
        nonlocal carry
        carry, traj = compiled(params, carry)
        jax.block_until_ready(traj)
        return rollout_length * num_envs

    return run
