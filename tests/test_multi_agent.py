"""Multi-agent sampling of PettingZoo parallel envs, checked against the envs stepped
by hand: exact equality, every action once, no reward lost, no fabricated transition."""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("pettingzoo")

import jaxrunner as jr
from jaxrunner.errors import ClosedError, InvalidArgumentError, SpaceMismatchError
from tests import multi_agent_envs as envs_mod


@functools.cache  # one object per kind: runners built again reuse its compiled step
def random_policy(num_actions: int, masked: bool = False) -> jr.Policy:
    """Uniform over the actions (within ``obs['action_mask']`` when ``masked``), with a
    param ``w`` that shifts the logits, so new params change the actions."""

    def apply_fn(params, obs, carry, keys):
        if masked:
            logits = jnp.where(obs["action_mask"] > 0, 0.0, -jnp.inf)
        else:
            logits = jnp.zeros((obs.shape[0], num_actions))
        logits = logits + params["w"]
        action = jax.vmap(jax.random.categorical)(keys, logits)
        log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], 1)[:, 0]
        return action, {"log_prob": log_prob}, carry

    return jr.Policy(apply_fn)


def zero_params(num_actions: int) -> dict:
    return {"w": jnp.zeros(num_actions)}


def assert_split_samples_equal_one(
    factory, num_actions: int, seed: int, length: int, count: int
) -> None:
    """``count`` samples of ``length`` steps, joined along time, equal one sample of
    ``count * length`` steps (fresh runners on two ``factory`` sub-envs, random policy)."""

    def collect(length: int, count: int) -> jr.MultiAgentTrajectory:
        envs = jr.make_multi_agent_vec(factory, 2)
        policy, params = random_policy(num_actions), zero_params(num_actions)
        with jr.EnvRunner(envs, policy, params, length, seed=seed) as runner:
            parts = [runner.sample() for _ in range(count)]
        return jax.tree.map(lambda *x: np.concatenate(x), *parts)

    split, whole = collect(length, count), collect(length * count, 1)
    jax.tree.map(np.testing.assert_array_equal, split, whole)


def replay_parallel(factory, traj: jr.MultiAgentTrajectory, seed: int) -> float:
    """Steps each env by hand with the trajectory's actions and checks every field of
    every slot: an agent's reward is what the env gave it since its last action (since
    the episode began, for its first). Returns the rewards left when an episode ended
    (no action carries them)."""
    ((pid, group),) = traj.groups.items()
    agents = traj.agents[pid]
    unassigned = 0.0
    for b in range(traj.num_envs):
        env = factory()
        obs, _ = env.reset(seed=jr.env_seeds(seed, traj.num_envs)[b])
        carried: dict[str, float] = {}
        for t in range(traj.num_steps):
            acting = list(env.agents)
            # Exactly the agents that act have a slot at t, and nobody else.
            valid = {agents[a] for a in np.flatnonzero(group.valid[t, b])}
            assert valid == set(acting), (t, b, valid, acting)
            actions = {a: group.action[t, b, agents.index(a)] for a in acting}
            for a in acting:
                np.testing.assert_array_equal(group.obs[t, b, agents.index(a)], obs[a])
            obs, rewards, terms, truncs, _ = env.step(actions)
            for a, r in rewards.items():
                carried[a] = carried.get(a, 0.0) + r
            for a in acting:
                k = agents.index(a)
                assert group.reward[t, b, k] == carried.pop(a)
                assert group.terminated[t, b, k] == terms[a]
                assert group.truncated[t, b, k] == truncs[a]
                np.testing.assert_array_equal(group.next_obs[t, b, k], obs[a])
            # Slots of absent agents hold nothing.
            absent = [k for k, a in enumerate(agents) if a not in acting]
            assert not group.reward[t, b, absent].any()
            assert not group.next_obs[t, b, absent].any()
            if not env.agents:
                assert traj.env_done[t, b]
                unassigned += sum(carried.values())
                carried.clear()
                obs, _ = env.reset()
            else:
                assert not traj.env_done[t, b]
    return unassigned


