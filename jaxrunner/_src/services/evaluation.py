"""Evaluation: a policy's return over N complete episodes on envs kept for it.

A fresh :class:`~jaxrunner.EnvRunner` samples the evaluation envs, so a training
runner's envs, episodes and metrics are never touched. Episodes are taken in equal
shares per env, each env's first ones: taking whichever episodes finish first would
favour short episodes, and so bias the mean return.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxrunner._src.arg_checks import check_int
from jaxrunner._src.backends.jax_env import JaxVectorEnv
from jaxrunner._src.backends.multi_agent.vector_env import MultiAgentVectorEnv
from jaxrunner._src.connectors.per_group import GroupConnectors
from jaxrunner._src.connectors.pipeline import Connectors, ConnectorsState
from jaxrunner._src.core.episode import Episode
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.runner.env_runner import EnvRunner
from jaxrunner._src.services.frozen_connectors import check_state_has_connectors, frozen_state
from jaxrunner._src.services.multi_agent_evaluation import (
    MultiAgentEvaluationResult,
    evaluate_multi_agent,
)
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError


@dataclasses.dataclass(frozen=True)
class EvaluationResult:
    """What :func:`evaluate` returns.

    Attributes:
        episodes: the complete episodes, ordered by env, then by start.
        returns: each episode's total (undiscounted) reward, ``[N]``.
        lengths: each episode's number of steps, ``[N]``.
    """

    episodes: list[Episode]
    returns: np.ndarray
    lengths: np.ndarray

    @property
    def num_episodes(self) -> int:
        return len(self.episodes)

    @property
    def return_mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def return_std(self) -> float:
        return float(np.std(self.returns))

    @property
    def return_min(self) -> float:
        return float(np.min(self.returns))

    @property
    def return_max(self) -> float:
        return float(np.max(self.returns))

    @property
    def length_mean(self) -> float:
        return float(np.mean(self.lengths))

    def summary(self) -> dict[str, float]:
        """The statistics as a flat dict (for a logger): ``return_mean``,
        ``return_std``, ``return_min``, ``return_max``, ``length_mean``,
        ``num_episodes``."""
        return {
            "return_mean": self.return_mean,
            "return_std": self.return_std,
            "return_min": self.return_min,
            "return_max": self.return_max,
            "length_mean": self.length_mean,
            "num_episodes": float(self.num_episodes),
        }


def evaluate(
    envs: Any,
    policy: Policy | Mapping[str, Policy],
    params: Params,
    num_episodes: int,
    *,
    deterministic: bool = True,
    seed: int = 0,
    rollout_length: int = 32,
    connectors: Connectors | GroupConnectors | None = None,
    connector_state: ConnectorsState | Mapping[str, Any] | None = None,
) -> EvaluationResult | MultiAgentEvaluationResult:
    """Runs ``policy`` with ``params`` on ``envs`` for ``num_episodes`` complete
    episodes and returns them with their statistics.

    Every env is reset first, from ``seed`` as a new :class:`~jaxrunner.EnvRunner`
    resets them, so a call measures whole episodes and the same arguments give the
    same result. Env ``i`` contributes its first ``num_episodes // num_envs``
    episodes (one more for the first ``num_episodes % num_envs`` envs): a fixed share
    per env, so short episodes are not favoured. The envs stay open (close them
    yourself) and may be evaluated on again; use envs of their own, never a training
    runner's.

    Multi-agent envs (:func:`jaxrunner.make_multi_agent_vec`, or a pure-JAX
    :class:`~jaxrunner.multi_agent.JaxMultiAgentVectorEnv`) are evaluated the same way
    over env episodes: ``policy``, ``params`` and ``connectors`` are then as for
    :class:`~jaxrunner.MultiAgentRunner` (one for every policy id, or a dict by policy
    id), ``connector_state`` a dict by policy id (the training runner's
    ``get_connector_state()``), and the result is a
    :class:`~jaxrunner.multi_agent.MultiAgentEvaluationResult` (each env episode's
    return over its agents, and per agent).

    Args:
        envs: a jaxrunner vector env (:func:`jaxrunner.make_vec`, a
            :class:`~jaxrunner.JaxVectorEnv`) for evaluation only, or a multi-agent one.
        policy: the policy; ``deterministic`` picks how it acts.
        params: its params (e.g. the training runner's ``get_params()``).
        num_episodes: how many complete episodes, ``>= 1``.
        deterministic: act with the distribution's mode (:meth:`Policy.deterministic`);
            False samples, as training does.
        seed: seeds the env resets and, when sampling, the policy's keys.
        rollout_length: steps per env of each inner ``sample()``; smaller wastes fewer
            steps past the last episode needed, larger has less per-call overhead.
        connectors: the training runner's :class:`~jaxrunner.connectors.Connectors`
            (the policy sees what they make of the observations).
        connector_state: their state, e.g. the training runner's
            ``get_connector_state()`` (or a dict by connector name): its statistics,
            used frozen, so evaluation never changes them (per-env parts such as frame
            stacks start afresh with the evaluation envs' episodes). Required when the
            observation connectors keep statistics: fresh ones would evaluate on
            unnormalized observations.

    Returns:
        An :class:`EvaluationResult` (multi-agent envs: a ``MultiAgentEvaluationResult``).
    """
    check_int("evaluate", "num_episodes", num_episodes)
    check_state_has_connectors(connectors, connector_state)
    if isinstance(envs, MultiAgentVectorEnv) or (
        isinstance(envs, JaxVectorEnv) and envs.multi_agent
    ):
        return evaluate_multi_agent(
            envs,
            policy,
            params,
            num_episodes,
            deterministic=deterministic,
            seed=seed,
            rollout_length=rollout_length,
            connectors=connectors,
            connector_state=connector_state,
        )
    if not isinstance(policy, Policy):
        raise InvalidArgumentError(
            f"evaluate(policy=...): a single-agent vector env takes one jaxrunner.Policy, got "
            f"{type(policy).__name__}."
        )
    if connectors is not None and not isinstance(connectors, Connectors):
        raise InvalidArgumentTypeError(
            f"evaluate(connectors=...): expected a jaxrunner.connectors.Connectors, got "
            f"{type(connectors).__name__}: pass the training runner's."
        )
    acting = policy.deterministic() if deterministic else policy
    runner = EnvRunner(
        envs, acting, params, rollout_length=rollout_length, seed=seed, connectors=connectors
    )
    try:
        if connectors is not None:
            fresh = runner.get_connector_state()
            runner.set_connector_state(frozen_state(fresh, connectors, connector_state))
        episodes = _collect(runner, envs.num_envs, num_episodes)
    finally:  # the caller's envs stay open, free for the next evaluation
        runner.stop(close_envs=False)
    return EvaluationResult(
        episodes=episodes,
        returns=np.array([e.total_return for e in episodes], np.float64),
        lengths=np.array([e.length for e in episodes], np.int64),
    )


def _collect(runner: EnvRunner, num_envs: int, num_episodes: int) -> list[Episode]:
    """An equal share of each env's first complete episodes, ``num_episodes`` in all."""
    share = [num_episodes // num_envs + (i < num_episodes % num_envs) for i in range(num_envs)]
    kept: list[list[Episode]] = [[] for _ in range(num_envs)]
    missing = num_episodes
    while missing:
        for episode in runner.sample_episodes(missing):
            if len(kept[episode.env_id]) < share[episode.env_id]:
                kept[episode.env_id].append(episode)
        missing = sum(want - len(got) for want, got in zip(share, kept))
    return [e for per_env in kept for e in sorted(per_env, key=lambda e: e.episode_id)]
