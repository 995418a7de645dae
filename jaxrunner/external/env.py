"""The :class:`ExternalEnv` facade: the public calls, under one lock.

The parts live next to it: :mod:`.episodes` (live records, ids), :mod:`.reaper`
(abandoned episodes), :mod:`.config`, and :mod:`jaxrunner.batching` (policy calls).
"""

from __future__ import annotations

import collections
import concurrent.futures
import math
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from gymnasium import spaces

from jaxrunner import spaces as jr_spaces
from jaxrunner.batching import PolicyBatcher, Row, RowResult
from jaxrunner.errors import (
    ActionTimeoutError,
    ClosedError,
    EpisodeConflictError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    SpaceMismatchError,
)
from jaxrunner.external.config import ExternalEnvConfig
from jaxrunner.external.episodes import MAX_EPISODE_ID, EpisodeTable, LiveEpisode
from jaxrunner.external.memory import MemoryBudget, step_nbytes, tree_nbytes
from jaxrunner.external.reaper import Reaper
from jaxrunner.metrics import EpisodeStats
from jaxrunner.policy import Params, Policy
from jaxrunner.spaces import check_value
from jaxrunner.trajectory import Episode


class ExternalEnv:
    """Serves a policy to episodes that are stepped elsewhere (see the module docstring).

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
        for name, space in (
            ("observation_space", observation_space),
            ("action_space", action_space),
        ):
            if not isinstance(space, spaces.Space):
                raise InvalidArgumentTypeError(
                    f"ExternalEnv({name}=...): expected a gymnasium space, got "
                    f"{type(space).__name__}."
                )
            jr_spaces.check_supported(space, name)
        if not isinstance(policy, Policy):
            raise InvalidArgumentTypeError(
                f"ExternalEnv(policy=...): expected a jaxrunner.Policy, got {policy!r}."
            )
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise InvalidArgumentError(f"ExternalEnv(seed={seed!r}): expected an int >= 0.")
        self.observation_space = observation_space
        self.action_space = action_space
        self.policy = policy
        self.seed = int(seed)
        self.config = config = config or ExternalEnvConfig()
        self._lock = threading.Lock()
        self._episodes = EpisodeTable(config.max_concurrent, config.max_episodes_per_client)
        self._memory = MemoryBudget(
            config.max_memory_bytes,
            step_nbytes(observation_space.sample(), action_space.sample(), {}),
        )
        self._output: collections.deque[Episode] = collections.deque()
        self._output_ready = threading.Condition(self._lock)
        self._stats = EpisodeStats(config.episode_window)
        self._counts = collections.Counter()
        self._tickets: weakref.WeakKeyDictionary[concurrent.futures.Future, Row] = (
            weakref.WeakKeyDictionary()
        )
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
        self._reaper = (
            None
            if config.episode_timeout_s is None
            else Reaper(config.episode_timeout_s, self.reap)
        )
        self._run_thread: threading.Thread | None = None
        self._run_error: BaseException | None = None

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
        if episode_id is not None and (
            isinstance(episode_id, bool)
            or not isinstance(episode_id, (int, np.integer))
            or not 0 <= episode_id <= MAX_EPISODE_ID
        ):
            raise InvalidArgumentError(
                f"start_episode(episode_id={episode_id!r}): expected None or an int in [0, 2**63)."
            )
        if not isinstance(training_enabled, (bool, np.bool_)):
            raise InvalidArgumentTypeError(
                f"start_episode(training_enabled={training_enabled!r}): expected a bool."
            )
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
        return self._wait(self.submit_action(episode_id, obs))

    def log_action(self, episode_id: int, obs: Any, action: Any) -> None:
        """Records that ``action``, chosen elsewhere, was taken at ``obs`` (off-policy).
        Stored as given, with its log-prob under the current params. Blocks until
        recorded."""
        self._wait(self.submit_log_action(episode_id, obs, action))

    def submit_action(self, episode_id: int, obs: Any) -> concurrent.futures.Future:
        """Like :meth:`get_action`, without waiting: the future resolves to the action."""
        obs = self._check_obs(obs, "obs")
        return self._submit(episode_id, obs, None, "get_action")

    def submit_log_action(
        self, episode_id: int, obs: Any, action: Any
    ) -> concurrent.futures.Future:
        """Like :meth:`log_action`, without waiting: the future resolves to ``None``."""
        obs = self._check_obs(obs, "obs")
        action = check_value(self.action_space, action, "action", bounds=False)
        return self._submit(episode_id, obs, action, "log_action")

    def log_returns(
        self, episode_id: int, reward: float, info: dict[str, Any] | None = None
    ) -> None:
        """Adds ``reward`` to the reward of the episode's latest action.

        ``info`` is accepted for compatibility with RLlib's API and must be a dict or
        None; Episodes have no info field, so it is not stored.
        """
        if isinstance(reward, (bool, np.bool_)) or not isinstance(
            reward, (int, float, np.integer, np.floating)
        ):
            raise InvalidArgumentTypeError(
                f"log_returns(reward={reward!r}): expected a real number, got "
                f"{type(reward).__name__}."
            )
        if not math.isfinite(float(reward)):
            raise InvalidArgumentError(f"log_returns(reward={reward!r}): rewards must be finite.")
        if info is not None and not isinstance(info, dict):
            raise InvalidArgumentTypeError(
                f"log_returns(info=...): expected a dict or None, got {type(info).__name__}."
            )
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
        (cut short: bootstrap from ``obs``) if ``truncated``."""
        obs = self._check_obs(obs, "obs")
        if not isinstance(truncated, (bool, np.bool_)):
            raise InvalidArgumentTypeError(
                f"end_episode(truncated={truncated!r}): expected a bool."
            )
        with self._lock:
            live = self._get_live(episode_id, "end_episode")
            live.close_at(obs)
            self._finish(live, terminated=not truncated, truncated=bool(truncated))

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
        if not len(obs) == len(actions) == len(rewards):
            raise InvalidArgumentError(
                f"log_steps(): got {len(obs)} observations, {len(actions)} actions and "
                f"{len(rewards)} rewards; expected one of each per step."
            )
        checked_obs = [self._check_obs(o, f"obs[{t}]") for t, o in enumerate(obs)]
        checked_actions = [
            check_value(self.action_space, a, f"action[{t}]", bounds=False)
            for t, a in enumerate(actions)
        ]
        for t, reward in enumerate(rewards):
            if (
                isinstance(reward, bool)
                or not isinstance(reward, (int, float))
                or not math.isfinite(reward)
            ):
                raise InvalidArgumentError(
                    f"log_steps(): rewards[{t}]={reward!r} is not a finite number."
                )
        if not obs:
            return
        if self.policy.initial_carry is not None:  # recurrent: each step needs the last carry
            for t in range(len(obs)):
                self._wait(
                    self._submit(episode_id, checked_obs[t], checked_actions[t], "log_steps")
                )
                self.log_returns(episode_id, float(rewards[t]))
            return
        future = self._submit_many(
            episode_id, checked_obs, checked_actions, [float(r) for r in rewards]
        )
        self._wait(future)

    # -- output and params --------------------------------------------------------------------

    def poll_episodes(self) -> list[Episode]:
        """Takes every finished training episode not yet taken, in the order they ended."""
        with self._lock:
            episodes = list(self._output)
            self._output.clear()
            self._memory.output = 0
            return episodes

    def sample_episodes(self, num_episodes: int, timeout_s: float | None = None) -> list[Episode]:
        """Waits until ``num_episodes`` training episodes have ended and takes them.

        Raises:
            TimeoutError: fewer ended within ``timeout_s`` (none are taken then).
        """
        if isinstance(num_episodes, bool) or not isinstance(num_episodes, int) or num_episodes < 1:
            raise InvalidArgumentError(
                f"sample_episodes(num_episodes={num_episodes!r}): expected an int >= 1."
            )
        with self._output_ready:
            if not self._output_ready.wait_for(
                lambda: len(self._output) >= num_episodes, timeout_s
            ):
                raise ActionTimeoutError(
                    f"sample_episodes({num_episodes}): only {len(self._output)} episodes ended "
                    f"within {timeout_s} s."
                )
            taken = [self._output.popleft() for _ in range(num_episodes)]
            self._memory.output -= sum(_episode_nbytes(e) for e in taken)
            return taken

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
            batcher = self._batcher
            batches = batcher.num_batches
            elapsed = time.monotonic() - self._started_at
            return {
                "num_env_steps": self._counts["num_env_steps"],
                **self._stats.summary(),
                "num_training_episodes": self._counts["num_training_episodes"],
                "num_live_episodes": len(self._episodes),
                "num_started_episodes": self._counts["num_started_episodes"],
                "num_abandoned_episodes": self._counts["num_abandoned_episodes"],
                "num_dropped_steps": self._counts["num_dropped_steps"],
                "num_undelivered_actions": self._counts["num_undelivered_actions"],
                "memory_bytes": self._memory.used,
                "num_faulty_episodes": 0,
                "num_batches": batches,
                "num_policy_rows": batcher.num_rows,
                "mean_batch_size": batcher.num_rows / batches if batches else 0.0,
                "num_traces": batcher.num_traces,
                "params_version": batcher.get_params()[1],
                "env_steps_per_s": self._counts["num_env_steps"] / elapsed if elapsed else 0.0,
                "perf": {
                    "inference_ms": 1000.0 * batcher.inference_s / batches if batches else 0.0
                },
            }

    # -- the optional run() thread ------------------------------------------------------------

    def run(self) -> None:
        """Override to drive episodes (call start_episode, get_action, ... on self);
        :meth:`start` runs it in a thread of its own."""
        raise NotImplementedError(
            "ExternalEnv.run(): subclass ExternalEnv and override run() to use start(); or "
            "call start_episode/get_action/... from your own threads."
        )

    def start(self) -> None:
        """Runs :meth:`run` in a daemon thread; :meth:`join` waits and re-raises its error."""
        if self._run_thread is not None:
            raise InvalidArgumentError("ExternalEnv.start(): the run() thread was already started.")

        def target() -> None:
            try:
                self.run()
            except BaseException as err:  # handed to join()
                self._run_error = err

        self._run_thread = threading.Thread(
            target=target, name="jaxrunner-external-run", daemon=True
        )
        self._run_thread.start()

    def join(self, timeout_s: float | None = None) -> bool:
        """Waits for the run() thread; returns False if it is still running after
        ``timeout_s``. Re-raises an exception run() raised."""
        if self._run_thread is None:
            return True
        self._run_thread.join(timeout_s)
        if self._run_error is not None:
            error, self._run_error = self._run_error, None
            raise error
        return not self._run_thread.is_alive()

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

    def _check_obs(self, obs: Any, what: str) -> Any:
        """``obs`` checked against the space, and finite: NaN and ±inf are refused
        even where the space is unbounded (no policy can act on them, and a
        recorded one poisons every return computed from it)."""
        obs = check_value(self.observation_space, obs, what, bounds=False)
        for leaf in jax.tree.leaves(obs):  # first: one wording for NaN and ±inf
            if leaf.dtype.kind in "fc" and not np.isfinite(leaf).all():
                raise SpaceMismatchError(
                    f"{what}: expected finite values, got NaN or infinity; observations of "
                    "an external env must be finite, even in unbounded dimensions."
                )
        return check_value(self.observation_space, obs, what, bounds=True)

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise ClosedError(
                f"ExternalEnv.{what}() called after close(); create a new ExternalEnv."
            )

    def _get_live(self, episode_id: Any, what: str) -> LiveEpisode:
        """The live, idle episode ``episode_id`` (caller holds the lock)."""
        self._check_open(what)
        return self._episodes.get_idle(episode_id, what)

    def _claim(self, episode_id: Any, steps: int, what: str) -> LiveEpisode:
        """Marks the live, idle episode busy for ``steps`` more steps (caller holds
        the lock); :meth:`_submit_rows` or its ``on_done`` marks it idle again."""
        live = self._get_live(episode_id, what)
        self._check_room(live, steps, what)
        self._memory.check(steps, what)
        live.busy = True
        live.last_seen = time.monotonic()
        return live

    def _submit(
        self, episode_id: int, obs: Any, action: Any, what: str
    ) -> concurrent.futures.Future:
        with self._lock:
            live = self._claim(episode_id, 1, what)
            row = Row(obs, action, live.episode_id, live.num_actions, live.carry)

        def on_done(results: list[RowResult]) -> Any:
            taken, extras, carry = results[0]
            with self._lock:
                before = live.nbytes
                try:
                    live.record(obs, taken, extras, carry, ticket=row)
                finally:
                    live.busy = False
                    self._charge(live, before, 1)
            return taken if action is None else None

        future = self._submit_rows(live, [row], on_done)
        with self._lock:
            self._tickets[future] = row  # for retract_action
        return future

    def _submit_many(
        self, episode_id: int, obs: list[Any], actions: list[Any], rewards: list[float]
    ) -> concurrent.futures.Future:
        """Logged steps of a feed-forward policy: rows are independent, so one request."""
        with self._lock:
            live = self._claim(episode_id, len(obs), "log_steps")
            first = live.num_actions
            rows = [
                Row(o, a, live.episode_id, first + t, None)
                for t, (o, a) in enumerate(zip(obs, actions))
            ]

        def on_done(results: list[RowResult]) -> None:
            with self._lock:
                before = live.nbytes
                try:
                    for t, (taken, extras, _) in enumerate(results):
                        live.record(obs[t], taken, extras, None)
                        live.pending_reward += rewards[t]
                finally:
                    live.busy = False
                    self._charge(live, before, len(results))

        return self._submit_rows(live, rows, on_done)

    def _submit_rows(
        self, live: LiveEpisode, rows: list[Row], on_done: Callable[[list[RowResult]], Any]
    ) -> concurrent.futures.Future:
        def on_abort(error: BaseException | None) -> None:
            # Nothing was recorded: the episode is free again (a failed policy call
            # never wedges it). Cancelled (None): its waiter gave up, so the action
            # was never delivered; it is counted, never recorded.
            with self._lock:
                live.busy = False
                live.last_seen = time.monotonic()
                if error is None:
                    self._counts["num_dropped_steps"] += len(rows)
                    self._counts["num_undelivered_actions"] += len(rows)

        try:
            return self._batcher.submit(rows, on_done, on_abort)
        except BaseException:
            with self._lock:
                live.busy = False
            raise

    def retract_action(self, episode_id: int, future: concurrent.futures.Future) -> bool:
        """The action ``future`` (from :meth:`submit_action` or
        :meth:`submit_log_action`) never reached the agent (it disconnected before
        the answer went out): if it is still the episode's latest step, removes that
        step, counted in ``num_dropped_steps``. Cancels the future if it is pending.
        Returns whether anything was taken back."""
        if future.cancel():
            return True  # on_abort counts it
        with self._lock:
            live = self._episodes.find(episode_id)
            ticket = self._tickets.get(future)
            before = 0 if live is None else live.nbytes
            if ticket is None or live is None or live.busy or not live.undo(ticket):
                return False
            self._memory.live -= before - live.nbytes
            self._counts["num_dropped_steps"] += 1
            self._counts["num_undelivered_actions"] += 1
            return True

    def _check_room(self, live: LiveEpisode, steps: int, what: str) -> None:
        limit = self.config.max_episode_steps
        if live.num_actions + steps > limit:
            raise InvalidArgumentError(
                f"{what}(episode_id={live.episode_id}): the episode would exceed "
                f"max_episode_steps={limit}; end it (truncated=True) and start a new one."
            )

    def _charge(self, live: LiveEpisode, before: int, steps: int) -> None:
        """Charges the budget for the ``steps`` steps ``live`` recorded since it held
        ``before`` bytes."""
        grown = live.nbytes - before
        self._memory.live += grown
        if grown > 0:
            self._memory.observe_step(grown // steps)

    def _finish(self, live: LiveEpisode, terminated: bool, truncated: bool) -> None:
        """Ends ``live`` (caller holds the lock): counts it and outputs it."""
        self._episodes.remove(live)
        self._memory.live -= live.nbytes
        length = live.num_actions
        self._counts["num_env_steps"] += length
        self._stats.add(np.array([sum(live.rewards)], np.float64), np.array([length]))
        episode = None
        if length:
            episode = live.to_episode(
                self.observation_space,
                self.action_space,
                terminated=terminated,
                truncated=truncated,
            )
        self._emit(live, episode)

    def _emit(self, live: LiveEpisode, episode: Episode | None) -> None:
        """Outputs an ended episode (caller holds the lock); ``None`` if it had no step.
        Training episodes go to :meth:`poll_episodes`; others only count. The policy
        client overrides it to report local episodes to its server."""
        if episode is None or not live.training_enabled:
            return
        self._counts["num_training_episodes"] += 1
        self._output.append(episode)
        self._memory.output += _episode_nbytes(episode)
        if len(self._output) > self.config.max_output_episodes:
            dropped = self._output.popleft()
            self._memory.output -= _episode_nbytes(dropped)
            self._counts["num_dropped_steps"] += dropped.length
        self._output_ready.notify_all()

    def reap(self, idle_since: float) -> int:
        """Ends every idle episode last seen before ``idle_since`` (``time.monotonic()``
        clock) as truncated at its last observation, dropping its step in wait of an
        outcome; returns how many. Runs by itself every so often (the reaper)."""
        with self._lock:
            stale = self._episodes.idle_since(idle_since)
            for live in stale:
                self._counts["num_dropped_steps"] += live.abandon(self.observation_space)
                self._counts["num_abandoned_episodes"] += 1
                self._finish(live, terminated=False, truncated=True)
            return len(stale)

    def _wait(self, future: concurrent.futures.Future) -> Any:
        """The future's result; after ``action_timeout_s`` it is cancelled (never
        recorded, counted in ``num_dropped_steps``) and ActionTimeoutError raised, unless
        it was already being recorded: then the caller gets it after all."""
        try:
            return future.result(timeout=self.config.action_timeout_s)
        except concurrent.futures.TimeoutError:
            if not future.cancel():
                return future.result()  # computed just now: deliver it
            raise ActionTimeoutError(
                "the policy did not answer within action_timeout_s="
                f"{self.config.action_timeout_s} s; the request was withdrawn (nothing "
                "recorded): retry it."
            ) from None


def _episode_nbytes(episode: Episode) -> int:
    """What a finished episode's arrays take (charged until it is polled)."""
    return tree_nbytes(episode.obs, episode.action, episode.reward, episode.extras)


__all__ = ["ExternalEnv"]