@pytest.mark.parametrize("factory", [envs_mod.simple_spread, envs_mod.coming_and_going])
def test_parallel_matches_env_stepped_by_hand(factory):
    envs = jr.make_multi_agent_vec(factory, 3)
    n = envs.groups[0].action_space.n
    with jr.EnvRunner(envs, random_policy(n), zero_params(n), 23, seed=5) as runner:
        traj = runner.sample()
        unassigned = replay_parallel(factory, traj, seed=5)
        assert runner.get_metrics()["unassigned_reward"] == unassigned


@pytest.mark.parametrize(
    ("factory", "masked"), [(envs_mod.simple_spread, False), (envs_mod.connect_four, True)]
)
def test_actions_are_recorded_in_the_envs_dtype_as_a_single_agents_are(factory, masked):
    """The policy computes int32 (JAX's default); each group records what its env got,
    Discrete's int64, as a single-agent env's trajectory does."""
    envs = jr.make_multi_agent_vec(factory, 2)
    n = envs.groups[0].action_space.n
    with jr.EnvRunner(envs, random_policy(n, masked), zero_params(n), 4, seed=0) as runner:
        traj = runner.sample()
        episodes = runner.sample_episodes(1)
    for g in envs.groups:
        assert traj.groups[g.policy_id].action.dtype == g.action_space.dtype == np.int64
    assert episodes[0].action.dtype == np.int64
    single = jr.make_vec("CartPole-v1", 2)
    with jr.EnvRunner(single, random_policy(2), zero_params(2), 4, seed=0) as runner:
        assert runner.sample().action.dtype == single.single_action_space.dtype


def test_agents_that_leave_get_no_transition_and_rewards_are_kept():
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2)
    runner = jr.EnvRunner(envs, random_policy(3), zero_params(3), 16, seed=0)
    traj = runner.sample()
    group = traj.groups["policy_0"]
    # a0 acts at steps 0-2 of each episode only, a3 never.
    assert group.valid[:, :, 3].sum() == 0
    for b in range(2):
        episode_steps = traj.step[:, b]
        np.testing.assert_array_equal(group.valid[:, b, 0], episode_steps < 3)
        np.testing.assert_array_equal(group.valid[:, b, 2], episode_steps >= 2)
        # a2's first transition starts its agent episode.
        first = np.flatnonzero(group.valid[:, b, 2] & (traj.step[:, b] == 2))
        np.testing.assert_array_equal(group.agent_step[first, b, 2], 0)
    # The 0.5 a2 gets before it ever acts is carried onto its first transition (as
    # RLlib does; replay_parallel checks the sums): nothing is left apart.
    assert np.count_nonzero(group.valid[:, :, 2] & (group.agent_step[:, :, 2] == 0)) >= 3
    assert runner.get_metrics()["unassigned_reward"] == 0.0
    runner.stop()


def test_same_seed_same_trajectory_and_new_params_change_actions():
    def run(w):
        envs = jr.make_multi_agent_vec(envs_mod.simple_spread, 2)
        with jr.EnvRunner(envs, random_policy(5), zero_params(5), 12, seed=1) as r:
            first = r.sample()
            r.set_params({"w": jnp.asarray(w, jnp.float32)}, "policy_0")
            return first, r.sample()

    a1, a2 = run(np.zeros(5))
    # The dict a runner is built with, keyed by policy id, is named (one policy at a time).
    envs = jr.make_multi_agent_vec(envs_mod.simple_spread, 2)
    with jr.EnvRunner(envs, random_policy(5), zero_params(5), 12, seed=1) as r:
        with pytest.raises(InvalidArgumentError, match=r"set_params\(params\[policy_id\]"):
            r.set_params({"policy_0": zero_params(5)})
        np.testing.assert_array_equal(r.get_params()["w"], np.zeros(5))
    b1, b2 = run(np.zeros(5))
    c1, c2 = run(np.array([0, 0, 0, 0, 50.0]))
    jax.tree.map(np.testing.assert_array_equal, (a1, a2), (b1, b2))
    jax.tree.map(np.testing.assert_array_equal, a1, c1)
    assert (c2.groups["policy_0"].action == 4).all()
    assert not (a2.groups["policy_0"].action == 4).all()


