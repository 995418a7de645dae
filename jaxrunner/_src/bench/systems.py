"""The systems a benchmark child builds and times: jaxrunner, the hand loops and the
policy-bound ceiling."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import gymnasium
import jax
import numpy as np

from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.jax_env import JaxVectorEnv
from jaxrunner._src.backends.make_vec import BACKENDS, make_vec
from jaxrunner._src.bench.hand_loop import (
    REFERENCES,
    RecordingHandLoop,
    build_hand_scan,
    env_makers,
    hand_act,
    reference_envs,
    single_spaces,
)
from jaxrunner._src.bench.multi_agent import MultiAgentHandLoop, env_factory
from jaxrunner._src.bench.timing import measure_runner, timed
from jaxrunner._src.bench.workloads import get_workload
from jaxrunner._src.core.policy import Policy
from jaxrunner._src.runner.env_runner import EnvRunner
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.models import mlp_policy

JAX_BACKEND = "jax"
"""The benchmark's name for pure-JAX envs: ``JaxVectorEnv`` over a gymnax env."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Spec:
    """One system at one width, as the parent sends it to a child (JSON): ``system``
    ``"jaxrunner"``, ``"hand"`` or ``"ceiling"``; ``backend`` a ``make_vec`` one or
    ``"jax"`` (gymnax in a ``JaxVectorEnv``); ``reference`` the hand loop's (a key of
    ``REFERENCES``, or a peer library's built by ``benchmarks/``); ``multi_agent``:
    ``env`` is a PettingZoo ``module:name``; ``workload``: every system's envs and policy
    come from it; ``env_kwargs``: more ``make_vec`` options for jaxrunner's envs;
    ``chunk_rows``, ``num_splits``: the runner's policy chunk and pipelining splits
    (None: its defaults)."""

    system: str
    backend: str
    env: str
    num_envs: int
    rollout_length: int
    seed: int = 0
    reference: str | None = None
    multi_agent: bool = False
    workload: str | None = None
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    chunk_rows: int | None = None
    num_splits: int | None = None

    def __post_init__(self) -> None:
        builders = MULTI_AGENT_BUILDERS if self.multi_agent else BUILDERS
        if self.system not in builders:
            raise InvalidArgumentError(
                f"Spec(system={self.system!r}, multi_agent={self.multi_agent}): expected "
                f"{list(builders)}."
            )
        if self.backend not in (*BACKENDS, JAX_BACKEND):
            raise InvalidArgumentError(
                f"Spec(backend={self.backend!r}): expected one of {(*BACKENDS, JAX_BACKEND)}."
            )
        if self.workload is not None:
            get_workload(self.workload, f"Spec(workload={self.workload!r})")
        if self.system == "hand" and not self.reference:
            raise InvalidArgumentError(
                f"Spec(reference={self.reference!r}): a hand system needs one, e.g. one of "
                f"{list(REFERENCES)}."
            )


def _make_envs(spec: Spec) -> Any:
    if spec.backend == JAX_BACKEND:
        import gymnax  # type: ignore[import-not-found]  # an optional extra

        env, env_params = gymnax.make(spec.env)
        return JaxVectorEnv(env, env_params, spec.num_envs)
    make, envpool_id, envpool_kwargs = env_makers(spec.env, spec.workload)
    if spec.backend == "envpool":  # EnvPool's port of the workload's env
        env, options = envpool_id, {**envpool_kwargs, **spec.env_kwargs}
    else:
        env, options = make if spec.workload else spec.env, spec.env_kwargs
    return make_vec(env, spec.num_envs, backend=spec.backend, seed=spec.seed, **options)


def spec_policy(spec: Spec, observation_space: Any, action_space: Any) -> Policy:
    if spec.workload:
        return get_workload(spec.workload).policy(observation_space, action_space)
    return mlp_policy(action_space)


