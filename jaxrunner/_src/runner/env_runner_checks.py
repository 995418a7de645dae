"""``EnvRunner``'s checks of its arguments and of its methods' calls, for either kind of
env: each refusal names the argument and the fix."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium

from jaxrunner._src.arg_checks import check_bool, check_int
from jaxrunner._src.backends.base import MultiAgentVectorEnv, VectorEnv
from jaxrunner._src.backends.jax_env import JaxVectorEnv
from jaxrunner._src.backends.vector_wrappers import vector_wrapper_hint
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.core.seeds import MAX_SEED
from jaxrunner._src.samplers.agent_callbacks import STEP_HOOKS, AgentCallbacks, overrides
from jaxrunner._src.samplers.info_arrays import InfoKeys, check_info_keys
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError


def check_arguments(
    envs: Any,
    kind: Any,
    policy: Any,
    params: Any,
    rollout_length: Any,
    seed: Any,
    callbacks: Any,
    num_splits: Any,
) -> tuple[dict[str, Policy], dict[str, Params]]:
    """Refuses ``EnvRunner``'s arguments where they do not fit ``envs`` of this ``kind``;
    returns the policies and the params by policy id."""
    if not isinstance(envs, (VectorEnv, MultiAgentVectorEnv, JaxVectorEnv)):
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
    ids = envs.policy_ids
    policies = _per_policy(policy, ids, kind.multi_agent)
    if params is None:
        space = "group.observation_space" if kind.multi_agent else "envs.single_observation_space"
        raise InvalidArgumentError(
            "EnvRunner(params=None): expected the policy's params, e.g. "
            f"policy.init(jax.random.key(0), {space}) ({{}} for a policy without params)"
            + (f", in a dict by policy id {list(ids)}." if len(ids) > 1 else ".")
        )
    by_id = _params_per_policy(params, ids) if kind.multi_agent else {ids[0]: params}
    check_int("EnvRunner", "rollout_length", rollout_length)
    check_int("EnvRunner", "seed", seed, low=0, high=MAX_SEED)
    at_most, num_envs = f"at most num_envs={envs.num_envs}", envs.num_envs
    check_int(
        "EnvRunner", "num_splits", num_splits, high=num_envs, hint=at_most, none="for automatic"
    )
    caps = getattr(envs, "capabilities", None)  # (a pure-JAX env's splits: refused at its loop)
    if num_splits not in (None, 1) and caps is not None and caps.whole_batch:
        raise InvalidArgumentError(
            f"EnvRunner(num_splits={num_splits}): {type(envs).__name__} steps all its sub-envs "
            "at once, so there are no splits to pipeline; leave num_splits=None (or use the "
            "'sync' or 'process' backend, which pipeline)."
        )
    blocks = caps.pipeline_bounds if caps is not None and caps.whole_blocks else None
    if num_splits not in (None, 1) and blocks is not None and num_splits != len(blocks) - 1:
        raise InvalidArgumentError(
            f"EnvRunner(num_splits={num_splits}): {type(envs).__name__} steps whole blocks of "
            f"sub-envs {list(blocks)}, one split each; leave num_splits=None (or pass "
            f"{len(blocks) - 1}), or 1 for one split of every block."
        )
    if callbacks is not None and not isinstance(callbacks, kind.callbacks_type):
        what = kind.callbacks_name
        raise InvalidArgumentTypeError(
            f"EnvRunner(callbacks=...): {kind.name} takes a {what} subclass instance, got "
            f"{type(callbacks).__name__}. Subclass {what} and override its hooks."
        )
    if callbacks is not None:
        _check_hook_signatures(callbacks)
    return policies, by_id


def _check_hook_signatures(callbacks: Any) -> None:
    """Refuses an overridden hook that cannot take the arguments the sampler passes:
    found here, not at the first episode's end, where the sample would fail."""
    for hook in (*STEP_HOOKS, "on_agent_episode_end"):
        if not hasattr(callbacks, hook) or not overrides(callbacks, hook):
            continue
        names = list(inspect.signature(getattr(AgentCallbacks, hook)).parameters)[1:]  # no self
        try:
            inspect.signature(getattr(callbacks, hook)).bind(*names)
        except TypeError as err:
            raise InvalidArgumentTypeError(
                f"EnvRunner(callbacks=...): {type(callbacks).__name__}.{hook} cannot be called "
                f"as {hook}({', '.join(names)}) ({err}); the sampler calls it so."
            ) from None


