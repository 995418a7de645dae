"""ExternalEnv: the one-agent view of the external env core."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from gymnasium import spaces

import jaxrunner._src.services.external.checks as checks
from jaxrunner._src.core.agent_groups import AgentGroup
from jaxrunner._src.core.episode import Episode
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.services.external.batching import Row
from jaxrunner._src.services.external.config import ExternalEnvConfig
from jaxrunner._src.services.external.core import ExternalEnvCore
from jaxrunner._src.services.external.delivery import wait_for
from jaxrunner._src.services.external.episodes import AgentRecord, EpisodeRecord
from jaxrunner._src.space_arrays import check_value
from jaxrunner.errors import EpisodeConflictError, InvalidArgumentError

AGENT = "agent"  # the id of an ExternalEnv's one agent and of its policy


class ExternalEnv(ExternalEnvCore[Episode]):
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
        if params is None:
            raise InvalidArgumentError(
                "ExternalEnv(params=None): expected the policy's params, e.g. "
                "policy.init(jax.random.key(0), observation_space) ({} for a policy without "
                "params)."
            )
        self.observation_space = observation_space
        self.action_space = action_space
        self.policy = policy
        group = AgentGroup(AGENT, (AGENT,), observation_space, action_space)
        super().__init__([group], {AGENT: policy}, {AGENT: params}, seed, config)

    def _opened(self, live: EpisodeRecord) -> None:
        self._join(live, [AGENT], "start_episode")  # in it from its start

    def get_action(self, episode_id: int, obs: Any) -> Any:
        """The policy's action for ``obs`` (on-policy). Blocks until computed.

        Raises:
            SpaceMismatchError: ``obs`` does not fit the observation space.
            EpisodeNotFoundError / EpisodeConflictError: see :meth:`submit_action`.
            TimeoutError: the action took longer than ``action_timeout_s``.
        """
        return wait_for(self.submit_action(episode_id, obs), self.config.action_timeout_s)

    def log_action(self, episode_id: int, obs: Any, action: Any) -> None:
        """Records that ``action``, chosen elsewhere, was taken at ``obs`` (off-policy).
        Stored as given, with its log-prob under the current params. Blocks until
        recorded."""
        wait_for(self.submit_log_action(episode_id, obs, action), self.config.action_timeout_s)

    def submit_action(self, episode_id: int, obs: Any) -> concurrent.futures.Future:
        """Like :meth:`get_action`, without waiting: the future resolves to the action."""
        obs = checks.check_obs(self.observation_space, obs, "obs")
        return self._submit(episode_id, {AGENT: obs}, None, "get_action")

    def submit_log_action(
        self, episode_id: int, obs: Any, action: Any
    ) -> concurrent.futures.Future:
        """Like :meth:`log_action`, without waiting: the future resolves to ``None``."""
        obs = checks.check_obs(self.observation_space, obs, "obs")
        action = check_value(self.action_space, action, "action", bounds=False)
        return self._submit(episode_id, {AGENT: obs}, {AGENT: action}, "log_action")

    def log_returns(
        self, episode_id: int, reward: float, info: dict[str, Any] | None = None
    ) -> None:
        """Adds ``reward`` to the reward of the episode's latest action.

        ``info`` is accepted for compatibility with RLlib's API and must be a dict or
        None; Episodes have no info field, so it is not stored.
        """
        checks.check_reward(reward, "reward")
        checks.check_info(info)
        with self._lock:
            live = self._get_live(episode_id, "log_returns")
            record = live.agents[AGENT]
            if record.num_actions == 0:
                raise EpisodeConflictError(
                    f"log_returns(episode_id={episode_id}): the episode has no action yet; a "
                    "reward belongs to the action it followed. Call get_action or log_action first."
                )
            record.pending_reward = record.reward_plus(
                float(reward), f"log_returns(episode_id={episode_id})", "the episode's"
            )
            live.last_seen = time.monotonic()

    def end_episode(self, episode_id: int, obs: Any, *, truncated: bool = False) -> None:
        """Ends the episode at its final observation ``obs``: terminated, or truncated
        (cut short: bootstrap from ``obs``) if ``truncated``. Later calls for it get
        ``EpisodeNotFoundError(ended=True)``; it is output when this returns (stacked
        without the env's lock: other episodes' calls go on meanwhile)."""
        obs = checks.check_obs(self.observation_space, obs, "obs")
        self._end(episode_id, {AGENT: obs}, truncated, "end_episode")

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
        in one go."""
        checked_obs, checked_actions = checks.check_steps(
            self.observation_space, self.action_space, obs, actions, rewards
        )
        if not obs:
            return
        if self.policy.initial_carry is not None:  # recurrent: each step needs the last carry
            with self._lock:  # room for every step first, so a refusal records none
                live = self._get_live(episode_id, "log_steps")
                self._check_room(live, [AGENT], len(obs), "log_steps")
                self._memory.check(len(obs), "log_steps")  # the agent joined at the start
            for t in range(len(obs)):
                future = self._submit(
                    episode_id, {AGENT: checked_obs[t]}, {AGENT: checked_actions[t]}, "log_steps"
                )
                wait_for(future, self.config.action_timeout_s)
                self.log_returns(episode_id, float(rewards[t]))
            return
        # Feed-forward: rows are independent, so one request.
        with self._lock:
            live = self._claim(episode_id, [AGENT], len(obs), "log_steps")
            record = live.agents[AGENT]
            first = record.num_actions
            rows = [
                Row(o, a, live.episode_id, first + t, None)
                for t, (o, a) in enumerate(zip(checked_obs, checked_actions))
            ]
        future = self._delivery.submit_many(live, record, rows, [float(r) for r in rewards])
        wait_for(future, self.config.action_timeout_s)

    def set_params(self, params: Params) -> int:
        """Replaces the params from the next batch on (never recompiles); returns the
        new params version."""
        return self._batchers[AGENT].set_params(params, f"{type(self).__name__}.set_params(params)")

    def get_params(self) -> tuple[Params, int]:
        """The current params and their version (0 for those given at construction)."""
        return self._batchers[AGENT].get_params()

    def get_spaces(self) -> dict[str, spaces.Space]:
        return {"observation_space": self.observation_space, "action_space": self.action_space}

    def get_metrics(self) -> dict[str, Any]:
        """Counters since construction and recent-episode statistics.

        Keys: ``num_env_steps`` (completed transitions, training or not),
        ``num_episodes`` (ended after an action, training or not; from ``num_episodes``
        on, the same recent-window statistics as EnvRunner's), ``num_training_episodes``,
        ``num_live_episodes``, ``num_started_episodes``, ``num_abandoned_episodes``
        (ended by the reaper), ``num_dropped_steps`` (also ``num_undelivered_actions``:
        actions computed or asked for that never reached their agent, never recorded),
        ``unassigned_reward`` (rewards logged that no step carries: those of an episode
        whose only action was retracted or dropped, or whose sum with the step before
        would overflow), ``memory_bytes`` (held by live and unpolled episodes, against
        ``max_memory_bytes``), ``num_faulty_episodes``, ``num_batches``,
        ``num_policy_rows``, ``mean_batch_size``, ``num_traces``,
        ``params_version``, ``env_steps_per_s`` and ``perf.inference_ms`` (per batch).
        """
        metrics = self._metrics("num_agent_steps")  # an agent's steps are the env's
        metrics["params_version"] = self._batchers[AGENT].get_params()[1]
        return metrics

    def _answer(self, actions: dict[str, Any]) -> Any:
        return actions.get(AGENT)  # None for a logged action

    def _as_output(self, record: AgentRecord, episode: Episode) -> Episode:
        return episode
