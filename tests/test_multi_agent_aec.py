"""Turn-based (AEC) PettingZoo envs: only the selected agent acts, rewards between an
agent's turns add up onto its last action, and those before its first action onto its
first (read back against PettingZoo's own ``last()`` and against the env's rewards
summed by hand), action masks are respected, pending turns cross sample boundaries."""

from __future__ import annotations

from typing import ClassVar

import jax
import numpy as np
import pytest

pytest.importorskip("pettingzoo")

from gymnasium import spaces
from pettingzoo import AECEnv

import jaxrunner as jr
from tests import multi_agent_envs as envs_mod
from tests.test_multi_agent import assert_split_samples_equal_one, random_policy, zero_params


def transitions(traj: jr.MultiAgentTrajectory, b: int) -> dict[str, list[dict]]:
    """Each agent's valid slots of env ``b``, in time order."""
    out = {}
    for pid, group in traj.groups.items():
        for k, agent in enumerate(traj.agents[pid]):
            rows = np.flatnonzero(group.valid[:, b, k])
            out[agent] = [
                {
                    "obs": jax.tree.map(lambda x, t=t, k=k: x[t, b, k], group.obs),
                    "action": group.action[t, b, k],
                    "reward": group.reward[t, b, k],
                    "terminated": group.terminated[t, b, k],
                    "truncated": group.truncated[t, b, k],
                    "next_obs": jax.tree.map(lambda x, t=t, k=k: x[t, b, k], group.next_obs),
                    "t": t,
                }
                for t in rows
            ]
    return out


def replay_aec(factory, traj: jr.MultiAgentTrajectory, seed: int) -> tuple[int, float]:
    """Steps each env by hand, taking each agent's actions from its transitions in
    order; checks observations, rewards (PettingZoo's cumulative reward since the
    agent's last action, plus, on its first transition of an episode, what it got
    before its first action) and flags. Returns the number of actions replayed and the
    rewards of agents that left without acting."""
    num_actions, unassigned = 0, 0.0
    for b in range(traj.num_envs):
        queue = transitions(traj, b)
        env = factory()
        env.reset(seed=jr.env_seeds(seed, traj.num_envs)[b])
        pending: dict[str, dict] = {}
        before_first: dict[str, float] = {}  # rewards before an agent's first action
        acted: set[str] = set()
        while any(queue.values()) or pending:
            agent = env.agent_selection
            obs, reward, term, trunc, _ = env.last()
            if agent in pending:  # its last action's transition completes now
                done = pending.pop(agent)
                reward += before_first.pop(agent, 0.0)
                assert done["reward"] == pytest.approx(reward, abs=1e-12), (agent, done["t"])
                assert (done["terminated"], done["truncated"]) == (term, trunc)
                jax.tree.map(np.testing.assert_array_equal, done["next_obs"], obs)
            elif term or trunc:  # it leaves without ever acting
                unassigned += reward
            if term or trunc:
                env.step(None)
            elif not queue[agent]:
                break  # the trajectory ends before this turn
            else:
                if agent not in acted:
                    before_first[agent] = reward
                    acted.add(agent)
                turn = queue[agent].pop(0)
                jax.tree.map(np.testing.assert_array_equal, turn["obs"], obs)
                env.step(turn["action"])
                pending[agent] = turn
                num_actions += 1
            if not env.agents:
                assert not pending and not before_first
                acted.clear()
                env.reset()
        assert not any(queue.values()), "transitions the env never produced"
    return num_actions, unassigned


@pytest.mark.parametrize(
    ("factory", "masked"), [(envs_mod.relay, False), (envs_mod.tictactoe, True)]
)
def test_aec_matches_env_stepped_by_hand(factory, masked):
    envs = jr.make_multi_agent_vec(factory, 2)
    assert envs.turn_based
    n = envs.groups[0].action_space.n
    policy = random_policy(n, masked=masked)
    with jr.EnvRunner(envs, policy, zero_params(n), 40, seed=2) as runner:
        traj = runner.sample()
        metrics = runner.get_metrics()
    num_actions, unassigned = replay_aec(factory, traj, seed=2)
    assert num_actions == metrics["num_agent_steps"] > 0
    assert metrics["unassigned_reward"] == pytest.approx(unassigned, abs=1e-9)


