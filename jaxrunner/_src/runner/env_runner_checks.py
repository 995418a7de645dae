"""``EnvRunner``'s argument checks: each refusal names the argument and the fix."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium

from jaxrunner._src.arg_checks import check_bool
from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.capabilities import is_multi_agent
from jaxrunner._src.backends.jax_env import JaxVectorEnv
from jaxrunner._src.connectors.pipeline import Connectors
from jaxrunner._src.core.policy import Policy
from jaxrunner._src.runner.ownership import check_rollout_arguments
from jaxrunner._src.samplers.callbacks import Callbacks
from jaxrunner._src.samplers.info_arrays import InfoKeys, check_info_keys
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError


def check_arguments(
    envs: Any,
    policy: Any,
    params: Any,
    rollout_length: Any,
    seed: Any,
    callbacks: Any,
    num_splits: Any,
) -> None:
    """Refuses arguments of the wrong kind, naming the argument and the fix."""
    if not isinstance(envs, (VectorEnv, JaxVectorEnv)) or is_multi_agent(envs):
        if is_multi_agent(envs):
            hint = "Multi-agent envs are sampled by jaxrunner.MultiAgentRunner."
        elif isinstance(envs, gymnasium.vector.VectorWrapper):
            hint = vector_wrapper_hint(envs)
        elif isinstance(envs, gymnasium.vector.VectorEnv):
            hint = (
                "For a gymnasium vector env, wrap it: jaxrunner.from_gymnasium(envs); or "
                "build one with jaxrunner.make_vec(env_id_or_factory, num_envs)."
            )
        else:
            hint = "Build one with jaxrunner.make_vec(env_id_or_factory, num_envs)."
        got = type(envs).__name__
        if isinstance(envs, JaxVectorEnv):
            got += f" of the JaxMARL-style {type(envs.env).__name__}"
        raise InvalidArgumentTypeError(
            f"EnvRunner(envs=...): expected a jaxrunner vector env, got {got}. {hint}"
        )
    if not isinstance(policy, Policy):
        raise InvalidArgumentTypeError(
            f"EnvRunner(policy=...): expected a jaxrunner.Policy, got {policy!r}."
        )
    if params is None:
        raise InvalidArgumentError(
            "EnvRunner(params=None): expected the policy's params, e.g. "
            "policy.init(jax.random.key(0), envs.single_observation_space) ({} for a policy "
            "without params)."
        )
    check_rollout_arguments("EnvRunner", rollout_length, seed, num_splits, envs.num_envs)
    if callbacks is not None and not isinstance(callbacks, Callbacks):
        raise InvalidArgumentTypeError(
            f"EnvRunner(callbacks=...): expected a jaxrunner.Callbacks subclass instance, got "
            f"{type(callbacks).__name__}. Subclass jr.Callbacks and override its hooks."
        )


# What replaces each of gymnasium's vector wrappers on a runner (which steps its envs
# itself, so a wrapper's step would never run).
REPLACEMENTS = {
    "NormalizeObservation": "the connector jaxrunner.connectors.NormalizeObservation()",
    "NormalizeReward": "the connector jaxrunner.connectors.ScaleReward()",
    "FrameStackObservation": "the connector jaxrunner.connectors.FrameStack(n)",
    "ClipAction": "nothing: Box actions are clipped for the env already (the trajectory "
    "keeps them as sampled)",
    "RescaleAction": "the connector jaxrunner.connectors.RescaleActions()",
    "RecordEpisodeStatistics": "runner.get_metrics() (episode_return_mean, "
    "episode_length_mean) and traj.split_episodes()",
    "DictInfoToList": "EnvRunner(..., info_keys=[...]) (infos as [T, B] arrays)",
}


def vector_wrapper_hint(envs: Any) -> str:
    """What to do with gymnasium vector wrappers around a vector env: unwrap them, and
    which connector or runner feature replaces each."""
    names = []
    inner = envs
    while isinstance(inner, gymnasium.vector.VectorWrapper):
        names.append(type(inner).__name__)
        inner = inner.env
    other = "the wrapper on each sub-env inside its factory (gymnasium.wrappers) or a connector"
    fixes = [f"{name} -> {REPLACEMENTS.get(name, other)}" for name in names]
    unwrap = (
        "pass the jaxrunner vector env itself (envs.unwrapped)"
        if isinstance(inner, (VectorEnv, JaxVectorEnv))
        else "pass jaxrunner.from_gymnasium(envs.unwrapped) (the gymnasium vector env under them)"
    )
    return (
        f"The runner steps its envs itself, so gymnasium vector wrappers ({', '.join(names)}) "
        f"would never run: {unwrap}, and replace {'; '.join(fixes)}."
    )


def check_host_options(
    envs: Any, info_keys: Sequence[str] | str, compact_next_obs: Any, runner: str = "EnvRunner"
) -> InfoKeys:
    """Checks the options only host backends take (``runner``'s); returns the info
    keys, checked."""
    info_keys = check_info_keys(info_keys, runner)
    check_bool(runner, "compact_next_obs", compact_next_obs)
    if compact_next_obs and isinstance(envs, JaxVectorEnv):
        raise InvalidArgumentError(
            f"{runner}(compact_next_obs=True): a pure-JAX env's trajectory is built on "
            "device by one compiled scan, where the rows to keep are not known in "
            "advance; leave compact_next_obs=False, or use a host backend "
            "(jaxrunner.make_vec)."
        )
    if info_keys and isinstance(envs, JaxVectorEnv):
        raise InvalidArgumentError(
            f"{runner}(info_keys=...): a pure-JAX env's infos stay on device inside "
            "its scan and are not recorded; return what you need from the env's state, "
            "or use a host backend (jaxrunner.make_vec)."
        )
    return info_keys


def check_connectors(connectors: Any) -> Connectors | None:
    if connectors is not None and not isinstance(connectors, Connectors):
        raise InvalidArgumentTypeError(
            f"EnvRunner(connectors=...): expected a jaxrunner.connectors.Connectors, got "
            f"{type(connectors).__name__}. Wrap them: Connectors(obs=[...], action=[...])."
        )
    return connectors


def check_ready_first_options(envs: VectorEnv, callbacks: Any, num_splits: Any) -> None:
    name = type(envs).__name__
    if callbacks is not None:
        raise InvalidArgumentError(
            f"EnvRunner(callbacks=...): {name} steps its sub-envs at their own pace "
            "(ready-first), where per-step callbacks cannot run in order. Read the "
            "Trajectory instead, or use a lockstep backend ('sync', 'process')."
        )
    if num_splits not in (None, 1):
        raise InvalidArgumentError(
            f"EnvRunner(num_splits={num_splits!r}): {name} computes actions for whichever "
            "sub-envs are ready (ready-first); pipelining groups do not apply. Leave "
            "num_splits=None."
        )
