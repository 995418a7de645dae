"""Per-step infos as [T, B] arrays (EnvRunner(info_keys=...)), on every host sampler,
against the infos of gymnasium's own wrappers."""

from __future__ import annotations

import sys

import chex
import gymnasium
import jax
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.models import mlp_policy

T = 48


class Lives(gymnasium.Wrapper):
    """Atari-like ``lives`` in every step's info: one fewer every 5 steps of an episode."""

    def reset(self, **kwargs):
        self.steps = 0
        obs, info = self.env.reset(**kwargs)
        return obs, {**info, "lives": 3}

    def step(self, action):
        self.steps += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, "lives": 3 - self.steps // 5}


def cartpole_with_infos() -> gymnasium.Env:
    env = gymnasium.make("CartPole-v1", max_episode_steps=20)
    return Lives(gymnasium.wrappers.RecordEpisodeStatistics(env))


def run(backend: str, config=None, **kwargs) -> jr.Trajectory:
    envs = jr.make_vec(cartpole_with_infos, 4, backend=backend, config=config)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    keys = ("lives", "episode.r", "episode.l")
    with jr.EnvRunner(envs, policy, params, T, seed=1, info_keys=keys, **kwargs) as runner:
        return runner.sample()


@pytest.fixture(scope="module")
def sync_traj() -> jr.Trajectory:
    return run("sync")


def test_infos_match_what_the_wrappers_returned(sync_traj):
    traj = sync_traj
    infos, present = traj.extras["infos"], traj.extras["infos_present"]
    done = traj.terminated | traj.truncated
    assert done.any() and not done.all()
    # Every step has lives (the final info where an episode ended: its own step count).
    assert present["lives"].all()
    np.testing.assert_array_equal(infos["lives"], 3 - (traj.step + 1) // 5)
    # RecordEpisodeStatistics reports the episode where it ends, and only there.
    np.testing.assert_array_equal(present["episode.r"], done)
    np.testing.assert_array_equal(present["episode.l"], done)
    np.testing.assert_array_equal(infos["episode.l"][done], traj.step[done] + 1)
    for episode in traj.split_episodes():
        if episode.is_complete:  # the return the wrapper counted is the episode's own
            assert episode.extras["infos"]["episode.r"][-1] == episode.reward.sum()
    assert infos["lives"].dtype == np.float64 and present["lives"].dtype == np.bool_


@pytest.mark.parametrize("ready_first", [False, True])
def test_the_process_backend_records_the_same_arrays(sync_traj, ready_first):
    config = jr.ProcessConfig(num_workers=2, ready_first=ready_first)
    traj = run("process", config)
    np.testing.assert_array_equal(traj.action, sync_traj.action)
    for part in ("infos", "infos_present"):
        for key, values in sync_traj.extras[part].items():
            np.testing.assert_array_equal(traj.extras[part][key], values, err_msg=key)


def test_without_info_keys_nothing_is_recorded():
    envs = jr.make_vec(cartpole_with_infos, 2)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, 4, seed=0) as runner:
        assert "infos" not in runner.sample().extras


def test_a_non_numeric_entry_is_refused_naming_the_env_and_key():
    envs = jr.make_vec(cartpole_with_infos, 2)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    runner = jr.EnvRunner(envs, policy, params, T, seed=0, info_keys=("episode",))
    with runner, pytest.raises(InvalidArgumentError, match=r"sub-env \d's info\['episode'\]"):
        runner.sample()


@pytest.mark.parametrize("backend", ["sync", "process"])
def test_a_misspelt_name_is_refused_with_the_names_the_infos_had(backend):
    envs = jr.make_vec(cartpole_with_infos, 2, backend=backend)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    keys = ("lives", "episode.r", "live", "episode.R")
    runner = jr.EnvRunner(envs, policy, params, 8, seed=0, info_keys=keys)
    with runner:
        # No error before an episode ended: end-of-episode entries have not had their chance.
        first = runner.sample()
        assert not first.done.any()
        with pytest.raises(InvalidArgumentError, match=r"\['episode.R', 'live'\]") as info:
            for _ in range(4):  # episodes of at most 20 steps
                runner.sample()
    for name in ("'lives'", "'episode'", "'episode.r'", "'episode.l'"):
        assert name in str(info.value)
    partial = info.value.partial_trajectory  # the sample is not lost
    assert partial.num_steps == 8 and partial.done.any()
    assert partial.extras["infos_present"]["lives"].all()


