"""The peer libraries driven as their docs show: PufferLib's ``Serial`` and
``Multiprocessing`` (stepped by ``jaxrunner bench``'s ``RecordingHandLoop`` like any
gymnasium-style vector env) and EnvPool's async mode (:class:`EnvPoolAsyncLoop`: its
``send``/``recv`` loop), each running the workload's jitted policy and recording
``[T, B]`` numpy buffers as the recording hand loop does (their envs reset an ended
episode on the step after: no transition, left out of the steps counted); and RLlib's
own sampler, :class:`RLlibLoop` (its torch MLP of the same widths: RLlib runs no Flax
policy). ``peer_child.py`` builds them in the peers' venv for ``peers.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import gymnasium
import jax
import numpy as np

from jaxrunner._src.bench.hand_loop import hand_act, recording_buffers, single_spaces
from jaxrunner._src.core.policy import Policy

PEER_REFERENCES: dict[str, str] = {
    "envpool_async": "EnvPool, async mode (batch_size = num_envs // 2)",
    "puffer_serial": "PufferLib Serial",
    "puffer_mp": "PufferLib Multiprocessing",
    "rllib": "RLlib SingleAgentEnvRunner",
}
"""Each peer library's loop and what it is."""


def peer_labels() -> dict[str, str]:
    """A report's labels of the peers' systems (``measure_width``'s ``labels``): a loop
    driven by hand as ``hand_<reference>``; RLlib, a sampler of its own, under its name,
    as ``hand_rllib`` in a child and ``rllib`` in this process."""
    labels = {f"hand_{key}": f"hand loop: {name}" for key, name in PEER_REFERENCES.items()}
    labels["hand_rllib"] = labels["rllib"] = PEER_REFERENCES["rllib"]
    return labels


def available_cores() -> int:
    """Physical cores as PufferLib counts them (its limit on workers by default)."""
    import psutil

    return int(psutil.cpu_count(logical=False) or 1)


def puffer_envs(
    reference: str, make: Callable[[], Any], num_envs: int, seed: int, pettingzoo: bool = False
) -> Any:
    """PufferLib's vectorization of gymnasium envs: each env in ``GymnasiumPufferEnv``
    (``pettingzoo``: a PettingZoo parallel env in ``PettingZooPufferEnv``, its agents as
    rows);
    ``"puffer_serial"``: ``Serial`` steps them in this process; ``"puffer_mp"``:
    ``Multiprocessing`` with a worker per physical core but one (PufferLib refuses more
    than one per core by default; its workers and its ``recv`` spin while they wait,
    so the one left is the main process's, whose policy runs there: jaxrunner's process
    backend leaves it too), at least one, ``num_envs`` split evenly among them; every
    step waits for every env (``batch_size = num_envs``)."""
    import pufferlib.emulation  # type: ignore[import-not-found]  # the peers venv only
    import pufferlib.vector  # type: ignore[import-not-found]  # the peers venv only

    emulation = pufferlib.emulation
    wrapper = emulation.PettingZooPufferEnv if pettingzoo else emulation.GymnasiumPufferEnv
    creator = functools.partial(wrapper, env_creator=make)
    if reference == "puffer_serial":
        return pufferlib.vector.make(
            creator, backend=pufferlib.vector.Serial, num_envs=num_envs, seed=seed
        )
    most = max(1, min(available_cores() - 1, num_envs))
    workers = max(w for w in range(1, most + 1) if num_envs % w == 0)
    return pufferlib.vector.make(
        creator,
        backend=pufferlib.vector.Multiprocessing,
        num_envs=num_envs,
        num_workers=workers,
        batch_size=num_envs,
        seed=seed,
    )