class JaxrunnerSystem:
    """``EnvRunner.sample()`` with the spec's policy, every option at its default."""

    def __init__(self, spec: Spec) -> None:
        self._runner = self._build(spec)
        self.num_envs = spec.num_envs
        # EnvPool's reset steps come back as slots holding no transition: not counted.
        envs = self._runner.envs
        self._reset_steps = isinstance(envs, VectorEnv) and envs.capabilities.reset_steps
        self._sample()  # warm-up: compiles, first resets
        self.layout = {
            "num_workers": getattr(envs, "num_workers", 0),
            "num_splits": self._runner.num_splits,
        }
        if spec.backend == "auto":  # what EnvRunner.from_env chose, and why
            self.layout["auto"] = dataclasses.asdict(self._runner.envs.layout_choice)

    @staticmethod
    def _build(spec: Spec) -> EnvRunner:
        if spec.backend != "auto":
            envs = _make_envs(spec)
            policy = spec_policy(spec, envs.single_observation_space, envs.single_action_space)
            params = policy.init(jax.random.key(spec.seed), envs.single_observation_space)
            return EnvRunner(
                envs, policy, params, spec.rollout_length, spec.seed, **_runner_options(spec)
            )
        # As a user builds it: the spaces for the policy from one env made apart (closed
        # again), then EnvRunner.from_env, which tries the layouts with the policy.
        env = get_workload(spec.workload).user_env if spec.workload else spec.env
        probe = env() if callable(env) else gymnasium.make(env)
        try:
            obs_space, action_space = probe.observation_space, probe.action_space
        finally:
            probe.close()
        policy = spec_policy(spec, obs_space, action_space)
        params = policy.init(jax.random.key(spec.seed), obs_space)
        return EnvRunner.from_env(
            env, spec.num_envs, policy, params, spec.rollout_length, spec.seed, backend="auto"
        )

    def _sample(self) -> int:
        trajectory = self._runner.sample()
        jax.block_until_ready(trajectory.reward)  # pure-JAX samples stay on device
        if self._reset_steps:
            return int(np.count_nonzero(trajectory.valid))
        return int(np.size(trajectory.reward))

    def measure(self, seconds: float) -> dict[str, Any]:
        return {**measure_runner(self._runner, self._sample, self.num_envs, seconds), **self.layout}

    def close(self) -> None:
        self._runner.stop()


class MultiAgentRunnerSystem(JaxrunnerSystem):
    """``EnvRunner.sample()`` with the benchmark MLP per policy group, at its defaults."""

    @staticmethod
    def _build(spec: Spec) -> EnvRunner:
        factory, options = env_factory(spec.env), _runner_options(spec)
        if spec.backend == "auto":  # as a user builds it: the groups from one env apart
            with contextlib.closing(make_vec(factory, 1, "sync")) as probe:
                policies, params = _group_policies(probe.groups, spec.seed)
            return EnvRunner.from_env(
                factory, spec.num_envs, policies, params, spec.rollout_length, spec.seed, **options
            )
        envs = make_vec(factory, spec.num_envs, spec.backend)
        try:
            policies, params = _group_policies(envs.groups, spec.seed)
            return EnvRunner(envs, policies, params, spec.rollout_length, spec.seed, **options)
        except BaseException:
            envs.close()
            raise

    def _sample(self) -> int:
        return self._runner.sample().num_steps * self.num_envs


def _group_policies(groups: Any, seed: int) -> tuple[dict[str, Policy], dict[str, Any]]:
    """The benchmark MLP per agent group, and its params."""
    policies = {g.policy_id: mlp_policy(g.action_space) for g in groups}
    key = jax.random.key(seed)
    return policies, {
        g.policy_id: policies[g.policy_id].init(key, g.observation_space) for g in groups
    }


def _runner_options(spec: Spec) -> dict[str, Any]:
    return {"chunk_rows": spec.chunk_rows, "num_splits": spec.num_splits}


def build_runner(spec: Spec) -> EnvRunner:
    """The runner of a ``"jaxrunner"`` spec, not warmed up (a benchmark that times the
    runner's own options, e.g. ``num_splits``)."""
    return (MultiAgentRunnerSystem if spec.multi_agent else JaxrunnerSystem)._build(spec)


class RolloutSystem:
    """A hand-written loop (``rollout() -> env steps done``), warmed up, as a system."""

    def __init__(self, rollout: Callable[[], int], close: Callable[[], None] | None = None) -> None:
        self._rollout, self._close = rollout, close
        try:
            rollout()  # warm-up: compiles, first resets
        except BaseException:
            self.close()
            raise

    def measure(self, seconds: float) -> dict[str, Any]:
        return {"steps_per_s": timed(self._rollout, seconds)}

    def close(self) -> None:
        if self._close is not None:
            self._close()


def recording_loop(
    spec: Spec, envs: Any, *, seeded_reset: bool = True, next_step_reset: bool = False
) -> RolloutSystem:
    try:
        obs_space, action_space = single_spaces(envs)
        loop = RecordingHandLoop(
            envs,
            spec.rollout_length,
            spec.seed,
            seeded_reset=seeded_reset,
            policy=spec_policy(spec, obs_space, action_space),
            next_step_reset=next_step_reset,
        )
    except BaseException:
        envs.close()
        raise
    return RolloutSystem(loop.rollout, envs.close)


def hand_system(spec: Spec) -> RolloutSystem:
    if spec.reference == "scan":
        return RolloutSystem(
            build_hand_scan(spec.num_envs, spec.rollout_length, spec.seed, spec.env)
        )
    envs, seeded = reference_envs(
        str(spec.reference), spec.env, spec.num_envs, spec.seed, spec.workload
    )
    # EnvPool resets an ended episode on the step after its end: no transition.
    return recording_loop(
        spec, envs, seeded_reset=seeded, next_step_reset=spec.reference == "envpool"
    )


