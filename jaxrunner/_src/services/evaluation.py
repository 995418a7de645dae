"""``jr.evaluate``: a policy's return over N complete episodes on envs kept for it, for
both kinds of env, with the training runner's connectors frozen. See
docs/evaluation-and-datasets.md."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from jaxrunner._src.arg_checks import check_bool, check_int
from jaxrunner._src.backends.capabilities import is_multi_agent
from jaxrunner._src.connectors.moments import freeze, is_running
from jaxrunner._src.connectors.per_group import GroupConnectors
from jaxrunner._src.connectors.pipeline import Connectors, ConnectorsState
from jaxrunner._src.core.episode import Episode
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.core.seeds import MAX_SEED
from jaxrunner._src.runner.collection import sampled_episodes
from jaxrunner._src.runner.env_runner import EnvRunner
from jaxrunner.errors import EvaluationIncompleteError, InvalidArgumentError, JaxRunnerError


@dataclasses.dataclass(frozen=True)
class EvaluationResult:
    """What :func:`evaluate` returns, for either kind of env.

    Attributes:
        episodes: single-agent envs: the complete :class:`~jaxrunner.Episode` s, ordered
            by env, then by start (multi-agent envs: empty; read the arrays).
        returns: each episode's total (undiscounted) reward, ``[N]`` (multi-agent: an
            env episode's, summed over its agents' transitions).
        lengths: each episode's env steps, ``[N]``.
        env_ids: each episode's env, ``[N]``.
        agent_returns: multi-agent envs: agent id -> its total reward in each of those
            episodes, ``[N]`` (0 where it never acted); single-agent envs: empty.
    """

    episodes: list[Episode]
    returns: np.ndarray
    lengths: np.ndarray
    env_ids: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    agent_returns: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    @property
    def num_episodes(self) -> int:
        return len(self.returns)

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
        ``num_episodes``, and ``return_mean/<agent>`` per agent (multi-agent envs)."""
        names = ("return_mean", "return_std", "return_min", "return_max", "length_mean")
        out = {name: getattr(self, name) for name in names}
        out["num_episodes"] = float(self.num_episodes)
        for agent, returns in self.agent_returns.items():
            out[f"return_mean/{agent}"] = float(np.mean(returns))
        return out


MultiAgentEvaluationResult = EvaluationResult
"""Deprecated alias: :func:`evaluate` returns an :class:`EvaluationResult` for both kinds."""


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
    max_env_steps: int | None = None,
) -> EvaluationResult:
    """Runs ``policy`` with ``params`` on ``envs`` for ``num_episodes`` complete
    episodes and returns them with their statistics (see docs/evaluation-and-datasets.md).

    Every env is reset from ``seed`` (the same arguments give the same result), and env
    ``i`` contributes its first ``num_episodes // num_envs`` episodes (one more for the
    first ``num_episodes % num_envs`` envs). The envs stay open; use envs of their own,
    never a training runner's. Multi-agent envs are evaluated over env episodes, with
    ``policy``, ``params``, ``connectors`` and ``connector_state`` as ``EnvRunner``
    takes and returns them (by policy id).

    Args:
        envs: a jaxrunner vector env of either kind (:func:`jaxrunner.make_vec`,
            :func:`jaxrunner.make_multi_agent_vec`, a pure-JAX one), for evaluation only.
        policy: the policy (or policies); ``deterministic`` picks how it acts.
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
            ``get_connector_state()`` (or a dict by connector name; multi-agent: either,
            by policy id): its
            statistics, used frozen, so evaluation never changes them (per-env parts such
            as frame stacks start afresh with the evaluation envs' episodes). Required
            when the observation connectors keep statistics: fresh ones would evaluate on
            unnormalized observations.
        max_env_steps: the most env steps (all envs together, checked after each inner
            ``sample()``) before giving up: transitions and failed steps, as the runner's
            ``num_env_steps`` and ``num_dropped_steps`` count them (EnvPool's reset steps
            are neither); None: no limit, so envs whose episodes never end (no time
            limit) would run forever.

    Returns:
        An :class:`EvaluationResult`.

    Raises:
        EvaluationIncompleteError: ``max_env_steps`` were taken first; its
            ``partial_result`` holds the episodes that did complete.
    """
    check_int("evaluate", "num_episodes", num_episodes)
    check_int("evaluate", "max_env_steps", max_env_steps, none="for no limit")
    check_int("evaluate", "rollout_length", rollout_length)
    check_int("evaluate", "seed", seed, low=0, high=MAX_SEED)
    if connectors is None and connector_state is not None:
        raise InvalidArgumentError(
            "evaluate(connector_state=...): no connectors to take it; pass "
            "connectors=<the training runner's Connectors> as well."
        )
    if isinstance(policy, Mapping) and not is_multi_agent(envs):
        raise InvalidArgumentError(
            f"evaluate(policy=...): a single-agent vector env takes one jaxrunner.Policy, got "
            f"{type(policy).__name__}."
        )
    acting = _acting(policy, check_bool("evaluate", "deterministic", deterministic))
    try:
        runner = EnvRunner(envs, acting, params, rollout_length, seed, connectors=connectors)
    except JaxRunnerError as err:  # its checks name the runner's arguments, also evaluate's
        err.add_note("jaxrunner: raised by the EnvRunner evaluate() builds from its arguments.")
        raise
    try:
        if connectors is not None:
            try:
                frozen = _frozen_states(runner, connector_state)
            except JaxRunnerError as err:  # the connectors' checks name set_connector_state
                err.add_note("jaxrunner: raised checking evaluate(connector_state=...).")
                raise
            runner.set_connector_state(runner.from_policy_dict(frozen))
        agents = list(envs.possible_agents) if runner.multi_agent else []
        ends = _episode_ends(runner, agents)
        steps = functools.partial(_env_steps_taken, runner)
        return _first_episodes(ends, envs.num_envs, num_episodes, agents, steps, max_env_steps)
    finally:  # the caller's envs stay open, free for the next evaluation
        runner.stop(close_envs=False)