def test_an_end_of_episode_name_waits_for_the_first_episode_end():
    envs = jr.make_vec(cartpole_with_infos, 2)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, 3, seed=0, info_keys=("episode.l",)) as runner:
        trajs = [runner.sample() for _ in range(10)]
    joined = jr.concatenate(trajs)
    assert not trajs[0].done.any() and joined.done.any()
    np.testing.assert_array_equal(joined.extras["infos_present"]["episode.l"], joined.done)


@pytest.mark.parametrize("bad", ["lives", ("lives", "lives"), ("",), (3,)])
def test_bad_info_keys_are_refused(bad):
    envs = jr.make_vec(cartpole_with_infos, 2)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with pytest.raises(InvalidArgumentError, match="info_keys"):
        jr.EnvRunner(envs, policy, params, 4, seed=0, info_keys=bad)
    jr.EnvRunner(envs, policy, params, 4, seed=0).stop()  # the envs were not claimed


# -- info_keys="all" -------------------------------------------------------------------------

ALL_KEYS = ["episode.l", "episode.r", "episode.t", "lives"]
WALL_CLOCK = "episode.t"  # RecordEpisodeStatistics' seconds: its mask is compared, not values


def run_all(backend: str, config=None, length: int = T, samples: int = 1):
    if backend == "gymnasium":  # a gymnasium vector env of these sub-envs, adopted
        envs = jr.from_gymnasium(gymnasium.vector.SyncVectorEnv([cartpole_with_infos] * 4))
    else:
        envs = jr.make_vec(cartpole_with_infos, 4, backend=backend, config=config)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, length, seed=1, info_keys="all") as runner:
        return [runner.sample() for _ in range(samples)]


def by_hand(traj: jr.Trajectory, seed: int = 1) -> tuple[dict, dict]:
    """Every info entry of ``cartpole_with_infos`` sub-envs stepped by hand with the
    trajectory's actions (same-step autoreset: the final step's info where an episode
    ends), as ``[T, B]`` values and masks."""
    num_steps, num_envs = traj.reward.shape
    values: dict[str, np.ndarray] = {}
    present: dict[str, np.ndarray] = {}
    for b, seed_b in enumerate(jr.env_seeds(seed, num_envs)):
        env = cartpole_with_infos()
        obs, _ = env.reset(seed=seed_b)
        for t in range(num_steps):
            np.testing.assert_array_equal(traj.obs[t, b], obs)
            obs, _, terminated, truncated, info = env.step(int(traj.action[t, b]))
            flat = {f"episode.{k}": v for k, v in info.pop("episode", {}).items()} | info
            for name, value in flat.items():
                values.setdefault(name, np.zeros((num_steps, num_envs)))[t, b] = value
                present.setdefault(name, np.zeros((num_steps, num_envs), bool))[t, b] = True
            if terminated or truncated:
                obs, _ = env.reset()
    return values, present


def assert_infos_equal(traj: jr.Trajectory, values: dict, present: dict) -> None:
    assert list(traj.extras["infos"]) == sorted(values)  # every entry reported, sorted
    for name in values:
        np.testing.assert_array_equal(traj.extras["infos_present"][name], present[name], name)
        if name != WALL_CLOCK:
            np.testing.assert_array_equal(traj.extras["infos"][name], values[name], name)


@pytest.fixture(scope="module")
def sync_all() -> jr.Trajectory:
    return run_all("sync")[0]


def test_all_records_every_entry_the_envs_reported(sync_all):
    values, present = by_hand(sync_all)
    assert sorted(values) == ALL_KEYS and sync_all.done.any()
    assert_infos_equal(sync_all, values, present)


@pytest.mark.parametrize(
    "backend, config",
    [
        ("process", jr.ProcessConfig(num_workers=2)),
        ("process", jr.ProcessConfig(num_workers=2, ready_first=True)),
        ("gymnasium", None),
    ],
    ids=["process", "process-ready-first", "gymnasium-vector"],
)
def test_all_records_the_same_arrays_on_other_backends(sync_all, backend, config):
    traj = run_all(backend, config)[0]
    np.testing.assert_array_equal(traj.action, sync_all.action)
    assert_infos_equal(traj, *by_hand(sync_all))


def test_all_on_ray_records_the_same_arrays(sync_all, local_ray):
    # This module's envs travel to the actors by value (workers cannot import tests/).
    local_ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    traj = run_all("ray", jr.RayConfig(envs_per_actor=2, num_cpus_per_actor=0.1))[0]
    np.testing.assert_array_equal(traj.action, sync_all.action)
    assert_infos_equal(traj, *by_hand(sync_all))


