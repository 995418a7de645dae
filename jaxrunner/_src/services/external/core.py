"""The core of the external envs: agents in policy groups; ExternalEnv is its one-agent
view, MultiAgentExternalEnv its view with ``{agent_id: value}`` dicts."""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Generic, Self

import jax
import numpy as np

import jaxrunner._src.services.external.checks as checks
from jaxrunner._src.arg_checks import check_bool, check_config, check_int, check_number
from jaxrunner._src.core.agent_groups import AgentGroup, GroupedAgents
from jaxrunner._src.core.episode import Episode
from jaxrunner._src.core.metrics import EpisodeStats
from jaxrunner._src.core.params import params_error
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.services.external.batching import PolicyBatcher, Row
from jaxrunner._src.services.external.config import ExternalEnvConfig
from jaxrunner._src.services.external.delivery import ActionDelivery, Parts
from jaxrunner._src.services.external.endings import EpisodeEndings
from jaxrunner._src.services.external.episodes import AgentRecord, EpisodeRecord, EpisodeTable
from jaxrunner._src.services.external.memory import (
    AGENT_RECORD_BYTES,
    MemoryBudget,
    estimate_step_nbytes,
    tree_nbytes,
)
from jaxrunner._src.services.external.output import E, EpisodeOutput
from jaxrunner._src.services.external.run_thread import RunDriven
from jaxrunner.errors import ClosedError, EpisodeConflictError, InvalidArgumentError


