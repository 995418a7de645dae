"""The runner's per-kind part, chosen once from what the env declares: agents in policy
groups (values by policy id), or one agent, their one-group case (values as they are)."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Mapping
from typing import Any

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.capabilities import is_multi_agent
from jaxrunner._src.backends.jax_env import JaxVectorEnv
from jaxrunner._src.connectors.per_group import per_policy_connectors
from jaxrunner._src.connectors.pipeline import Connectors
from jaxrunner._src.core.agent_groups import DEFAULT_POLICY_ID, ONE_AGENT
from jaxrunner._src.core.episode import (
    AgentEpisode,
    Episode,
    as_agent_episode,
    concatenate_episodes,
)
from jaxrunner._src.core.metrics import MetricsConfig, RunnerMetrics
from jaxrunner._src.core.policy import Params
from jaxrunner._src.core.runner_state import (
    EpisodeJoiner,
    Runner,
    RunnerParts,
    RunnerState,
)
from jaxrunner._src.core.seeds import env_seeds
from jaxrunner._src.runner.env_runner_checks import check_loop_options
from jaxrunner._src.samplers.agent_callbacks import AgentCallbacks, agent_episode_joiner, overrides
from jaxrunner._src.samplers.callbacks import Callbacks
from jaxrunner._src.samplers.host_loop import HostLoop
from jaxrunner._src.samplers.one_agent import OneAgentSampler
from jaxrunner._src.samplers.sampler import SamplerSetup
from jaxrunner._src.samplers.scan import ScanSampler
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError, JaxRunnerError


class AgentGroups:
    """A multi-agent env: agents in policy groups, whose values (params, connectors,
    their state) the runner takes and returns as dicts by policy id."""

    multi_agent = True
    name = "a multi-agent env"
    callbacks_type: type = AgentCallbacks
    callbacks_name = "jaxrunner.multi_agent.AgentCallbacks"
    episode_type: type = AgentEpisode
    file_format = "MultiAgentRunner"  # RunnerParts.file_format
    connectors_hint = " (or a dict policy_id -> Connectors)."

    def __init__(self, envs: Any) -> None:
        self.envs = envs

    def to_policy_dict(self, value: Any, where: str) -> dict[str, Any]:
        ids = self.envs.policy_ids
        if not isinstance(value, Mapping) or not set(value) <= set(ids):
            got = sorted(value, key=str) if isinstance(value, Mapping) else type(value).__name__
            raise InvalidArgumentError(
                f"{where}: this runner's env is multi-agent, so it takes a dict by policy id, "
                f"keyed by some of the policy ids {list(ids)}; got {got}. Check the keys "
                "against envs.policy_ids."
            )
        return dict(value)

    def from_policy_dict(self, values: Mapping[str, Any]) -> Any:
        return dict(values)

    def connectors(self, value: Any) -> tuple[Any, dict[str, Connectors]]:
        """``value`` checked: as ``runner.connectors`` shows it, and by policy id (the
        groups with connectors only)."""
        by_id = per_policy_connectors(value, self.envs.groups)
        return by_id, by_id

    def new_state(self, params: dict[str, Params], metrics: MetricsConfig) -> RunnerState:
        agents = self.envs.possible_agents
        return RunnerState(
            params=params,
            metrics=RunnerMetrics(metrics, {g.policy_id: g.agents for g in self.envs.groups}),
            episodes=agent_episode_joiner(agents),
            callback_episodes=agent_episode_joiner(agents),
        )

    def sampler(self, runner: Runner, num_splits: Any) -> Any:
        """``runner``'s sampler for what the env declares: scan for a pure-JAX env, else
        the kind's host sampler, after the runner's reset."""
        envs, callbacks, seed = self.envs, runner.callbacks, runner.seed
        setup = SamplerSetup(
            dict(runner._policies),
            dict(runner.state.params),
            runner.rollout_length,
            seed,
            runner.state.metrics,
            connectors=runner._connectors,
            info_keys=runner.info_keys,
            compact_next_obs=runner.compact_next_obs,
            by_group=self.multi_agent,
            chunk_rows=runner.chunk_rows,
        )
        if isinstance(envs, JaxVectorEnv):  # one jitted scan per sample
            loop = "a pure-JAX env is sampled as one compiled lax.scan, with no Python per env step"
            check_loop_options(
                self, callbacks, num_splits, loop, "a host vector env (jaxrunner.make_vec)"
            )
            return ScanSampler(envs, setup)
        if getattr(envs, "reset_seed", None) not in (None, seed):
            warnings.warn(
                f"EnvRunner(seed={seed}): these envs were reset with seed="
                f"{envs.reset_seed} (make_vec(..., seed=...) or reset(seed=...)); the runner "
                f"resets them again with its own seed, which decides. Give the seed in one "
                "place: EnvRunner(..., seed=...).",
                UserWarning,
                stacklevel=3,
            )
        first = envs.reset_batch(env_seeds(seed, envs.num_envs))
        if envs.capabilities.ready_first:
            loop = f"{type(envs).__name__} steps whichever sub-envs are ready (ready-first)"
            fix = "a lockstep backend ('sync', or 'process' or 'ray' with ready_first=False)"
            check_loop_options(self, callbacks, num_splits, loop, fix)
        # A proxy: the sampler must not keep its runner alive (one owner per env).
        proxy = weakref.proxy(runner) if callbacks is not None else None
        sampler = self.host_sampler(first, setup, num_splits, callbacks, proxy)
        self.check_policy_actions(sampler.groups)  # before any env is stepped
        return sampler

    def host_sampler(
        self, first: Any, setup: Any, num_splits: Any, callbacks: Any, runner: Any
    ) -> Any:
        """The host sampler from the first reset."""
        return HostLoop(
            self.envs, first, setup, num_splits=num_splits, callbacks=callbacks, runner=runner
        )

    def check_policy_actions(self, samplers: Mapping[str, Any]) -> None:
        """Each group's policy output (``samplers``: its group samplers, by policy id)
        checked against its action space, before any env is stepped."""
        num_envs = self.envs.num_envs
        for g in self.envs.groups:
            sampler, rows = samplers[g.policy_id], num_envs * g.num_agents
            # The policy's output, then what the action connectors make of it (None: none).
            for connectors, spec in enumerate((sampler.action_spec, sampler.env_action_spec)):
                try:
                    if spec is not None:
                        space_arrays.check_policy_actions(g.action_space, spec, rows)
                except JaxRunnerError as err:
                    if connectors:
                        err.add_note(
                            "jaxrunner: these are the action connectors' outputs "
                            "(Connectors(action=[...])): check them against the env's "
                            f"action space {g.action_space}."
                        )
                    if self.multi_agent:  # which group's policy, and the space to build it on
                        err.add_note(
                            f"jaxrunner: the policy of {g.policy_id!r}, whose agents act in "
                            f"{g.action_space!r}, one action per agent slot (B * A_g = "
                            f"{num_envs} * {g.num_agents} rows): build it on that group's "
                            "action_space (envs.groups)."
                        )
                    raise

    def parts(self, runner: Runner) -> RunnerParts:
        """What ``runner``'s checkpoints save and restore."""
        sampler = runner.sampler

        def restart_connectors() -> None:  # e.g. ScaleReward's running returns restart too
            for pid, connectors in runner._connectors.items():
                state = connectors.restart_episodes(sampler.get_connector_state(pid))
                sampler.set_connector_state(state, pid)

        return RunnerParts(
            runner="EnvRunner",
            file_format=self.file_format,
            state=runner.state,
            sampler=sampler,
            envs=self.envs,
            groups=self.envs.groups,
            episode_type=self.episode_type,
            rollout_length=runner.rollout_length,
            seed=runner.seed,
            restart_connectors=restart_connectors,
        )

    def agent_episode_end(self, callbacks: Any) -> Any:
        """An ``AgentCallbacks``' ``on_agent_episode_end``, if overridden (either kind)."""
        hook = "on_agent_episode_end"
        wanted = isinstance(callbacks, AgentCallbacks) and overrides(callbacks, hook)
        return getattr(callbacks, hook) if wanted else None

    def agent_episodes(self, episodes: list[Any]) -> list[AgentEpisode]:
        """The complete episodes of ``state.callback_episodes``, as the hook gets them."""
        return episodes

    def connector_states(self, state: Any, sampler: Any, connectors: dict) -> dict[str, Any]:
        """``set_connector_state``'s ``state``, checked against ``sampler``'s, by policy id."""
        if not isinstance(state, Mapping) or not set(state) <= set(connectors):
            got = sorted(state, key=str) if isinstance(state, Mapping) else type(state).__name__
            raise InvalidArgumentError(
                "EnvRunner.set_connector_state(state): expected a dict keyed by policy "
                f"ids with connectors ({list(connectors)}), got {got}. Start from "
                "runner.get_connector_state()."
            )
        loaded = {}
        for pid, value in state.items():
            try:
                loaded[pid] = connectors[pid].load_state(sampler.get_connector_state(pid), value)
            except JaxRunnerError as err:  # the message names the connector: add the policy
                err.add_note(f"jaxrunner: in the state of policy {pid!r}.")
                raise
        return loaded

    def spaces(self) -> dict[str, Any]:
        groups = self.envs.groups
        return {
            "observation_space": {g.policy_id: g.observation_space for g in groups},
            "action_space": {g.policy_id: g.action_space for g in groups},
        }