def test_all_entries_first_reported_later_appear_from_that_sample_on():
    # 3-step samples: the first ends no episode, so RecordEpisodeStatistics' entries
    # appear in the sample where one first ends, and stay (absent: present False).
    trajs = run_all("sync", length=3, samples=10)
    k = next(i for i, traj in enumerate(trajs) if traj.done.any())
    assert k > 0 and all(list(t.extras["infos"]) == ["lives"] for t in trajs[:k])
    assert all(list(t.extras["infos"]) == ALL_KEYS for t in trajs[k:])
    whole = run_all("sync", length=30)[0]  # the same steps in one sample
    values, present = by_hand(whole)
    before, after = jr.concatenate(trajs[:k]), jr.concatenate(trajs[k:])
    np.testing.assert_array_equal(before.extras["infos"]["lives"], values["lives"][: 3 * k])
    assert not present["episode.r"][: 3 * k].any()
    for name in ALL_KEYS:
        got = after.extras["infos_present"][name]
        np.testing.assert_array_equal(got, present[name][3 * k :], name)
        if name != WALL_CLOCK:
            np.testing.assert_array_equal(after.extras["infos"][name], values[name][3 * k :], name)


class EpisodeEnds(jr.multi_agent.AgentCallbacks):
    """Each ended episode as ``LiveEpisode.to_episode`` and ``on_agent_episode_end`` see it."""

    def __init__(self):
        self.live, self.joined = [], []

    def on_episode_end(self, runner, env_index, episode):
        self.live.append(episode.to_episode())

    def on_agent_episode_end(self, runner, episode):
        self.joined.append(episode)


def test_all_episodes_across_the_sample_where_entries_first_appear_hold_them():
    # 3-step samples: an episode under way when RecordEpisodeStatistics' entries first
    # appear is joined from pieces with and without them (the earlier steps: not present).
    whole = run_all("sync", length=30)[0]
    values, present = by_hand(whole)
    envs = jr.make_vec(cartpole_with_infos, 4)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    ends = EpisodeEnds()
    with jr.EnvRunner(envs, policy, params, 3, seed=1, info_keys="all", callbacks=ends) as runner:
        episodes = runner.sample_episodes(4)
    assert sorted(e.length for e in episodes) == sorted(e.length for e in ends.joined[:4])
    for episode in [*episodes, *ends.joined, *ends.live]:
        b, steps = episode.env_id, slice(episode.start_step, episode.start_step + episode.length)
        assert list(episode.extras["infos"]) == ALL_KEYS, episode.extras["infos"].keys()
        for name in ALL_KEYS:
            got = episode.extras["infos_present"][name]
            np.testing.assert_array_equal(got, present[name][steps, b], name)
            if name != WALL_CLOCK:
                np.testing.assert_array_equal(
                    episode.extras["infos"][name], values[name][steps, b], name
                )


def test_all_with_a_restore_joins_the_episodes_under_way_at_the_save(tmp_path):
    # The save holds empty info dicts (no entry reported yet), which a checkpoint cannot
    # keep: the episodes under way are joined without them.
    def episodes_after(restore: bool) -> list[int]:
        envs = jr.make_vec("CartPole-v1", 2)
        policy = mlp_policy(envs.single_action_space, hidden=(8,))
        params = policy.init(jax.random.key(0), envs.single_observation_space)
        ends = EpisodeEnds()
        with jr.EnvRunner(envs, policy, params, 7, seed=5, info_keys="all", callbacks=ends) as r:
            if restore:
                assert r.restore(tmp_path / "run.npz", load_env_pickles=True).envs_restored
            else:
                r.sample()
                r.save(tmp_path / "run.npz")
                ends.joined.clear()
            for _ in range(4):
                r.sample()
        return [e.length for e in ends.joined]

    unbroken = episodes_after(restore=False)
    assert unbroken and episodes_after(restore=True) == unbroken


