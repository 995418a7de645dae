"""Helpers shared by the multi-agent external-env and serving tests: PettingZoo envs
driven by hand through the external API (an env or a client: the same calls), with
references built from what the env itself returned."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

import jaxrunner as jr
from jaxrunner._src.services.external import ExternalEnvConfig, MultiAgentExternalEnv
from jaxrunner._src.testing.envs import ComingAndGoing, Relay
from jaxrunner.models import mlp_policy


@dataclasses.dataclass
class Ref:
    """One agent's episode as the env gave it: rewards between two of its actions
    go onto the first; before its first action, onto that action."""

    obs: list[Any] = dataclasses.field(default_factory=list)
    actions: list[int] = dataclasses.field(default_factory=list)
    rewards: list[float] = dataclasses.field(default_factory=list)
    env_steps: list[int] = dataclasses.field(default_factory=list)
    pending: float = 0.0
    terminated: bool = False
    truncated: bool = False

    def act(self, obs: Any, action: int, env_step: int) -> None:
        if self.actions:
            self.rewards.append(self.pending)
            self.pending = 0.0
        self.obs.append(obs)
        self.actions.append(int(action))
        self.env_steps.append(env_step)

    def end(self, obs: Any, terminated: bool, truncated: bool) -> None:
        self.rewards.append(self.pending)
        self.obs.append(obs)
        self.terminated, self.truncated = terminated, truncated


def make_env(pz_env: Any, **kwargs: Any) -> MultiAgentExternalEnv:
    agents = pz_env.possible_agents
    policy = mlp_policy(pz_env.action_space(agents[0]), hidden=(8,))
    params = policy.init(jax.random.key(0), pz_env.observation_space(agents[0]))
    kwargs.setdefault("config", ExternalEnvConfig(max_batch=8, buckets=(8,)))
    return MultiAgentExternalEnv.from_pettingzoo(pz_env, policy, {"policy_0": params}, **kwargs)


def play_parallel(
    env: MultiAgentExternalEnv, seed: int, pz: ComingAndGoing, episode_id: int | None = None
) -> dict[str, Ref]:
    """One ComingAndGoing episode through ``env``; the references of its agents."""
    refs: dict[str, Ref] = {}
    obs, _ = pz.reset(seed=seed)
    eid = env.start_episode(episode_id)
    acting, t = dict(obs), 0
    while acting:
        actions = env.get_action(eid, acting)
        assert set(actions) == set(acting)
        for agent, agent_obs in acting.items():
            refs.setdefault(agent, Ref()).act(agent_obs, actions[agent], t)
        obs, rewards, terms, truncs, _ = pz.step({a: int(actions[a]) for a in acting})
        env.log_returns(eid, rewards)
        for agent, reward in rewards.items():
            refs.setdefault(agent, Ref()).pending += reward
        for flag in (False, True):  # terminated ones, then truncated ones
            ended = {a: obs[a] for a in obs if (truncs.get(a) if flag else terms.get(a))}
            if ended:
                # (numpy's bool, as read from an env's arrays: clients take it as envs do)
                env.end_agents(eid, ended, truncated=np.bool_(flag))
                for agent in ended:
                    refs[agent].end(obs[agent], not flag, flag)
        acting = {a: obs[a] for a in pz.agents}
        t += 1
    env.end_episode(eid, {})
    return refs


def play_turns(env: MultiAgentExternalEnv, seed: int) -> dict[str, Ref]:
    """One Relay episode (turn-based) through ``env``; the references of its agents."""
    pz, refs, ended, calls = Relay(), {}, set(), 0
    pz.reset(seed=seed)
    eid = env.start_episode()
    for agent in pz.agent_iter():
        obs, _, term, trunc, _ = pz.last()
        if term or trunc:
            env.end_agents(eid, {agent: obs}, truncated=bool(trunc and not term))
            refs[agent].end(obs, bool(term), bool(trunc and not term))
            ended.add(agent)
            pz.step(None)
        else:
            action = env.get_action(eid, {agent: obs})[agent]
            refs.setdefault(agent, Ref()).act(obs, action, calls)
            calls += 1
            pz.step(int(action))
        rewards = {a: r for a, r in pz.rewards.items() if a in pz.agents and a not in ended}
        env.log_returns(eid, rewards)
        for a, r in rewards.items():
            refs.setdefault(a, Ref()).pending += r
    env.end_episode(eid, {})
    return refs


def assert_matches(episodes: list[jr.AgentEpisode], refs: dict[str, Ref]) -> None:
    """The agent episodes are exactly the references (every agent that acted, once)."""
    by_agent = {e.agent_id: e for e in episodes}
    assert len(by_agent) == len(episodes)
    assert set(by_agent) == {a for a, r in refs.items() if r.actions}
    for agent, episode in by_agent.items():
        ref = refs[agent]
        np.testing.assert_array_equal(episode.obs, np.stack(ref.obs))
        np.testing.assert_array_equal(episode.action, np.array(ref.actions))
        assert episode.reward.tolist() == ref.rewards  # exact: same sums, same order
        assert episode.env_step.tolist() == ref.env_steps
        assert (episode.terminated, episode.truncated) == (ref.terminated, ref.truncated)
        assert episode.length == len(ref.actions) and episode.is_complete
        assert episode.extras["log_prob"].shape == (episode.length,)
        assert episode.policy_id == "policy_0"