def test_split_samples_equal_one_long_sample():
    assert_split_samples_equal_one(envs_mod.coming_and_going, 3, seed=3, length=5, count=6)


def test_episodes_per_agent_match_the_trajectory():
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2)
    with jr.EnvRunner(envs, random_policy(3), zero_params(3), 4, seed=0) as runner:
        episodes = runner.sample_episodes(6)
        metrics = runner.get_metrics()
    first = [e for e in episodes if e.episode_id == episodes[0].episode_id]
    assert [e.agent_id for e in first] == ["a0", "a1", "a2"]
    assert [e.length for e in first] == [3, 5, 4]
    assert [(e.terminated, e.truncated) for e in first] == [
        (True, False),
        (False, True),
        (True, False),
    ]
    for e in episodes:
        assert e.obs.shape == (e.length + 1, 3)
        np.testing.assert_array_equal(e.obs[1:, 0], e.env_step + 1)  # obs carry the env step
        # As a jr.Episode's (total_reward: its first name, kept).
        assert e.total_return == e.total_reward == float(np.sum(e.reward))
    assert metrics["agents"]["a3"]["num_agent_steps"] == 0
    assert metrics["num_agent_steps"] == sum(
        metrics["agents"][a]["num_agent_steps"] for a in ("a0", "a1", "a2")
    )
    assert metrics["num_agent_steps"] > metrics["num_env_steps"]


def test_sample_episodes_come_by_env_episode_then_agent_across_samples():
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2)
    with jr.EnvRunner(envs, random_policy(3), zero_params(3), 4, seed=0) as runner:
        episodes = runner.sample_episodes(12)
    keys = [(e.episode_id, envs.possible_agents.index(e.agent_id)) for e in episodes]
    assert keys == sorted(keys) and len(set(keys)) == 12


def test_sample_episodes_after_a_plain_sample_returns_only_what_the_env_did():
    # The agent episodes under way at a plain sample() lost steps to it: sample_episodes
    # must not join their earlier part to their later one.
    factory = envs_mod.coming_and_going
    envs = jr.make_multi_agent_vec(factory, 2)
    with jr.EnvRunner(envs, random_policy(3), zero_params(3), 2, seed=0) as runner:
        episodes = runner.sample_episodes(3)
        for _ in range(2):
            runner.sample()
            episodes += runner.sample_episodes(6)
        num_steps = runner.get_metrics()["num_env_steps"] // 2
    # The reference: the same run as one sample, checked against the env by hand.
    envs = jr.make_multi_agent_vec(factory, 2)
    with jr.EnvRunner(envs, random_policy(3), zero_params(3), num_steps, seed=0) as ref:
        reference = ref.sample()
    replay_parallel(factory, reference, seed=0)
    whole = {(e.episode_id, e.agent_id): e for e in reference.split_episodes()}
    for episode in episodes:
        expected = whole[episode.episode_id, episode.agent_id]
        assert expected.is_complete and episode.is_complete
        jax.tree.map(np.testing.assert_array_equal, episode, expected)


def test_close_is_stop():
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2)
    runner = jr.EnvRunner(envs, random_policy(3), zero_params(3), 4, seed=0)
    runner.sample()
    runner.close()
    with pytest.raises(ClosedError):
        runner.sample()
    with pytest.raises(ClosedError):  # the envs are closed too
        envs.reset_batch([0, 1])


