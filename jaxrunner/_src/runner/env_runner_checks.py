"""``EnvRunner``'s argument checks, for either kind of env: each refusal names the
argument and the fix."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium

from jaxrunner._src.arg_checks import check_bool
from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.jax_env import JaxVectorEnv
from jaxrunner._src.connectors.pipeline import Connectors
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.runner.ownership import check_rollout_arguments
from jaxrunner._src.samplers.agent_callbacks import STEP_HOOKS, AgentCallbacks, overrides
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
    """Refuses the arguments of a single-agent env of the wrong kind, naming the argument
    and the fix."""
    if not isinstance(envs, (VectorEnv, JaxVectorEnv)):
        if isinstance(envs, gymnasium.vector.VectorWrapper):
            hint = vector_wrapper_hint(envs)
        elif isinstance(envs, gymnasium.vector.VectorEnv):
            hint = (
                "For a gymnasium vector env, wrap it: jaxrunner.from_gymnasium(envs); or "
                "build one with jaxrunner.make_vec(env_id_or_factory, num_envs)."
            )
        else:
            hint = "Build one with jaxrunner.make_vec(env_id_or_factory, num_envs)."
        raise InvalidArgumentTypeError(
            f"EnvRunner(envs=...): expected a jaxrunner vector env, got "
            f"{type(envs).__name__}. {hint}"
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


def check_multi_agent_arguments(
    envs: Any,
    policy: Any,
    params: Any,
    rollout_length: Any,
    seed: Any,
    callbacks: Any,
    num_splits: Any,
) -> tuple[dict[str, Policy], dict[str, Params]]:
    """Refuses the arguments of a multi-agent env of the wrong kind; returns the
    policies and the params by policy id."""
    ids = envs.policy_ids
    policies = _per_policy(policy, ids)
    for pid, one in policies.items():
        if not isinstance(one, Policy):
            raise InvalidArgumentTypeError(
                f"EnvRunner(policy=...): policy {pid!r} is {one!r}; expected a jaxrunner.Policy."
            )
    by_id = _params_per_policy(params, ids)
    check_rollout_arguments("EnvRunner", rollout_length, seed, num_splits, envs.num_envs)
    if callbacks is not None and not isinstance(callbacks, AgentCallbacks):
        raise InvalidArgumentTypeError(
            f"EnvRunner(callbacks=...): a multi-agent env takes a jaxrunner.multi_agent."
            f"AgentCallbacks (subclass it), got {type(callbacks).__name__}."
        )
    return policies, by_id


def _per_policy(value: Any, ids: tuple[str, ...]) -> dict[str, Any]:
    """One policy for every policy id, or a dict keyed by exactly the ids."""
    if isinstance(value, Policy):
        return dict.fromkeys(ids, value)
    if not isinstance(value, Mapping) or set(value) != set(ids):
        got = sorted(value) if isinstance(value, Mapping) else type(value).__name__
        raise InvalidArgumentError(
            f"EnvRunner(policy=...): a multi-agent env takes one jaxrunner.Policy for every "
            f"policy id or a dict keyed by the policy ids {list(ids)}, got {got}."
        )
    return {pid: value[pid] for pid in ids}


def _params_per_policy(params: Any, ids: tuple[str, ...]) -> dict[str, Params]:
    """``policy_id -> params``: a dict keyed by policy ids must name every id and only
    those (a typo is refused here, not met later inside the trace); with one policy id,
    anything else is that policy's params."""
    if isinstance(params, Mapping) and any(key in ids for key in params):
        unknown = [key for key in params if key not in ids]
        missing = [pid for pid in ids if pid not in params]
        if unknown or missing:
            raise InvalidArgumentError(
                f"EnvRunner(params=...): a dict keyed by policy ids must have exactly "
                f"the ids {list(ids)}; unknown: {unknown}, missing: {missing}. Check the keys "
                "against envs.policy_ids."
            )
        return {pid: params[pid] for pid in ids}
    if len(ids) == 1:
        return {ids[0]: params}
    got = sorted(map(str, params)) if isinstance(params, Mapping) else type(params).__name__
    raise InvalidArgumentError(
        f"EnvRunner(params=...): expected a dict keyed by the policy ids {list(ids)}, got {got}."
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
    envs: Any, info_keys: Sequence[str] | str, compact_next_obs: Any, multi_agent: bool
) -> InfoKeys:
    """Checks the options only host backends take; returns the info keys, checked."""
    runner = "EnvRunner"
    info_keys = check_info_keys(info_keys, runner)
    check_bool(runner, "compact_next_obs", compact_next_obs)
    if compact_next_obs and multi_agent:
        raise InvalidArgumentError(
            f"{runner}(compact_next_obs=True): a multi-agent env's trajectory stores every "
            "group's next_obs in full (compact storage is single-agent for now); leave "
            "compact_next_obs=False."
        )
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


def check_scan_agent_options(callbacks: Any, num_splits: Any) -> None:
    """Options of a multi-agent host loop that a pure-JAX env's scan cannot honour."""
    if num_splits not in (None, 1):
        raise InvalidArgumentError(
            f"EnvRunner(num_splits={num_splits!r}): a pure-JAX env is sampled as one jitted "
            "scan; pipelining splits do not apply. Leave num_splits=None."
        )
    if any(overrides(callbacks, hook) for hook in STEP_HOOKS):
        raise InvalidArgumentError(
            "EnvRunner(callbacks=...): the per-step hooks "
            f"({', '.join(STEP_HOOKS)}) run Python per env step, which a JaxVectorEnv "
            "rollout (one compiled lax.scan) cannot do. Override only on_agent_episode_end, "
            "or use a host vector env (jaxrunner.make_vec)."
        )