class CeilingSystem:
    """The policy-bound ceiling for jaxrunner's vector env (a host backend)."""

    def __init__(self, spec: Spec) -> None:
        if spec.backend == JAX_BACKEND:
            raise InvalidArgumentError(
                "CeilingSystem: a pure-JAX rollout is one compiled scan, with no separate "
                "env and policy calls to add up; measure the host backends only."
            )
        self._envs = envs = _make_envs(spec)
        self.num_envs, self._length = spec.num_envs, spec.rollout_length
        envs.action_space.seed(spec.seed)
        self._pool = [envs.action_space.sample() for _ in range(97)]  # drawn ahead: free
        self._cursor = 0
        policy = spec_policy(spec, envs.single_observation_space, envs.single_action_space)
        self._params = policy.init(jax.random.key(spec.seed), envs.single_observation_space)
        self._act = hand_act(policy, spec.num_envs)
        self._obs, _ = envs.reset(seed=spec.seed)
        self._obs_device = jax.device_put(self._obs)
        self._key = jax.random.key(spec.seed)
        self._latest_obs = jax.tree.map(np.array, self._obs)  # the in-turn loop's own stream
        self._raw_rollout()
        self._policy_call()
        self._policy_compute()
        self._in_turn_rollout()

    def _raw_rollout(self) -> int:
        # step_batch: the backend's own lockstep step, as the runner calls it (no
        # gymnasium step() wrapping: infos, autoreset bookkeeping for the caller).
        for _ in range(self._length):
            self._envs.step_batch(self._pool[self._cursor])
            self._cursor = (self._cursor + 1) % len(self._pool)
        return self._length * self.num_envs

    def _in_turn_rollout(self) -> int:
        # The env stepped with the bare policy's own actions: the two in turn, no more.
        obs = self._latest_obs
        for _ in range(self._length):
            action, extras, self._key = self._act(self._params, obs, self._key)
            action, _ = np.asarray(action), np.asarray(extras["log_prob"])
            obs = self._envs.step_batch(action).obs
        self._latest_obs = obs
        return self._length * self.num_envs

    def _policy_call(self) -> int:
        # One bare policy call as the hand loop makes it: numpy in, numpy out.
        action, extras, self._key = self._act(self._params, self._obs, self._key)
        _ = np.asarray(action), np.asarray(extras["log_prob"])
        return 1

    def _policy_compute(self) -> int:
        # The same call on observations already on the device, waiting for it.
        action, extras, self._key = self._act(self._params, self._obs_device, self._key)
        jax.block_until_ready((action, extras))
        return 1

    def measure(self, seconds: float) -> dict[str, Any]:
        # A third of the time on the raw env, a third in turn, a sixth per policy call.
        raw_steps_per_s = timed(self._raw_rollout, seconds / 3)
        in_turn_steps_per_s = timed(self._in_turn_rollout, seconds / 3)
        policy_us = 1e6 / timed(self._policy_call, seconds / 6)  # us per call: each returns 1
        compute_us = 1e6 / timed(self._policy_compute, seconds / 6)
        raw_us = 1e6 * self.num_envs / raw_steps_per_s
        return {
            "steps_per_s": 1e6 * self.num_envs / (raw_us + policy_us),
            "raw_env_steps_per_s": raw_steps_per_s,
            "raw_env_us": raw_us,
            "policy_us": policy_us,
            "policy_compute_us": compute_us,
            "in_turn_steps_per_s": in_turn_steps_per_s,
            "in_turn_us": 1e6 * self.num_envs / in_turn_steps_per_s,
        }

    def close(self) -> None:
        self._envs.close()


BUILDERS: dict[str, Callable[[Spec], Any]] = {
    "jaxrunner": JaxrunnerSystem,
    "hand": hand_system,
    "ceiling": CeilingSystem,
}


def multi_agent_hand_system(spec: Spec) -> RolloutSystem:
    loop = MultiAgentHandLoop(env_factory(spec.env), spec.num_envs, spec.rollout_length, spec.seed)
    return RolloutSystem(loop.rollout, loop.close)


MULTI_AGENT_BUILDERS: dict[str, Callable[[Spec], Any]] = {
    "jaxrunner": MultiAgentRunnerSystem,
    "hand": multi_agent_hand_system,
}


def build(spec: Spec) -> Any:
    """Builds and warms up ``spec``'s system (``measure(seconds)``, ``close()``)."""
    return (MULTI_AGENT_BUILDERS if spec.multi_agent else BUILDERS)[spec.system](spec)