class EnvPoolAsyncLoop:
    """EnvPool's async mode by hand (CleanRL's ``ppo_atari_envpool_async``): ``num_envs``
    envs, ``recv()`` hands back the first ``batch_size = num_envs // 2`` ready ones
    (all of them for one env), the policy acts on those and ``send(action, env_id)``
    steps them while the others run. Each :meth:`rollout` is ``rollout_length``
    recv/send rounds, recorded into ``[T, batch_size]`` buffers (with ``env_id``).

    Args:
        envpool_id, envpool_kwargs: the EnvPool task and its options.
        num_envs: envs in the pool.
        rollout_length: T.
        seed: seeds the envs, the policy's params and its action keys.
        make_policy: ``(observation space, action space) -> Policy``.
        meanwhile: called as ``meanwhile(obs, t)`` after each policy call is dispatched
            and before its result is read (work that JAX's asynchronous dispatch lets the
            loop do while the policy computes), or None.
    """

    def __init__(
        self,
        envpool_id: str,
        envpool_kwargs: dict[str, Any],
        num_envs: int,
        rollout_length: int,
        seed: int,
        make_policy: Callable[[gymnasium.Space, gymnasium.Space], Policy],
        meanwhile: Callable[[Any, int], None] | None = None,
    ) -> None:
        import envpool  # type: ignore[import-not-found]  # an optional extra

        self.batch_size = batch = max(1, num_envs // 2)
        self.envs = envs = envpool.make_gymnasium(
            envpool_id, num_envs=num_envs, batch_size=batch, seed=seed, **envpool_kwargs
        )
        obs_space, action_space = single_spaces(envs)
        policy = make_policy(obs_space, action_space)
        self.params = policy.init(jax.random.key(seed), obs_space)
        self._act = hand_act(policy, batch)
        self._key = jax.random.key(seed)
        self._clip = None
        if isinstance(action_space, gymnasium.spaces.Box):
            self._clip = (action_space.low, action_space.high)
        self.rollout_length, self._meanwhile = rollout_length, meanwhile
        shape = (rollout_length, batch)
        self.obs, self.action, self.log_prob, self.reward, self.terminated, self.truncated = (
            recording_buffers(obs_space, action_space, shape)
        )
        self.env_id = np.zeros(shape, np.int32)
        envs.async_reset()

    def rollout(self) -> int:
        """``rollout_length`` recv/send rounds; returns the transitions received (a
        recv of a reset, the pool's first or after an episode ended, is none)."""
        envs, act, params, clip, key = self.envs, self._act, self.params, self._clip, self._key
        transitions = 0
        for t in range(self.rollout_length):
            obs, reward, terminated, truncated, info = envs.recv()
            env_id = info["env_id"]
            transitions += int(np.count_nonzero(info["elapsed_step"]))
            self.obs[t] = obs
            self.reward[t] = reward
            self.terminated[t] = terminated
            self.truncated[t] = truncated
            self.env_id[t] = env_id
            action, extras, key = act(params, obs, key)
            if self._meanwhile is not None:
                self._meanwhile(obs, t)
            action, log_prob = np.asarray(action), np.asarray(extras["log_prob"])
            self.action[t] = action
            self.log_prob[t] = log_prob
            envs.send(action if clip is None else np.clip(action, *clip), env_id)
        self._key = key
        return transitions

    def close(self) -> None:
        self.envs.close()


RLLIB_HIDDEN: dict[str, tuple[int, ...]] = {"cartpole": (64, 64), "halfcheetah": (256, 256)}
"""RLlib's MLP per workload, as ours (it has no NatureCNN of the same layers: no Pong)."""


class RLlibLoop:
    """RLlib's ``SingleAgentEnvRunner`` (new API stack): its own gymnasium
    SyncVectorEnv of ``num_envs`` sub-envs (``env`` a gymnasium id), its default
    RLModule (a tanh MLP of ``hidden``, torch), exploring; one :meth:`rollout` is
    ``sample(num_timesteps=rollout_length * num_envs)``."""

    def __init__(
        self,
        env: str,
        num_envs: int,
        rollout_length: int,
        seed: int,
        hidden: tuple[int, ...] = (64, 64),
    ) -> None:
        from ray.rllib.algorithms.ppo import PPOConfig
        from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
        from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

        self._length, self._width = rollout_length, num_envs
        config = (
            PPOConfig()
            .environment(env)
            .env_runners(
                num_env_runners=0,
                num_envs_per_env_runner=num_envs,
                rollout_fragment_length=rollout_length,
            )
            .rl_module(
                model_config=DefaultModelConfig(fcnet_hiddens=list(hidden), fcnet_activation="tanh")
            )
            .debugging(seed=seed)
        )
        self._runner = SingleAgentEnvRunner(config=config)

    def rollout(self) -> int:
        episodes = self._runner.sample(num_timesteps=self._length * self._width, explore=True)
        return sum(len(episode) for episode in episodes)  # env steps actually taken

    def close(self) -> None:
        self._runner.stop()