class Resign(AECEnv):
    """Two players, ``p0`` first: its action 0 resigns (``p0`` -1, ``p1`` +1: the game
    ends before ``p1`` ever acts); action 1 passes, paying ``p1`` 0.1 before its first
    action, then ``p1``'s move ends the game (``p0`` +0.5, ``p1`` +0.25 + its action)."""

    metadata: ClassVar[dict] = {"name": "resign_v0", "is_parallelizable": False}

    def __init__(self) -> None:
        super().__init__()
        self.possible_agents = ["p0", "p1"]

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(-np.inf, np.inf, (1,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(2)

    def observe(self, agent: str) -> np.ndarray:
        return np.array([self.moves], np.float32)

    def reset(self, seed=None, options=None):
        self.moves = 0
        self.agents = self.possible_agents[:]
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self.agent_selection = "p0"

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self.moves += 1
        if agent == "p0" and action == 0:
            self.rewards = {"p0": -1.0, "p1": 1.0}
            self.terminations = dict.fromkeys(self.agents, True)
        elif agent == "p0":
            self.rewards = {"p0": 0.0, "p1": 0.1}
            self.agent_selection = "p1"
        else:
            self.rewards = {"p0": 0.5, "p1": 0.25 + float(action)}
            self.terminations = dict.fromkeys(self.agents, True)
        self._accumulate_rewards()
        self._deads_step_first()


def resign() -> Resign:
    return Resign()


def rewards_summed_by_hand(factory, traj: jr.MultiAgentTrajectory, b: int, seed: int):
    """Steps env ``b`` by hand through the episodes that ended within ``traj``, each
    agent's actions taken from its transitions in order, summing ``env.rewards`` after
    every step (dead steps included). Returns, per agent, the rewards it got in those
    episodes (apart: in episodes where it never acted) and its rewards in ``traj``'s
    transitions of those episodes."""
    ends = np.flatnonzero(traj.env_done[:, b])
    assert len(ends) >= 2
    turns = {a: [x for x in xs if x["t"] <= ends[-1]] for a, xs in transitions(traj, b).items()}
    in_traj = {a: sum(x["reward"] for x in xs) for a, xs in turns.items()}
    got = dict.fromkeys(turns, 0.0)
    never_acted = dict.fromkeys(turns, 0.0)
    env = factory()
    env.reset(seed=jr.env_seeds(seed, traj.num_envs)[b])
    episode = dict.fromkeys(turns, 0.0)
    acted: set[str] = set()
    for _ in ends:
        while env.agents:
            agent = env.agent_selection
            if env.terminations[agent] or env.truncations[agent]:
                env.step(None)
            else:
                env.step(turns[agent].pop(0)["action"])
                acted.add(agent)
            for a, r in env.rewards.items():
                episode[a] += r
        for a, r in episode.items():
            (got if a in acted else never_acted)[a] += r
        episode, acted = dict.fromkeys(turns, 0.0), set()
        env.reset()
    assert not any(turns.values()), "transitions the env never produced"
    return got, never_acted, in_traj


@pytest.mark.parametrize("factory", [envs_mod.tictactoe, envs_mod.connect_four, envs_mod.relay])
def test_each_agents_rewards_add_up_to_the_env_rewards_summed_by_hand(factory):
    """Classic games (rewards at the end) and relay (rewards to agents before their
    first action, carried onto it): per agent, the trajectory's rewards are every
    reward the env gave it, and nothing is left apart."""
    envs = jr.make_multi_agent_vec(factory, 2)
    n = envs.groups[0].action_space.n
    masked = factory is not envs_mod.relay
    with jr.EnvRunner(envs, random_policy(n, masked), zero_params(n), 70, 3) as r:
        traj = r.sample()
        assert r.get_metrics()["unassigned_reward"] == 0.0
    for b in range(2):
        got, never_acted, in_traj = rewards_summed_by_hand(factory, traj, b, seed=3)
        assert not any(never_acted.values())
        assert in_traj == pytest.approx(got, abs=1e-9)


def test_rewards_of_an_agent_that_never_acts_are_kept_apart():
    """Resign: when p0 resigns, p1's +1 has no transition to go to (unassigned);
    when p0 passes, p1's 0.1 goes onto its first (and only) transition."""
    envs = jr.make_multi_agent_vec(resign, 2)
    with jr.EnvRunner(envs, random_policy(2), zero_params(2), 40, seed=0) as r:
        traj = r.sample()
        unassigned = r.get_metrics()["unassigned_reward"]
    expected_unassigned = 0.0
    for b in range(2):
        got, never_acted, in_traj = rewards_summed_by_hand(resign, traj, b, seed=0)
        assert in_traj == pytest.approx(got, abs=1e-9)
        assert never_acted["p0"] == 0.0
        expected_unassigned += never_acted["p1"]
    assert unassigned == pytest.approx(expected_unassigned, abs=1e-9)
    assert unassigned >= 1.0  # some games were resigned
    group = traj.groups["policy_0"]
    p1 = group.reward[:, :, 1][group.valid[:, :, 1]]
    assert len(p1) > 0
    np.testing.assert_allclose(np.sort(np.unique(np.round(p1, 9))), [0.35, 1.35])


def test_rewards_between_turns_are_never_lost():
    """Over whole episodes, the rewards in the trajectory add up to every reward the
    env handed out (env-level returns), and only one agent acts per env step."""
    envs = jr.make_multi_agent_vec(envs_mod.relay, 3)
    with jr.EnvRunner(envs, random_policy(4), zero_params(4), 33, seed=0) as runner:
        traj = runner.sample()
    group = traj.groups["policy_0"]
    for b in range(3):
        ends = np.flatnonzero(traj.env_done[:, b])
        assert len(ends) >= 2
        # Relay pays every live agent each step: its 8 turns plus the dead step of r1
        # pay out 8 * live agents + 1 * survivors; every one of those is in some slot.
        for lo, hi in zip(ends[:-1] + 1, ends[1:] + 1):
            per_agent = group.valid[lo:hi, b].sum(0)
            np.testing.assert_array_equal(per_agent, [3, 2, 3])  # r1 leaves after 2 turns
    assert (group.valid.sum(2) <= 3).all()


def test_pending_turns_cross_sample_boundaries():
    assert_split_samples_equal_one(envs_mod.relay, 4, seed=4, length=3, count=10)


def test_actions_stay_within_the_action_mask():
    envs = jr.make_multi_agent_vec(envs_mod.connect_four, 2)
    with jr.EnvRunner(envs, random_policy(7, masked=True), zero_params(7), 60, 0) as r:
        traj = r.sample()
        episodes = r.sample_episodes(4)
    group = traj.groups["policy_0"]
    mask = group.obs["action_mask"]
    t, b, a = np.nonzero(group.valid)
    assert (mask[t, b, a, group.action[t, b, a]] == 1).all()
    # A game's two players end it with opposite (or zero) rewards, never an illegal move.
    for first, second in zip(episodes[::2], episodes[1::2]):
        assert first.episode_id == second.episode_id
        assert first.total_reward == -second.total_reward


def test_gae_on_a_group_chains_each_agents_turns():
    """With zero values and gamma = lam = 1, an agent's advantage is its reward to go
    within its episode, across the other agents' turns; skip_invalid=False (the default
    for the raw arrays) cuts at every gap instead."""
    envs = jr.make_multi_agent_vec(envs_mod.relay, 2)
    with jr.EnvRunner(envs, random_policy(4), zero_params(4), 30, seed=1) as runner:
        group = runner.sample().groups["policy_0"]
    zeros = np.zeros(group.reward.shape)
    out = jr.gae(group, next_value=zeros, value=zeros, gamma=1.0, lam=1.0)
    advantages = np.asarray(out.advantages)
    for b in range(2):
        for a in range(3):
            rows = np.flatnonzero(group.valid[:, b, a])
            expected, acc = [], 0.0
            for t in rows[::-1]:
                done = group.terminated[t, b, a] or group.truncated[t, b, a]
                acc = group.reward[t, b, a] + (0.0 if done else acc)
                expected.append(acc)
            np.testing.assert_allclose(advantages[rows, b, a], expected[::-1], rtol=1e-5)
    assert not advantages[~group.valid].any()
    raw = jr.gae(
        reward=group.reward,
        terminated=group.terminated,
        truncated=group.truncated,
        valid=group.valid,
        value=zeros,
        next_value=zeros,
        gamma=1.0,
        lam=1.0,
    )
    assert not np.allclose(raw.advantages, advantages)