def test_all_restores_kept_finished_episodes_with_their_empty_info_dicts(tmp_path):
    # sample_episodes keeps the finished episodes it did not return; their info dicts are
    # empty (plain CartPole reports no entry), which a checkpoint holds as no leaves.
    def kept_after(restore: bool) -> list[jr.Episode]:
        envs = jr.make_vec("CartPole-v1", 4)
        policy = mlp_policy(envs.single_action_space, hidden=(8,))
        params = policy.init(jax.random.key(0), envs.single_observation_space)
        with jr.EnvRunner(envs, policy, params, 32, seed=5, info_keys="all") as r:
            if restore:
                assert r.restore(tmp_path / "run.npz", load_env_pickles=True).envs_restored
            else:
                r.sample_episodes(1)
                r.save(tmp_path / "run.npz")
            return r.sample_episodes(3)

    unbroken, restored = kept_after(restore=False), kept_after(restore=True)
    assert [e.episode_id for e in restored] == [e.episode_id for e in unbroken]
    for a, b in zip(unbroken, restored):
        assert a.extras["infos"] == {} and a.extras["infos_present"] == {}
        chex.assert_trees_all_equal(a, b)


def test_all_with_reused_buffers_records_what_new_buffers_do():
    envs = jr.make_vec(cartpole_with_infos, 4)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    fresh = run_all("sync", length=6, samples=6)
    with jr.EnvRunner(envs, policy, params, 6, seed=1, info_keys="all") as runner:
        for i, traj in enumerate(runner.iterate(6, reuse_buffers=True)):
            for part in ("infos", "infos_present"):
                assert list(traj.extras[part]) == list(fresh[i].extras[part])
                for name, array in fresh[i].extras[part].items():
                    if name != WALL_CLOCK or part == "infos_present":
                        np.testing.assert_array_equal(traj.extras[part][name], array, name)


class Labelled(gymnasium.Wrapper):
    """Adds a string entry to every step's info after the first two."""

    def reset(self, **kwargs):
        self.steps = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        self.steps += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        return (
            obs,
            reward,
            terminated,
            truncated,
            info | ({"phase": "late"} if self.steps > 2 else {}),
        )


def test_all_refuses_a_non_numeric_entry_naming_it_and_keeps_the_steps_before():
    envs = jr.make_vec(lambda: Labelled(cartpole_with_infos()), 2)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    runner = jr.EnvRunner(envs, policy, params, 8, seed=0, info_keys="all")
    with runner, pytest.raises(InvalidArgumentError) as info:
        runner.sample()
    message = str(info.value)
    assert "sub-env 0's info['phase'] is a str ('late')" in message
    assert "['lives']" in message and "Callbacks.on_episode_step" in message
    partial = info.value.partial_trajectory
    assert partial.num_steps == 2 and partial.extras["infos_present"]["lives"].all()


@pytest.mark.parametrize("mode", [{}, {"batch_size": 1}], ids=["sync", "async"])
def test_all_on_envpool_atari_refuses_ram_and_names_the_entries_to_record(mode):
    pytest.importorskip("envpool")
    envs = jr.make_vec("Breakout-v5", 2, backend="envpool", **mode)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    runner = jr.EnvRunner(envs, policy, params, 8, seed=0, info_keys="all")
    with runner, pytest.raises(InvalidArgumentError, match=r"info\['ram'\] is a ndarray") as info:
        runner.sample()
    named = ["elapsed_step", "env_id", "lives", "players.env_id", "reward", "terminated"]
    assert f"reported so far: {named}" in str(info.value)
    envs = jr.make_vec("Breakout-v5", 2, backend="envpool", **mode)
    with jr.EnvRunner(envs, policy, params, 8, seed=0, info_keys=named) as runner:
        traj = runner.sample()
    present = traj.extras["infos_present"]
    assert all(present[name][traj.valid].all() for name in named)
    np.testing.assert_array_equal(
        traj.extras["infos"]["reward"][traj.valid], traj.reward[traj.valid]
    )


# -- multi-agent envs: the same arrays with an agent axis ------------------------------------


def run_agents(factory, info_keys, length=20, masked=False, num_envs=3, config=None, **kwargs):
    pytest.importorskip("pettingzoo")
    from tests.test_multi_agent import random_policy, zero_params

    backend = "sync" if config is None else "process"
    envs = jr.make_vec(factory, num_envs, backend=backend, config=config)
    n = envs.groups[0].action_space.n
    policy, params = random_policy(n, masked), dict.fromkeys(envs.policy_ids, zero_params(n))
    with jr.EnvRunner(
        envs, policy, params, length, seed=1, info_keys=info_keys, **kwargs
    ) as runner:
        return runner.sample()