class ExternalEnvCore(RunDriven, GroupedAgents, Generic[E]):
    """The state and shared calls of an external env, which outputs ``E`` (an Episode or
    an AgentEpisode); the views check their arguments before they build it."""

    def __init__(
        self,
        groups: Sequence[AgentGroup],
        policies: Mapping[str, Policy],
        params: Mapping[str, Params],
        seed: int,
        config: ExternalEnvConfig | None,
    ) -> None:
        self.groups = tuple(groups)
        self.config = config = check_config(type(self).__name__, config, ExternalEnvConfig)
        self.seed = int(seed)
        agents = self.possible_agents
        checks.check_key_steps(type(self).__name__, config.max_episode_steps, len(agents))
        self._agent_index = {a: k for k, a in enumerate(agents)}
        self._group_of: dict[str, AgentGroup] = {a: g for g in self.groups for a in g.agents}
        self._lock = threading.Lock()
        self._episodes = EpisodeTable(config.max_concurrent, config.max_episodes_per_client)
        try:  # the policies' first trace: params of another structure fail in it
            step_nbytes = [
                estimate_step_nbytes(
                    policies[g.policy_id], params[g.policy_id], g.observation_space, g.action_space
                )
                for g in self.groups
            ]
        except Exception as err:
            name, space = type(self).__name__, "observation_space"
            instead = params_error(err, policies, params, self.groups, {}, name, space)
            if instead is None:
                raise
            raise instead from err
        self._initial_carry = {pid: _row_carry(p) for pid, p in policies.items()}
        record_nbytes = AGENT_RECORD_BYTES + max(map(tree_nbytes, self._initial_carry.values()))
        self._memory = MemoryBudget(config.max_memory_bytes, max(step_nbytes), record_nbytes)
        self._output: EpisodeOutput[E] = EpisodeOutput(
            self._lock, self._memory, config.max_output_episodes
        )
        self._stats = EpisodeStats(config.episode_window)
        self._counts: collections.Counter[str] = collections.Counter()
        self._started_at = time.monotonic()
        self._closed = False
        self._batchers = self._start_batchers(policies, params)
        self._delivery = ActionDelivery(
            self._lock, self._batchers, self._memory, self._counts, self._answer
        )
        self._endings = EpisodeEndings(
            self._lock,
            self._episodes,
            self._memory,
            self._counts,
            self._stats,
            {g.policy_id: g for g in self.groups},
            self._emit,
        )
        self._stop_reaper = threading.Event()
        self._reaper: threading.Thread | None = None
        if config.episode_timeout_s is not None:
            self._reaper = threading.Thread(
                target=self._reap_loop,
                args=(config.episode_timeout_s,),
                name="jaxrunner-reaper",
                daemon=True,
            )
            self._reaper.start()

    def _start_batchers(
        self, policies: Mapping[str, Policy], params: Mapping[str, Params]
    ) -> dict[str, PolicyBatcher]:
        """A batcher per group's policy (all closed if one fails)."""
        config, batchers = self.config, {}
        try:
            for group in self.groups:
                size = group.num_agents  # at most this many rows per live episode
                batchers[group.policy_id] = PolicyBatcher(
                    policies[group.policy_id],
                    params[group.policy_id],
                    group.observation_space,
                    group.action_space,
                    self.seed,
                    max_batch=config.max_batch,
                    max_wait_s=config.max_wait_ms / 1000.0,
                    buckets=config.buckets,
                    ready_hint=lambda size=size: len(self._episodes) * size,
                    owner=type(self).__name__,
                )
        except BaseException:
            for batcher in batchers.values():
                batcher.close()
            raise
        return batchers

    def start_episode(
        self, episode_id: int | None = None, training_enabled: bool = True, *, client: str = "local"
    ) -> int:
        """Starts an episode and returns its id.

        Args:
            episode_id: an int in ``[0, 2**63)`` not used by a live or recently ended
                episode; None picks the smallest free id from a counter.
            training_enabled: False keeps the episode out of :meth:`poll_episodes`
                (it still counts in the metrics).
            client: who asked (for ``max_episodes_per_client``); its index in order of
                first appearance is the episodes' ``env_id``.

        Raises:
            TooManyEpisodesError: at ``max_concurrent`` (or the client's cap).
            EpisodeConflictError: ``episode_id`` is in use or was used recently.
        """
        checks.check_episode_id(episode_id)
        check_bool("start_episode", "training_enabled", training_enabled)
        with self._lock:
            self._check_open("start_episode")
            self._memory.check(1, "start_episode", records=1)
            live = self._episodes.open(episode_id, client, training_enabled)
            self._opened(live)
            self._counts["num_started_episodes"] += 1
            return live.episode_id

    def _opened(self, live: EpisodeRecord) -> None:
        """A new live episode; by default agents join at first mention."""

    def poll_episodes(self) -> list[E]:
        """Takes every finished training episode not yet taken, in the order they ended."""
        return self._output.poll()

    def sample_episodes(self, num_episodes: int, timeout_s: float | None = None) -> list[E]:
        """Waits until ``num_episodes`` training episodes have ended and takes them.

        Raises:
            TimeoutError: fewer ended within ``timeout_s`` (none are taken then).
            ClosedError: fewer are held and the env is (or gets) closed: none can end.
        """
        check_int(
            f"{type(self).__name__}.sample_episodes",
            "num_episodes",
            num_episodes,
            high=self.config.max_output_episodes,
            hint="no more are held: raise ExternalEnvConfig.max_output_episodes",
        )
        where = f"{type(self).__name__}.sample_episodes"
        check_number(where, "timeout_s", timeout_s, hint="seconds", none="to wait forever")
        return self._output.take(num_episodes, timeout_s, type(self).__name__)

    def retract_action(self, episode_id: int, future: concurrent.futures.Future) -> bool:
        """The actions of ``future`` (from ``submit_action`` or ``submit_log_action``)
        never reached their agents (the client hung up): cancels the future if pending,
        else removes the call's steps if they are still every agent's latest (counted in
        ``num_dropped_steps``; its env step is given again only if no later call came).
        Returns whether anything was taken back. (The future names its episode;
        ``episode_id`` is the caller's.)"""
        return self._delivery.retract(future)

    def reap(self, idle_since: float) -> int:
        """Ends every idle episode last seen before ``idle_since`` (``time.monotonic()``)
        and returns how many: each agent still in it is truncated at its last
        observation, its step awaiting an outcome dropped (``num_dropped_steps``; the
        rewards logged for it go to the step before). The reaper thread calls it."""
        return self._endings.reap(idle_since)

    def close(self) -> None:
        """Stops the batchers and the reaper; live episodes stay unfinished (counted in
        ``num_live_episodes``) and later calls raise ``ClosedError`` (a waiting
        ``sample_episodes`` too; ``poll_episodes`` still takes the episodes held)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._output.close()  # no call can end an episode now: wakes sample_episodes
        for batcher in self._batchers.values():
            batcher.close()
        self._stop_reaper.set()
        if self._reaper is not None:
            self._reaper.join()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _reap_loop(self, timeout_s: float) -> None:
        # Four checks per timeout (at most 25% late), at least one a second.
        while not self._stop_reaper.wait(min(timeout_s / 4, 1.0)):
            self.reap(time.monotonic() - timeout_s)

    def _metrics(self, env_steps_key: str, *counters: str) -> dict[str, Any]:
        """The metrics both views share (see ``ExternalEnv.get_metrics``) and the
        ``counters`` named."""
        batchers = self._batchers.values()
        with self._lock:
            counts, env_steps = self._counts, self._counts[env_steps_key]
            batches = sum(b.num_batches for b in batchers)
            rows = sum(b.num_rows for b in batchers)
            inference_s = sum(b.inference_s for b in batchers)
            elapsed_s = time.monotonic() - self._started_at
            metrics = {
                "num_env_steps": env_steps,
                **self._stats.summary(),
                "num_training_episodes": counts["num_training_episodes"],
                "num_live_episodes": len(self._episodes),
                "num_started_episodes": counts["num_started_episodes"],
                "num_abandoned_episodes": counts["num_abandoned_episodes"],
                "num_dropped_steps": counts["num_dropped_steps"],
                "num_undelivered_actions": counts["num_undelivered_actions"],
                "unassigned_reward": self._endings.unassigned_reward,
                "memory_bytes": self._memory.used,
                "num_faulty_episodes": 0,
                "num_batches": batches,
                "num_policy_rows": rows,
                "mean_batch_size": rows / batches if batches else 0.0,
                "num_traces": sum(b.num_traces for b in batchers),
                "env_steps_per_s": env_steps / elapsed_s if elapsed_s else 0.0,
                "perf": {"inference_ms": 1000.0 * inference_s / batches if batches else 0.0},
            }
            metrics.update({name: counts[name] for name in counters})
        return metrics

    def _check_open(self, what: str) -> None:
        if self._closed:
            name = type(self).__name__
            raise ClosedError(f"{name}.{what}() called after close(); create a new {name}.")

    def _get_live(self, episode_id: Any, what: str, agents: Iterable[str] = ()) -> EpisodeRecord:
        """The live, idle episode ``episode_id``, in which none of ``agents`` has ended."""
        self._check_open(what)
        live = self._episodes.get_idle(episode_id, what)
        ended = [a for a in agents if a in live.agents and live.agents[a].done]
        if ended:
            raise EpisodeConflictError(
                f"{what}(episode_id={live.episode_id}): agents {ended} have ended in this "
                "episode; an agent that ended neither acts nor gets rewards again. Leave them "
                "out."
            )
        return live

    def _join(
        self,
        live: EpisodeRecord,
        agents: Sequence[str],
        what: str,
        steps: int = 0,
    ) -> int:
        """Reserves ``steps`` more steps of each of ``agents`` (returned) and makes the
        records of those not yet in ``live``; nothing changes if they do not fit."""
        new = [a for a in agents if a not in live.agents]
        reserved = self._memory.reserve(len(agents) * steps, what, records=len(new))
        live.nbytes += len(new) * self._memory.record_nbytes
        for agent in new:
            pid = self._group_of[agent].policy_id
            live.agents[agent] = AgentRecord(
                live.episode_id,
                live.env_id,
                live.training_enabled,
                self._initial_carry[pid],
                agent_id=agent,
                policy_id=pid,
                index=self._agent_index[agent],
            )
        return reserved

    def _check_room(
        self, live: EpisodeRecord, agents: Sequence[str], steps: int, what: str
    ) -> None:
        """Raises unless ``steps`` more steps of each of ``agents`` fit ``max_episode_steps``."""
        limit = self.config.max_episode_steps
        full = [
            a for a in agents if a in live.agents and live.agents[a].num_actions + steps > limit
        ]
        if full:
            raise InvalidArgumentError(
                f"{what}(episode_id={live.episode_id}): agents {full} would exceed "
                f"max_episode_steps={limit}; end them (truncated=True) and start a new episode."
            )

    def _claim(
        self, episode_id: int, agents: Sequence[str], steps: int, what: str
    ) -> EpisodeRecord:
        """Marks the live, idle episode busy for ``steps`` more steps of each of
        ``agents``; the delivery marks it idle again."""
        live = self._get_live(episode_id, what, agents)
        self._check_room(live, agents, steps, what)
        live.reserved = self._join(live, agents, what, steps)
        live.busy = True
        live.last_seen = time.monotonic()
        return live

    def _submit(
        self,
        episode_id: int,
        obs: dict[str, Any],
        actions: dict[str, Any] | None,
        what: str,
    ) -> concurrent.futures.Future:
        """Claims the episode and requests one step per agent of ``obs``, sampled if
        ``actions`` is None, else logged."""
        num_agents = len(self._agent_index)
        with self._lock:
            live = self._claim(episode_id, list(obs), 1, what)
            parts: Parts = {}
            for agent, agent_obs in obs.items():
                record = live.agents[agent]
                step = record.num_actions * num_agents + record.index  # unique per agent
                action = None if actions is None else actions[agent]
                row = Row(agent_obs, action, live.episode_id, step, record.carry)
                parts.setdefault(record.policy_id, []).append((record, row))
        return self._delivery.submit(live, parts)

    def _end(self, episode_id: int, obs: dict[str, Any], truncated: bool, what: str) -> None:
        """Ends the episode (``MultiAgentExternalEnv.end_episode``'s contract)."""
        check_bool(what, "truncated", truncated)
        with self._lock:
            live = self._get_live(episode_id, what, obs)
            acted = [a for a, r in live.agents.items() if r.num_actions and not r.done]
            missing = [a for a in acted if a not in obs]
            if missing:
                raise InvalidArgumentError(
                    f"{what}(episode_id={episode_id}): agents {missing} acted and have no "
                    "final observation in obs; pass one for each (or end them earlier with "
                    "end_agents)."
                )
            open_agents = [(a, r) for a, r in live.agents.items() if not r.done]
            ended = [self._endings.close(r, obs.get(a)) for a, r in open_agents]
            self._endings.remove(live)
        self._endings.finish(ended, truncated)

    def _emit(self, record: AgentRecord, episode: Episode | None) -> None:
        """Outputs an ended agent's episode (None: it had no step) under the lock; the
        policy client overrides it."""
        if episode is None or not record.training_enabled:
            return
        self._counts["num_training_episodes"] += 1
        self._counts["num_dropped_steps"] += self._output.put(self._as_output(record, episode))

    def _answer(self, actions: dict[str, Any]) -> Any:
        """What a call's future resolves to, from its sampled ``{agent_id: action}``."""
        return actions

    def _as_output(self, record: AgentRecord, episode: Episode) -> E:
        """What :meth:`poll_episodes` gives for ``record``'s ``episode``."""
        raise NotImplementedError

    def _batcher(self, policy_id: Any, what: str) -> PolicyBatcher:
        """``policy_id``'s batcher (None: the one policy's, where there is one)."""
        if policy_id is None and len(self._batchers) == 1:
            return next(iter(self._batchers.values()))
        batcher = self._batchers.get(policy_id) if isinstance(policy_id, str) else None
        if batcher is None:
            raise InvalidArgumentError(
                f"{what}(policy_id={policy_id!r}): unknown policy id; the env's policies are "
                f"{list(self.policy_ids)}."
                + (" Name one: this env has several." if policy_id is None else "")
            )
        return batcher


def _row_carry(policy: Policy) -> Any:
    """One row's initial recurrent state (numpy), None if feed-forward."""
    carry = policy.batched_carry(1)
    return None if carry is None else jax.tree.map(lambda c: np.array(c[0]), carry)