def test_policy_mapping_groups_and_space_checks():
    envs = jr.make_multi_agent_vec(envs_mod.simple_adversary, 2)
    assert [g.agents for g in envs.groups] == [("adversary_0",), ("agent_0", "agent_1")]
    envs.close()
    with pytest.raises(SpaceMismatchError, match="adversary_0"):
        jr.make_multi_agent_vec(envs_mod.simple_adversary, 2, policy_mapping_fn=lambda a: "one")
    mapping = {"a0": "left", "a1": "right", "a2": "right", "a3": "left"}
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2, policy_mapping_fn=mapping.get)
    assert [(g.policy_id, g.agents) for g in envs.groups] == [
        ("left", ("a0", "a3")),
        ("right", ("a1", "a2")),
    ]
    policies = {"left": random_policy(3), "right": random_policy(3)}
    params = {"left": zero_params(3), "right": {"w": jnp.array([0.0, 0.0, 50.0])}}
    with jr.EnvRunner(envs, policies, params, 10, seed=0) as runner:
        traj = runner.sample()
        with pytest.raises(InvalidArgumentError, match="no such policy"):
            runner.set_params(zero_params(3), "middle")
        with pytest.raises(SpaceMismatchError):
            runner.set_params(zero_params(4), "left")
        with pytest.raises(InvalidArgumentError, match="Name one: this runner has several"):
            runner.set_params(zero_params(3))
        with pytest.warns(DeprecationWarning, match="old order"):
            runner.set_params("left", {"w": jnp.array([0.0, 7.0, 0.0])})
        assert float(runner.get_params("left")["w"][1]) == 7.0
    right = traj.groups["right"]
    assert (right.action[right.valid] == 2).all()
    assert traj.groups["left"].obs.shape == (10, 2, 2, 3)


def test_gae_on_group_arrays():
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2)
    with jr.EnvRunner(envs, random_policy(3), zero_params(3), 12, seed=0) as runner:
        group = runner.sample().groups["policy_0"]
    out = jr.gae(
        reward=group.reward,
        terminated=group.terminated,
        truncated=group.truncated,
        valid=group.valid,
        value=jnp.zeros(group.reward.shape),
        next_value=jnp.zeros(group.reward.shape),
        gamma=1.0,
        lam=1.0,
    )
    # With zero values and gamma = lam = 1, the advantage is the reward to go of the
    # agent's episode inside the batch: check one agent by hand.
    b, a = 0, 2
    rows = np.flatnonzero(group.valid[:, b, a])
    expected, acc = [], 0.0
    for t in rows[::-1]:
        acc = group.reward[t, b, a] + (0.0 if group.terminated[t, b, a] else acc)
        expected.append(acc)
    np.testing.assert_allclose(out.advantages[rows, b, a], expected[::-1], rtol=1e-6)
    assert not np.asarray(out.advantages)[~group.valid].any()


def test_runner_refuses_bad_arguments():
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 1)
    with pytest.raises(InvalidArgumentError, match="policy ids"):
        jr.EnvRunner(envs, {"x": random_policy(3)}, zero_params(3), 4, seed=0)
    runner = jr.EnvRunner(envs, random_policy(3), zero_params(3), 4, seed=0)
    with pytest.raises(InvalidArgumentError, match="another live"):
        jr.EnvRunner(envs, random_policy(3), zero_params(3), 4, seed=0)
    runner.stop()
    with pytest.raises(jr.errors.ClosedError):
        runner.sample()
    with pytest.raises(InvalidArgumentError, match="backend"):
        jr.make_multi_agent_vec(envs_mod.coming_and_going, 1, backend="gpu")


