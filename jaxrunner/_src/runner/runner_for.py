"""``runner_for``: the runner for a vector env, chosen by the kind the env declares."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxrunner._src.backends.capabilities import is_multi_agent
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.runner.env_runner import EnvRunner
from jaxrunner._src.runner.multi_agent_runner import MultiAgentRunner


def runner_for(
    envs: Any,
    policy: Policy | Mapping[str, Policy],
    params: Params,
    rollout_length: int,
    seed: int,
    **options: Any,
) -> EnvRunner | MultiAgentRunner:
    """A :class:`~jaxrunner.MultiAgentRunner` for an env that declares itself multi-agent
    (``envs.multi_agent``), else an :class:`~jaxrunner.EnvRunner`; ``policy``,
    ``params`` and the keyword ``options`` as that runner takes them (its checks name
    what does not fit)."""
    if is_multi_agent(envs):
        return MultiAgentRunner(envs, policy, params, rollout_length, seed, **options)
    return EnvRunner(envs, policy, params, rollout_length, seed, **options)  # type: ignore[arg-type]