def _acting(policy: Any, deterministic: bool, pid: str | None = None) -> Any:
    """The policy (or each policy of a dict) as it acts in evaluation."""
    if isinstance(policy, Mapping):
        return {pid: _acting(p, deterministic, pid) for pid, p in policy.items()}
    if not deterministic or not isinstance(policy, Policy):
        return policy
    if policy.distribution_fn is None:  # deterministic=True is the default: say so
        which = "the policy" if pid is None else f"policy {pid!r}"
        raise InvalidArgumentError(
            f"evaluate(deterministic=True): {which} has no distribution_fn, so no mode to "
            "act with. Pass deterministic=False to act with its apply_fn (as it samples "
            "in training), or give it a distribution_fn (Policy.from_linen/from_nnx set one)."
        )
    return policy.deterministic()


# -- the connectors' state, frozen -------------------------------------------------------------


def _frozen_states(runner: EnvRunner, given: Any) -> dict[str, Any]:
    """Each policy's connector state, frozen: ``given``'s (the training runner's) loaded,
    or the fresh one where observation connectors keep no statistics."""
    fresh = runner.to_policy_dict(runner.get_connector_state(), "evaluate")
    connectors = runner.to_policy_dict(runner.connectors, "evaluate(connectors=...)")
    given = {} if given is None else runner.to_policy_dict(given, "evaluate(connector_state=...)")
    if not set(given) <= set(fresh):
        raise InvalidArgumentError(
            f"evaluate(connector_state=...): expected a dict keyed by the policy ids with "
            f"connectors ({list(fresh)}), got {sorted(given, key=str)}. Pass the training "
            "runner's get_connector_state()."
        )
    states = {}
    for pid, state in fresh.items():
        if given.get(pid) is not None:
            state = connectors[pid].load_state(state, given[pid], shared_only=True)
        elif any(is_running(x) for x in jax.tree.leaves(state.obs, is_leaf=is_running)):
            raise InvalidArgumentError(
                "evaluate(connectors=...): these observation connectors keep statistics, and "
                "fresh ones (mean 0, variance 1) would evaluate on unnormalized observations; "
                "pass connector_state=runner.get_connector_state() of the training runner."
            )
        states[pid] = freeze(state)
    return states


# -- each env's first episodes -------------------------------------------------------------------

_Ended = tuple[int, float, int, dict[str, float], Episode | None]
"""An episode as it ends: env id, return, length, return per agent, the episode (single-agent)."""