def test_policy_pool_one_member_per_agent_episode_and_no_recompile():
    """Members that always play action k: each agent's actions in an episode are one
    member's, the member drawn per episode follows the weights, and new pool contents
    do not retrace."""
    traces = []

    def fixed(params, obs, carry, keys):
        traces.append(1)  # runs only while tracing
        action = jnp.broadcast_to(params["k"], keys.shape).astype(jnp.int32)
        return action, {"log_prob": jnp.zeros(keys.shape)}, carry

    policy = jr.multi_agent.pooled_policy(jr.Policy(fixed), 4)
    members = [{"k": jnp.int32(k)} for k in range(3)]
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 4)
    for bad in ([1.0, float("nan"), 1.0], [float("inf"), 1.0, 1.0]):
        with pytest.raises(InvalidArgumentError, match="finite weight"):
            jr.multi_agent.pool_params(members, 4, bad)
    pool = jr.multi_agent.pool_params(members, 4)
    with jr.EnvRunner(envs, policy, pool, 30, seed=0) as runner:
        traj = runner.sample()
        first = traj.groups["policy_0"]
        traced = len(traces)
        runner.set_params(jr.multi_agent.pool_params(members, 4, [0, 0, 1]), "policy_0")
        second = runner.sample().groups["policy_0"]
        assert len(traces) == traced
    valid = first.valid
    np.testing.assert_array_equal(first.action[valid], first.extras["member"][valid])
    assert set(np.unique(first.action[valid])) == {0, 1, 2}
    # Constant within each agent episode.
    episodes = traj.split_episodes()
    assert len(episodes) > 20
    assert all(len(np.unique(e.action)) == 1 for e in episodes)
    # After the switch, every agent episode that starts draws member 2 only.
    starts = second.valid & (second.agent_step == 0)
    assert starts.sum() > 4 and (second.action[starts] == 2).all()


def test_host_sampler_makes_only_explicit_transfers():
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2)
    with jr.EnvRunner(envs, random_policy(3), zero_params(3), 8, seed=0) as runner:
        runner.sample()  # warm-up outside the guard
        with jax.transfer_guard("disallow"):
            traj = runner.sample()
    assert traj.groups["policy_0"].valid.any()


def test_multi_agent_runner_is_a_deprecated_name_of_env_runner():
    """jr.MultiAgentRunner warns and is an EnvRunner: the same trajectory bits."""

    def run(cls):
        envs = jr.make_multi_agent_vec(envs_mod.simple_spread, 2)
        with cls(envs, random_policy(5), zero_params(5), 12, seed=1) as runner:
            assert isinstance(runner, jr.EnvRunner) and runner.multi_agent
            return runner.sample()

    with pytest.warns(DeprecationWarning, match="EnvRunner takes multi-agent envs too"):
        old = run(jr.MultiAgentRunner)
    jax.tree.map(np.testing.assert_array_equal, old, run(jr.EnvRunner))


def test_agent_episode_ends_and_steps_match_a_step_by_step_reference():
    """The vectorised episode close equals the running sums and step counters kept
    step by step."""
    from jaxrunner._src.samplers.episode_ids import agent_episode_ends

    def reference(ret, length, reward, valid, done, t):
        slots, returns, lengths = [], [], []
        steps = np.zeros(reward.shape, np.int64)
        for s in range(t):
            steps[s] = np.where(valid[s], length, 0)
            ret += np.where(valid[s], reward[s], 0.0)
            length += valid[s]
            ends = valid[s] & done[s]
            slots.append(np.nonzero(ends)[1])
            returns.append(ret[ends])
            lengths.append(length[ends])
            ret[ends], length[ends] = 0.0, 0
        if not slots:
            return np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64), steps
        return np.concatenate(slots), np.concatenate(returns), np.concatenate(lengths), steps

    rng = np.random.default_rng(0)
    for _ in range(200):
        T, B, A = rng.integers(1, 10, size=3)
        reward = rng.normal(size=(T, B, A))
        valid = rng.random((T, B, A)) < 0.7
        done = rng.random((T, B, A)) < rng.uniform(0, 0.6)
        t = int(rng.integers(0, T + 1))
        ret, length = rng.normal(size=(B, A)), rng.integers(0, 5, (B, A))
        ours, theirs = (ret.copy(), length.copy()), (ret.copy(), length.copy())
        steps = np.zeros(reward.shape, np.int64)
        got = agent_episode_ends(*ours, reward, valid, done, t, steps=steps)
        want = reference(*theirs, reward, valid, done, t)
        np.testing.assert_array_equal(steps, want[3])
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_allclose(got[1], want[1], rtol=0, atol=1e-12)
        np.testing.assert_array_equal(got[2], want[2])
        np.testing.assert_allclose(ours[0], theirs[0], rtol=0, atol=1e-12)
        np.testing.assert_array_equal(ours[1], theirs[1])


