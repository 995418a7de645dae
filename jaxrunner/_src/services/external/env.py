"""The :class:`ExternalEnv` facade: the public calls, under one lock."""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import jax
import numpy as np
from gymnasium import spaces

import jaxrunner._src.services.external.checks as checks
from jaxrunner._src.arg_checks import check_bool, check_int
from jaxrunner._src.core.episode import Episode
from jaxrunner._src.core.metrics import EpisodeStats
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.services.external.batching import PolicyBatcher, Row
from jaxrunner._src.services.external.config import ExternalEnvConfig
from jaxrunner._src.services.external.delivery import ActionDelivery
from jaxrunner._src.services.external.endings import EpisodeEndings
from jaxrunner._src.services.external.episodes import EpisodeRecord, EpisodeTable
from jaxrunner._src.services.external.memory import MemoryBudget, estimate_step_nbytes
from jaxrunner._src.services.external.metrics import external_metrics
from jaxrunner._src.services.external.output import EpisodeOutput
from jaxrunner._src.services.external.reaper import Reaper
from jaxrunner._src.services.external.run_thread import RunDriven, RunThread
from jaxrunner._src.space_arrays import check_value
from jaxrunner.errors import ClosedError, EpisodeConflictError, InvalidArgumentError


class ExternalEnv(RunDriven):
    """Serves a policy to episodes that are stepped elsewhere (see docs/serving.md).

    Args:
        observation_space: one episode's observation space.
        action_space: one episode's action space.
        policy: the :class:`~jaxrunner.Policy` that picks actions.
        params: its params.
        seed: action keys derive from it, the episode id and the step index, so the
            same requests get the same actions whatever the batching.
        config: limits and batching (:class:`ExternalEnvConfig`).

    Subclass and override :meth:`run` to drive episodes from a thread of your own,
    started with :meth:`start` (as RLlib's ExternalEnv).
    """

    multi_agent: ClassVar[Literal[False]] = False
    """The kind of env (see :attr:`RunDriven.multi_agent`): one agent per episode."""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        policy: Policy,
        params: Params,
        *,
        seed: int = 0,
        config: ExternalEnvConfig | None = None,
    ) -> None:
        checks.check_construction(observation_space, action_space, policy, seed)
        self.observation_space = observation_space
        self.action_space = action_space
        self.policy = policy
        self.seed = int(seed)
        self.config = config = config or ExternalEnvConfig()
        self._lock = threading.Lock()
        self._episodes = EpisodeTable(config.max_concurrent, config.max_episodes_per_client)
        self._memory = MemoryBudget(
            config.max_memory_bytes,
            estimate_step_nbytes(policy, params, observation_space, action_space),
        )
        self._output = EpisodeOutput(self._lock, self._memory, config.max_output_episodes)
        self._stats = EpisodeStats(config.episode_window)
        self._counts: collections.Counter[str] = collections.Counter()
        self._started_at = time.monotonic()
        self._closed = False
        carry = policy.batched_carry(1)
        self._initial_carry = (
            None if carry is None else jax.tree.map(lambda c: np.array(c[0]), carry)
        )
        self._batcher = PolicyBatcher(
            policy,
            params,
            observation_space,
            action_space,
            self.seed,
            max_batch=config.max_batch,
            max_wait_s=config.max_wait_ms / 1000.0,
            buckets=config.bucket_sizes,
            ready_hint=lambda: len(self._episodes),
        )
        self._delivery = ActionDelivery(
            self._lock,
            self._batcher,
            self._episodes,
            self._memory,
            self._counts,
            config.action_timeout_s,
        )
        self._endings = EpisodeEndings(
            self._lock,
            self._episodes,
            self._memory,
            self._counts,
            self._stats,
            observation_space,
            action_space,
            self._emit,
        )
        self._reaper = (
            None
            if config.episode_timeout_s is None
            else Reaper(config.episode_timeout_s, self.reap)
        )
        self._run_thread = RunThread()

    # -- episodes -----------------------------------------------------------------------------

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
            self._memory.check(1, "start_episode")
            live = self._episodes.open(episode_id, client, training_enabled, self._initial_carry)
            self._counts["num_started_episodes"] += 1
            return live.episode_id

    def get_action(self, episode_id: int, obs: Any) -> Any:
        """The policy's action for ``obs`` (on-policy). Blocks until computed.

        Raises:
            SpaceMismatchError: ``obs`` does not fit the observation space.
            EpisodeNotFoundError / EpisodeConflictError: see :meth:`submit_action`.
            TimeoutError: the action took longer than ``action_timeout_s``.
        """
        return self._delivery.wait(self.submit_action(episode_id, obs))

    def log_action(self, episode_id: int, obs: Any, action: Any) -> None:
        """Records that ``action``, chosen elsewhere, was taken at ``obs`` (off-policy).
        Stored as given, with its log-prob under the current params. Blocks until
        recorded."""
        self._delivery.wait(self.submit_log_action(episode_id, obs, action))

    def submit_action(self, episode_id: int, obs: Any) -> concurrent.futures.Future:
        """Like :meth:`get_action`, without waiting: the future resolves to the action."""
        obs = checks.check_obs(self.observation_space, obs, "obs")
        return self._submit(episode_id, obs, None, "get_action")

    def submit_log_action(
        self, episode_id: int, obs: Any, action: Any
    ) -> concurrent.futures.Future:
        """Like :meth:`log_action`, without waiting: the future resolves to ``None``."""
        obs = checks.check_obs(self.observation_space, obs, "obs")
        action = check_value(self.action_space, action, "action", bounds=False)
        return self._submit(episode_id, obs, action, "log_action")

    def log_returns(
        self, episode_id: int, reward: float, info: dict[str, Any] | None = None
    ) -> None:
        """Adds ``reward`` to the reward of the episode's latest action.

        ``info`` is accepted for compatibility with RLlib's API and must be a dict or
        None; Episodes have no info field, so it is not stored.
        """
        checks.check_returns(reward, info)
        with self._lock:
            live = self._get_live(episode_id, "log_returns")
            if live.num_actions == 0:
                raise EpisodeConflictError(
                    f"log_returns(episode_id={episode_id}): the episode has no action yet; a "
                    "reward belongs to the action it followed. Call get_action or log_action first."
                )
            live.pending_reward += float(reward)
            live.last_seen = time.monotonic()

    def end_episode(self, episode_id: int, obs: Any, *, truncated: bool = False) -> None:
        """Ends the episode at its final observation ``obs``: terminated, or truncated
        (cut short: bootstrap from ``obs``) if ``truncated``.

        The episode is gone from the live ones at once (later calls for it get
        ``EpisodeNotFoundError(ended=True)``); stacking it into an Episode happens in
        the calling thread without the env's lock, so other episodes' calls go on
        meanwhile. It counts in the metrics and is output when this returns."""
        obs = checks.check_obs(self.observation_space, obs, "obs")
        check_bool("end_episode", "truncated", truncated)
        with self._lock:
            live = self._get_live(episode_id, "end_episode")
            live.close_at(obs)
            self._episodes.remove(live)
        self._endings.finish(live, terminated=not truncated, truncated=bool(truncated))

    def log_steps(
        self,
        episode_id: int,
        obs: Sequence[Any],
        actions: Sequence[Any],
        rewards: Sequence[float],
    ) -> None:
        """Records several steps taken elsewhere at once: for each ``t``,
        ``log_action(obs[t], actions[t])`` then ``log_returns(rewards[t])``. Every value
        is checked before anything is recorded; feed-forward policies score all steps
        in one go. Used by clients that compute actions themselves."""
        checked_obs, checked_actions = checks.check_steps(
            self.observation_space, self.action_space, obs, actions, rewards
        )
        if not obs:
            return
        if self.policy.initial_carry is not None:  # recurrent: each step needs the last carry
            for t in range(len(obs)):
                self._delivery.wait(
                    self._submit(episode_id, checked_obs[t], checked_actions[t], "log_steps")
                )
                self.log_returns(episode_id, float(rewards[t]))
            return
        # Feed-forward: rows are independent, so one request.
        with self._lock:
            live = self._claim(episode_id, len(obs), "log_steps")
            first = live.num_actions
            rows = [
                Row(o, a, live.episode_id, first + t, None)
                for t, (o, a) in enumerate(zip(checked_obs, checked_actions))
            ]
        future = self._delivery.submit_many(live, rows, [float(r) for r in rewards])
        self._delivery.wait(future)

    # -- output and params --------------------------------------------------------------------

    def poll_episodes(self) -> list[Episode]:
        """Takes every finished training episode not yet taken, in the order they ended."""
        return self._output.poll()

    def sample_episodes(self, num_episodes: int, timeout_s: float | None = None) -> list[Episode]:
        """Waits until ``num_episodes`` training episodes have ended and takes them.

        Raises:
            TimeoutError: fewer ended within ``timeout_s`` (none are taken then).
        """
        check_int("ExternalEnv.sample_episodes", "num_episodes", num_episodes)
        return self._output.take(num_episodes, timeout_s)

    def set_params(self, params: Params) -> int:
        """Replaces the params from the next batch on (never recompiles); returns the
        new params version."""
        return self._batcher.set_params(params)

    def get_params(self) -> tuple[Params, int]:
        """The current params and their version (0 for those given at construction)."""
        return self._batcher.get_params()

    def get_spaces(self) -> dict[str, spaces.Space]:
        return {"observation_space": self.observation_space, "action_space": self.action_space}

    def get_metrics(self) -> dict[str, Any]:
        """Counters since construction and recent-episode statistics.

        Keys: ``num_env_steps`` (completed transitions, training or not),
        ``num_episodes`` (ended, training or not; from ``num_episodes`` on, the
        same recent-window statistics as EnvRunner's), ``num_training_episodes``,
        ``num_live_episodes``, ``num_started_episodes``, ``num_abandoned_episodes``
        (ended by the reaper), ``num_dropped_steps`` (also ``num_undelivered_actions``:
        actions computed or asked for that never reached their agent, never recorded),
        ``memory_bytes`` (held by live and unpolled episodes, against
        ``max_memory_bytes``), ``num_faulty_episodes``, ``num_batches``,
        ``num_policy_rows``, ``mean_batch_size``, ``num_traces``,
        ``params_version``, ``env_steps_per_s`` and ``perf.inference_ms`` (per batch).
        """
        with self._lock:
            metrics = external_metrics(
                self._counts,
                self._stats,
                len(self._episodes),
                self._memory.used,
                [self._batcher],
                time.monotonic() - self._started_at,
            )
        metrics["params_version"] = self._batcher.get_params()[1]
        return metrics

    # -- closing (run/start/join: RunDriven) -------------------------------------------------

    def close(self) -> None:
        """Stops the batcher and the reaper; live episodes stay unfinished (counted in
        ``num_live_episodes``) and later calls raise ``ClosedError``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._batcher.close()
        if self._reaper is not None:
            self._reaper.close()

    def __enter__(self) -> ExternalEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------

    def _get_live(self, episode_id: Any, what: str) -> EpisodeRecord:
        """The live, idle episode ``episode_id`` (caller holds the lock)."""
        self._check_open(what)
        return self._episodes.get_idle(episode_id, what)

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise ClosedError(
                f"ExternalEnv.{what}() called after close(); create a new ExternalEnv."
            )

    def _claim(self, episode_id: Any, steps: int, what: str) -> EpisodeRecord:
        """Marks the live, idle episode busy for ``steps`` more steps (caller holds
        the lock); :class:`.delivery.ActionDelivery` marks it idle again."""
        live = self._get_live(episode_id, what)
        limit = self.config.max_episode_steps
        if live.num_actions + steps > limit:
            raise InvalidArgumentError(
                f"{what}(episode_id={live.episode_id}): the episode would exceed "
                f"max_episode_steps={limit}; end it (truncated=True) and start a new one."
            )
        live.reserved = self._memory.reserve(steps, what)
        live.busy = True
        live.last_seen = time.monotonic()
        return live

    def _submit(
        self, episode_id: int, obs: Any, action: Any, what: str
    ) -> concurrent.futures.Future:
        """Requests one step for ``episode_id``: sampled if ``action`` is None, else logged."""
        with self._lock:
            live = self._claim(episode_id, 1, what)
            row = Row(obs, action, live.episode_id, live.num_actions, live.carry)
        return self._delivery.submit(live, row)

    def retract_action(self, episode_id: int, future: concurrent.futures.Future) -> bool:
        """The action ``future`` (from :meth:`submit_action` or
        :meth:`submit_log_action`) never reached the agent (it disconnected before
        the answer went out): if it is still the episode's latest step, removes that
        step, counted in ``num_dropped_steps``. Cancels the future if it is pending.
        Returns whether anything was taken back."""
        return self._delivery.retract(episode_id, future)

    def _emit(self, live: EpisodeRecord, episode: Episode | None) -> None:
        """Outputs an ended episode (caller holds the lock); ``None`` if it had no step.
        Training episodes go to :meth:`poll_episodes`; others only count. The policy
        client overrides it to report local episodes to its server."""
        if episode is None or not live.training_enabled:
            return
        self._counts["num_training_episodes"] += 1
        self._counts["num_dropped_steps"] += self._output.put(episode)

    def reap(self, idle_since: float) -> int:
        """Ends every idle episode last seen before ``idle_since`` (``time.monotonic()``
        clock) as truncated at its last observation, dropping its step in wait of an
        outcome; returns how many. Runs by itself every so often (the reaper)."""
        return self._endings.reap(idle_since)