def _first_episodes(
    next_ends: Callable[[], list[_Ended]],
    num_envs: int,
    num_episodes: int,
    agents: list[str],
    steps_taken: Callable[[], int],
    max_env_steps: int | None,
) -> EvaluationResult:
    """Each env's first episodes, an equal share of ``num_episodes``, from ``next_ends``
    (the episodes the next sample ends, in the order they ran); once ``steps_taken()``
    (the env steps so far) reaches ``max_env_steps``, an :class:`EvaluationIncompleteError`
    holding those that completed."""
    share = [num_episodes // num_envs + (i < num_episodes % num_envs) for i in range(num_envs)]
    kept: list[list[_Ended]] = [[] for _ in range(num_envs)]
    while missing := sum(want - len(got) for want, got in zip(share, kept)):
        taken = steps_taken()
        if max_env_steps is not None and taken >= max_env_steps:
            short = [i for i, (want, got) in enumerate(zip(share, kept)) if len(got) < want]
            err = EvaluationIncompleteError(
                f"evaluate(max_env_steps={max_env_steps}): {num_episodes - missing} of "
                f"{num_episodes} episodes complete after {taken} env steps; envs {short[:8]} "
                "have not completed their share. Check that the envs' episodes end (e.g. "
                "gymnasium.make(..., max_episode_steps=...)), or raise max_env_steps. The "
                "episodes that completed are in err.partial_result."
            )
            err.partial_result = _result(kept, agents)
            raise err
        for ended in next_ends():
            if len(kept[ended[0]]) < share[ended[0]]:
                kept[ended[0]].append(ended)
    return _result(kept, agents)


def _env_steps_taken(runner: EnvRunner) -> int:
    """The env steps ``runner`` took: its transitions and its failed (restarted) steps,
    not the slots where an env stepped no transition (EnvPool's reset steps)."""
    metrics = runner.get_metrics()
    # Failed steps count: an env that fails every step still reaches max_env_steps.
    return int(metrics["num_env_steps"]) + int(metrics["num_dropped_steps"])


def _result(kept: list[list[_Ended]], agents: list[str]) -> EvaluationResult:
    """The episodes ``kept`` (by env, in the order they ran) as an EvaluationResult."""
    rows = [ended for per_env in kept for ended in per_env]
    return EvaluationResult(
        episodes=[e for *_, e in rows if e is not None],
        returns=np.array([r[1] for r in rows], np.float64),
        lengths=np.array([r[2] for r in rows], np.int64),
        env_ids=np.array([r[0] for r in rows], np.int64),
        agent_returns={a: np.array([r[3][a] for r in rows], np.float64) for a in agents},
    )


def _episode_ends(runner: EnvRunner, agents: list[str]) -> Callable[[], list[_Ended]]:
    """The complete episodes the next sample ends, never a faulty one. Single-agent: as
    ``sample_episodes`` sees them, in start order; multi-agent: the env episodes, summed
    from the slots of its ``agents`` (a failed step of its env makes one faulty)."""
    if not runner.multi_agent:
        return lambda: [
            (e.env_id, e.total_return, e.length, {}, e) for e in sampled_episodes(runner, False)
        ]
    running = [(0.0, 0, dict.fromkeys(agents, 0.0)) for _ in range(runner.envs.num_envs)]

    def next_ends() -> list[_Ended]:
        traj = runner.sample()
        per_agent = {}  # agent -> its rewards completed at each [t, b]
        for pid, group in traj.groups.items():
            rewards = np.where(group.valid, group.reward, 0.0)
            for a, agent in enumerate(traj.agents[pid]):
                per_agent[agent] = rewards[:, :, a]
        done = np.asarray(traj.env_done)
        # Steps that failed (None: a pure-JAX env's, which never fail).
        failed = np.zeros_like(done) if traj.valid is None else ~np.asarray(traj.valid)
        ended: list[_Ended] = []
        for b in range(traj.num_envs):
            for t in range(traj.num_steps):
                if failed[t, b]:  # its episode is faulty; the next starts at t + 1
                    running[b] = (0.0, 0, dict.fromkeys(agents, 0.0))
                    continue
                total, length, returns = running[b]
                for agent, rewards in per_agent.items():
                    returns[agent] += float(rewards[t, b])
                    total += float(rewards[t, b])
                running[b] = (total, length + 1, returns)
                if done[t, b]:
                    ended.append((b, total, length + 1, returns, None))
                    running[b] = (0.0, 0, dict.fromkeys(agents, 0.0))
        return ended

    return next_ends