def test_iterate_is_the_runners_one_loop():
    policies = {"policy_0": random_policy(3)}
    with jr.EnvRunner(
        jr.make_multi_agent_vec(envs_mod.coming_and_going, 2), policies,
        {"policy_0": zero_params(3)}, 5, seed=0,
    ) as runner:  # fmt: skip
        trajs = list(runner.iterate(2))
        # With reuse, each trajectory is released when the loop asks for the next one.
        trajs += [jax.tree.map(np.copy, t) for t in runner.iterate(2, reuse_buffers=True)]
    assert [type(t).__name__ for t in trajs] == ["MultiAgentTrajectory"] * 4
    for before, after in itertools.pairwise(trajs):  # the episodes went on
        assert after.step[0].tolist() != before.step[0].tolist()


def test_one_factory_per_sub_env_as_make_vec_takes():
    built: list[int] = []

    def factory(i):
        def make():
            built.append(i)
            return envs_mod.coming_and_going()

        return make

    envs = jr.make_multi_agent_vec([factory(0), factory(1)], 2, seed=0)
    assert built == [0, 1]
    envs.close()
    with pytest.raises(InvalidArgumentError, match=r"1 factories for 2 sub-envs"):
        jr.make_multi_agent_vec([factory(0)], 2)
    with pytest.raises(TypeError, match=r"env\[1\] is a int"):  # (the alias calls make_vec)
        jr.make_multi_agent_vec([factory(0), 3], 2)


def test_out_of_range_agent_action_names_the_sub_env_and_the_agent():
    pytest.importorskip("pettingzoo")
    from tests.multi_agent_envs import simple_spread

    with jr.make_vec(simple_spread, 2, backend="sync") as envs:
        envs.reset_batch([0, 1])
        (group,) = envs.groups
        actions = np.zeros((2, group.num_agents), np.int64)
        actions[1, 2] = 99
        with pytest.raises(jr.errors.InvalidActionError) as caught:
            envs.step_batch([actions])
    message = str(caught.value)
    assert (
        f"actions[{group.policy_id!r}]: sub-env 1 agent {group.agents[2]!r}'s action 99" in message
    )
    assert f"(row {group.num_agents + 2} of the batch) is outside Discrete(5)" in message


_RELEASE_CASES = {  # factory, num_actions, masked, runner options
    "agents come and go": (envs_mod.coming_and_going, 3, False, {}),
    "aec, every info": (envs_mod.tictactoe_with_infos, 9, True, {"info_keys": "all"}),
    "connectors": (
        envs_mod.simple_spread,
        5,
        False,
        {"connectors": jr.connectors.Connectors(obs=[jr.connectors.NormalizeObservation()])},
    ),
}


@pytest.mark.parametrize("case", list(_RELEASE_CASES))
def test_released_buffers_are_reused_and_change_nothing(case):
    factory, n, masked, options = _RELEASE_CASES[case]

    def run(reuse: str) -> tuple[list, set]:
        envs = jr.make_multi_agent_vec(factory, 2)
        got, memory, held = [], set(), []
        with jr.EnvRunner(envs, random_policy(n, masked), zero_params(n), 7, 3, **options) as r:
            for _ in range(4):
                traj = r.sample()
                memory.add(next(iter(traj.groups.values())).reward.ctypes.data)
                got.append(jax.tree.map(np.copy, traj))
                if reuse == "released":
                    r.release(traj)
                elif reuse == "held":  # every sample in memory of its own
                    held.append(traj)
                del traj
        return got, memory

    (fresh, _), (reused, memory) = run("held"), run("released")
    jax.tree.map(np.testing.assert_array_equal, fresh, reused)
    assert len(memory) == 1  # the same memory, sample after sample
    dropped, memory = run("dropped")  # written again once nothing holds them
    jax.tree.map(np.testing.assert_array_equal, fresh, dropped)
    if "info_keys" not in options:  # (info arrays grow as infos report them: never reused)
        assert len(memory) < 4