def agents_by_hand(factory, traj) -> tuple[dict, dict]:
    """Every info entry of each agent of ``factory``'s parallel sub-envs, stepped by hand
    with the trajectory's actions, at the steps the agent acted in (its transition's):
    ``policy_id -> name -> [T, B, A_g]`` values and masks."""
    values: dict[str, dict] = {pid: {} for pid in traj.groups}
    present: dict[str, dict] = {pid: {} for pid in traj.groups}
    for b, seed_b in enumerate(jr.env_seeds(1, traj.num_envs)):
        env = factory()
        env.reset(seed=seed_b)
        for t in range(traj.num_steps):
            slots = {a: traj.agent(a) for a in env.agents}
            actions = {a: traj.groups[pid].action[t, b, k] for a, (pid, k) in slots.items()}
            _, _, _, _, infos = env.step(actions)
            for a, (pid, k) in slots.items():
                shape = traj.groups[pid].valid.shape
                info = dict(infos[a])
                flat = {f"episode.{k}": v for k, v in info.pop("episode", {}).items()} | info
                for name, value in flat.items():
                    values[pid].setdefault(name, np.zeros(shape))[t, b, k] = value
                    present[pid].setdefault(name, np.zeros(shape, bool))[t, b, k] = True
            if not env.agents:
                env.reset()
    return values, present


@pytest.fixture(scope="module")
def tag_all():
    from tests.multi_agent_envs import simple_tag_with_infos

    return run_agents(simple_tag_with_infos, "all")


def test_multi_agent_infos_match_pettingzoo_stepped_by_hand(tag_all):
    # MPE simple_tag (two groups), each agent's infos at the steps it acted in, through
    # episode ends (max_cycles=8: 'episode.r' first reported at the first one).
    from tests.multi_agent_envs import simple_tag_with_infos

    values, present = agents_by_hand(simple_tag_with_infos, tag_all)
    names = sorted({n for group in values.values() for n in group})
    assert names == ["episode.r", "t", "x"] and tag_all.env_done.any()
    for pid, g in tag_all.groups.items():
        assert list(g.extras["infos"]) == list(g.extras["infos_present"]) == names
        for name in names:
            np.testing.assert_array_equal(g.extras["infos_present"][name], present[pid][name])
            np.testing.assert_array_equal(g.extras["infos"][name], values[pid][name])
        np.testing.assert_array_equal(g.extras["infos_present"]["t"], g.valid)  # every step


def test_multi_agent_named_infos_are_those_of_all_and_the_rest_is_unchanged(tag_all):
    from tests.multi_agent_envs import simple_tag_with_infos

    named = run_agents(simple_tag_with_infos, ("x", "episode.r"))
    plain = run_agents(simple_tag_with_infos, ())
    for pid, g in named.groups.items():
        for part in ("infos", "infos_present"):
            assert list(g.extras[part]) == ["x", "episode.r"]
            for name, array in g.extras[part].items():
                np.testing.assert_array_equal(array, tag_all.groups[pid].extras[part][name])
        # Recording infos changes nothing else, bit for bit; without them, nothing is added.
        assert set(plain.groups[pid].extras) == {"log_prob"}
        mine = g.replace(extras={"log_prob": g.extras["log_prob"]})
        jax.tree.map(np.testing.assert_array_equal, mine, plain.groups[pid])
    for field in ("env_id", "episode_id", "step", "env_done"):
        np.testing.assert_array_equal(getattr(named, field), getattr(plain, field))


@pytest.mark.parametrize(
    "config, kwargs",
    [
        (None, {"num_splits": 3}),
        (jr.ProcessConfig(num_workers=2), {}),
        (jr.ProcessConfig(num_workers=2, ready_first=True), {}),
    ],
    ids=["sync-3-splits", "process", "process-ready-first"],
)
def test_multi_agent_infos_are_the_same_on_every_layout(tag_all, config, kwargs):
    from tests.multi_agent_envs import simple_tag_with_infos

    traj = run_agents(simple_tag_with_infos, "all", config=config, **kwargs)
    jax.tree.map(np.testing.assert_array_equal, traj.groups, tag_all.groups)