class OneAgent(AgentGroups):
    """A single-agent env: one group of one agent, whose values the runner takes and
    returns as they are (no dict, no agent axis)."""

    multi_agent = False
    name = "a single-agent env"
    callbacks_type = Callbacks
    callbacks_name = "jaxrunner.Callbacks"
    episode_type = Episode
    file_format = "EnvRunner"
    connectors_hint = "."

    def to_policy_dict(self, value: Any, where: str) -> dict[str, Any]:
        return {DEFAULT_POLICY_ID: value}

    def from_policy_dict(self, values: Mapping[str, Any]) -> Any:
        return values[DEFAULT_POLICY_ID]

    def connectors(self, value: Any) -> tuple[Any, dict[str, Connectors]]:
        if value is not None and not isinstance(value, Connectors):
            raise InvalidArgumentTypeError(
                f"EnvRunner(connectors=...): expected a jaxrunner.connectors.Connectors, got "
                f"{type(value).__name__}. Wrap them: Connectors(obs=[...], action=[...])."
            )
        return value, {} if value is None else {DEFAULT_POLICY_ID: value}

    def new_state(self, params: dict[str, Params], metrics: MetricsConfig) -> RunnerState:
        def joiner() -> EpisodeJoiner[Episode]:  # one stream per env, by episode id
            return EpisodeJoiner(lambda e: e.env_id, concatenate_episodes, lambda e: e.episode_id)

        return RunnerState(
            params=params,
            metrics=RunnerMetrics(metrics),
            episodes=joiner(),
            callback_episodes=joiner(),
        )

    def host_sampler(
        self, first: Any, setup: Any, num_splits: Any, callbacks: Any, runner: Any
    ) -> Any:
        envs, (obs, _) = self.envs, first
        return OneAgentSampler(
            envs, obs, setup, num_splits=num_splits, callbacks=callbacks, runner=runner
        )

    def agent_episodes(self, episodes: list[Any]) -> list[AgentEpisode]:
        # Joined as Episodes (a checkpoint keeps them as sample_episodes').
        return [as_agent_episode(e, ONE_AGENT, DEFAULT_POLICY_ID) for e in episodes]

    def connector_states(self, state: Any, sampler: Any, connectors: dict) -> dict[str, Any]:
        pid = DEFAULT_POLICY_ID  # checked by Connectors.load_state
        return {pid: connectors[pid].load_state(sampler.get_connector_state(pid), state)}

    def spaces(self) -> dict[str, Any]:
        envs = self.envs
        return {
            "observation_space": envs.single_observation_space,
            "action_space": envs.single_action_space,
            "batched_observation_space": envs.observation_space,
            "batched_action_space": envs.action_space,
        }


def kind_of(envs: Any) -> AgentGroups:
    """The runner's per-kind part for ``envs``, as they declare their kind."""
    return AgentGroups(envs) if is_multi_agent(envs) else OneAgent(envs)