def test_release_refuses_what_it_did_not_hand_out_multi_agent():
    def runner() -> jr.EnvRunner:
        envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2)
        return jr.EnvRunner(envs, random_policy(3), zero_params(3), 5, seed=0)

    with runner() as r, runner() as other:
        traj = r.sample()
        for wrong in (traj.time_slice(0, 2), jax.tree.map(np.copy, traj), other.sample(), None):
            with pytest.raises(InvalidArgumentError, match=r"release\(traj\): traj is not"):
                r.release(wrong)  # type: ignore[arg-type]
        r.release(traj)
        with pytest.raises(InvalidArgumentError, match="released already"):
            r.release(traj)
        traj = r.sample()
        traj.groups["policy_0"].extras.update(log_prob=np.zeros_like(traj.step, np.float32))
        with pytest.raises(InvalidArgumentError, match="arrays are not those sample"):
            r.release(traj)
        traj = r.sample()
        traj.groups["policy_0"].reward.setflags(write=False)
        with pytest.raises(InvalidArgumentError, match="arrays are not those sample"):
            r.release(traj)
        for t in r.iterate(2, reuse_buffers=True):  # iterate hands each one back
            assert t.groups["policy_0"].valid.shape == (5, 2, 4)


@pytest.mark.parametrize("backend", ["sync", "process", "ray"])
def test_dict_and_tuple_actions_reach_each_agent(backend, request):
    """A group whose action space is a Dict (a Tuple inside): each acting agent's env
    gets its own action, picked leaf by leaf from the group's batch, as recorded (every
    host backend read the batch as one array: an index, a slice, np.asarray)."""

    def apply_fn(params, obs, carry, keys):
        def one(key):
            move, aim = jax.random.split(key)
            return {
                "move": jax.random.randint(move, (), 0, 3),
                "aim": (jax.random.uniform(aim, (), minval=-1.0, maxval=1.0),),
            }

        return jax.vmap(one)(keys), {"log_prob": jnp.zeros(len(keys))}, carry

    config = jr.ProcessConfig(num_workers=2) if backend == "process" else None
    if backend == "ray":
        request.getfixturevalue("local_ray").cloudpickle.register_pickle_by_value(envs_mod)
        config = jr.RayConfig(envs_per_actor=1, num_cpus_per_actor=0.1)
    vec = jr.make_vec(envs_mod.coming_and_going_with_nested_actions, 2, backend, config=config)
    runner = jr.EnvRunner(vec, jr.Policy(apply_fn), {}, 8, seed=0, info_keys=["move", "aim"])
    with runner:
        group = runner.sample().groups["policy_0"]
    infos, valid = group.extras["infos"], group.valid
    assert valid.sum() > 10
    assert (group.extras["infos_present"]["move"] == valid).all()
    np.testing.assert_array_equal(infos["move"][valid], group.action["move"][valid])
    np.testing.assert_array_equal(infos["aim"][valid], group.action["aim"][0][valid])


@pytest.mark.parametrize("factory", [envs_mod.coming_and_going_from_one, envs_mod.relay_from_one])
def test_agents_that_do_not_act_send_actions_inside_a_space_without_zero(factory):
    """Discrete(n, start=1) actions: an agent that does not act at a step (not there
    yet, gone, waiting for its turn) still has a row in its group's batch, which the
    backends check; it holds a value of the space, never the zero the policy step
    leaves in the rows past its last acting one (``chunk_rows=2``: a few per call)."""
    vec = jr.make_vec(factory, 2)
    (group,) = vec.groups
    policy = jr.models.mlp_policy(group.action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), group.observation_space)
    with jr.EnvRunner(vec, policy, params, 8, seed=0, chunk_rows=2) as runner:
        traj = runner.sample().groups[group.policy_id]
    acted = traj.action[traj.valid]
    assert len(acted) > 8 and ((acted >= 1) & (acted <= group.action_space.n)).all()