def test_multi_agent_turn_based_infos_are_those_of_the_turn_ending_the_transition():
    # tictactoe: a move's transition completes at the player's next turn, and its info
    # is the one PettingZoo's env.last() gives then: the moves so far. At the game's end
    # each player's final transition completes at its dead step, whose info env.last()
    # gives before the dead step removes the player (and its infos): recorded too.
    from tests.multi_agent_envs import tictactoe_with_infos

    traj = run_agents(tictactoe_with_infos, "all", length=30, masked=True)
    (g,) = traj.groups.values()
    assert list(g.extras["infos"]) == ["moves"] and traj.env_done.any()
    np.testing.assert_array_equal(g.extras["infos_present"]["moves"], g.valid)
    ended = g.valid & traj.env_done[:, :, None]
    assert ended.any() and (g.valid & ~traj.env_done[:, :, None]).any()
    moves = np.broadcast_to((traj.step + 1)[:, :, None], g.valid.shape)
    np.testing.assert_array_equal(g.extras["infos"]["moves"], np.where(g.valid, moves, 0))


def test_multi_agent_turn_based_final_infos_match_pettingzoo_by_hand():
    # The reference: env 0's first game replayed by hand with the trajectory's actions;
    # each player's final transition records what PettingZoo's env.last() gave at its
    # dead step.
    from tests.multi_agent_envs import tictactoe_with_infos

    traj = run_agents(tictactoe_with_infos, "all", length=30, masked=True)
    (g,), b = traj.groups.values(), 0
    t_end = int(np.argmax(traj.env_done[:, b]))
    assert traj.env_done[t_end, b]
    env = tictactoe_with_infos()
    env.reset(seed=jr.env_seeds(1, traj.num_envs)[b])
    # Slot [t, b, k] holds the transition agent k completed at step t: its actions in
    # the order it took them.
    moves_of = {
        a: list(g.action[: t_end + 1, b, k][g.valid[: t_end + 1, b, k]])
        for a, k in ((a, traj.agent(a)[1]) for a in env.possible_agents)
    }
    final = {}
    for agent in env.agent_iter():
        _, _, term, trunc, info = env.last()
        if term or trunc:
            final[agent] = info["moves"]
            env.step(None)
        else:
            env.step(int(moves_of[agent].pop(0)))
    assert set(final) == set(env.possible_agents)
    assert not any(moves_of.values())  # every recorded action was taken
    for agent, moves in final.items():
        k = traj.agent(agent)[1]
        assert g.valid[t_end, b, k] and g.extras["infos_present"]["moves"][t_end, b, k]
        assert g.extras["infos"]["moves"][t_end, b, k] == moves


class PhaseInfos:
    """simple_tag with infos, plus a string entry for ``agent_0`` after two steps."""

    def __init__(self):
        from tests.multi_agent_envs import simple_tag_with_infos

        self.env = simple_tag_with_infos()

    def __call__(self):
        env, step = self.env, self.env.step

        def labelled(actions):
            out = step(actions)
            if env.t > 2:
                out[4]["agent_0"]["phase"] = "late"
            return out

        env.step = labelled
        return env


def test_multi_agent_bad_names_and_entries_are_refused_naming_the_agent():
    pytest.importorskip("pettingzoo")
    from tests.multi_agent_envs import simple_tag_with_infos

    with pytest.raises(InvalidArgumentError) as info:
        run_agents(simple_tag_with_infos, ("t", "lifes"))
    message = str(info.value)
    assert "EnvRunner(info_keys=...): no sub-env's info had ['lifes']" in message
    assert "['episode', 'episode.r', 't', 'x']" in message
    assert info.value.partial_trajectory.num_steps == 20  # the sample, kept
    with pytest.raises(InvalidArgumentError) as info:
        run_agents(PhaseInfos(), "all", num_envs=1)
    message = str(info.value)
    assert "agent 'agent_0' of sub-env 0's info['phase'] is a str ('late')" in message
    assert "reported so far: ['t', 'x']" in message and "AgentCallbacks.on_episode_step" in message
    partial = info.value.partial_trajectory
    assert partial.num_steps == 2
    assert partial.groups["policy_1"].extras["infos"]["t"].shape == (2, 1, 1)
    with pytest.raises(InvalidArgumentError, match=r"EnvRunner\(info_keys='t'\)"):
        run_agents(simple_tag_with_infos, "t")


def test_multi_agent_pure_jax_envs_refuse_info_keys():
    from jaxrunner.testing import Drift
    from tests.test_multi_agent import random_policy, zero_params

    envs = jr.JaxVectorEnv(Drift(), num_envs=2)
    with pytest.raises(InvalidArgumentError, match=r"EnvRunner\(info_keys=...\): a pure"):
        jr.EnvRunner(envs, random_policy(3), zero_params(3), 4, seed=0, info_keys="all")