def _per_policy(value: Any, ids: tuple[str, ...], by_id: bool) -> dict[str, Policy]:
    """One policy for every policy id, or (``by_id``: a multi-agent env) a dict keyed
    by exactly the ids."""
    if isinstance(value, Policy):
        return dict.fromkeys(ids, value)
    if not by_id:
        raise InvalidArgumentTypeError(
            f"EnvRunner(policy=...): expected a jaxrunner.Policy, got {value!r}."
        )
    if not isinstance(value, Mapping) or set(value) != set(ids):
        got = sorted(value) if isinstance(value, Mapping) else type(value).__name__
        raise InvalidArgumentError(
            f"EnvRunner(policy=...): a multi-agent env takes one jaxrunner.Policy for every "
            f"policy id or a dict keyed by the policy ids {list(ids)}, got {got}."
        )
    for pid in ids:
        if not isinstance(value[pid], Policy):
            raise InvalidArgumentTypeError(
                f"EnvRunner(policy=...): policy {pid!r} is {value[pid]!r}; expected a "
                "jaxrunner.Policy."
            )
    return {pid: value[pid] for pid in ids}


def _params_per_policy(params: Any, ids: tuple[str, ...]) -> dict[str, Params]:
    """``policy_id -> params``: a dict keyed by policy ids names every id and only those;
    with one policy id, anything else is that policy's params."""
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


def check_host_options(
    envs: Any, info_keys: Sequence[str] | str, compact_next_obs: Any, chunk_rows: Any
) -> InfoKeys:
    """Checks the options only host backends take; returns the info keys, checked."""
    runner = "EnvRunner"
    info_keys = check_info_keys(info_keys, runner)
    check_bool(runner, "compact_next_obs", compact_next_obs)
    hint = "rows per policy chunk"
    check_int(runner, "chunk_rows", chunk_rows, none="for the default", hint=hint)
    if chunk_rows is not None and isinstance(envs, JaxVectorEnv):
        raise InvalidArgumentError(
            f"{runner}(chunk_rows={chunk_rows}): a pure-JAX env's policy runs on every env "
            "at once inside its scan, in no chunks; leave chunk_rows out."
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


def takes_loop_options(callbacks: Any, num_splits: Any) -> bool:
    """Whether :func:`check_loop_options` takes ``callbacks`` and ``num_splits``: a
    ready-first backend (or a pure-JAX env's scan) can run with them."""
    return not _runs_step_hooks(callbacks) and num_splits in (None, 1)


def _runs_step_hooks(callbacks: Any) -> bool:
    """Whether ``callbacks`` may run per step (a ``Callbacks``, or a step hook overridden)."""
    return callbacks is not None and (
        not isinstance(callbacks, AgentCallbacks)
        or any(overrides(callbacks, hook) for hook in STEP_HOOKS)
    )


def check_loop_options(kind: Any, callbacks: Any, num_splits: Any, loop: str, fix: str) -> None:
    """Refuses what ``loop`` (a ready-first backend, or a pure-JAX env's scan) cannot
    honour: pipelining splits and per-step callbacks (``fix``: where those run)."""
    if _runs_step_hooks(callbacks):
        after = "it runs after each sample()"
        raise InvalidArgumentError(
            f"EnvRunner(callbacks=...): the per-step hooks ({', '.join(STEP_HOOKS)}) cannot "
            f"run here: {loop}. "
            + (
                f"Override only on_agent_episode_end ({after}), "
                if kind.multi_agent
                else "Drop them and read the Trajectory, override only on_agent_episode_end "
                f"of a jaxrunner.multi_agent.AgentCallbacks ({after}), "
            )
            + f"or use {fix}."
        )
    if num_splits not in (None, 1):
        raise InvalidArgumentError(
            f"EnvRunner(num_splits={num_splits!r}): pipelining splits do not apply here: "
            f"{loop}. Leave num_splits=None."
        )


def check_releasable(runner: Any, what: str, fix: str) -> None:
    """Refuses ``what`` (handing trajectories back) where ``runner`` samples a pure-JAX env,
    whose trajectories live on device; ``fix`` ends the message."""
    if runner.sampler.on_device:
        raise InvalidArgumentError(
            f"{type(runner).__name__}.{what}: a pure-JAX env's trajectories are device arrays "
            "built by its compiled scan, which allocates them itself; there is nothing to "
            "hand back" + fix
        )


def check_policy_id(runner: Any, what: str, policy_id: Any) -> str:
    """``policy_id``, one of ``runner``'s policy ids; ``None`` names the runner's one policy."""
    params: dict[str, Params] = runner.state.params
    ids = list(params)
    if policy_id is None and len(ids) == 1:
        return ids[0]
    if policy_id not in params:
        raise InvalidArgumentError(
            f"{type(runner).__name__}.{what}(policy_id={policy_id!r}): no such policy; the "
            f"policy ids are {ids}."
            + (" Name one: this runner has several." if policy_id is None else "")
        )
    return policy_id


def check_has_connectors(runner: Any, what: str) -> None:
    """Refuses ``what`` (reading or writing connector state) on a runner without connectors."""
    if not runner._connectors:
        raise InvalidArgumentError(
            f"{type(runner).__name__}.{what}(): this runner has no connectors; pass "
            "EnvRunner(..., connectors=jaxrunner.connectors.Connectors(...))"
            + runner.kind.connectors_hint
        )
