"""Tests for jaxrunner._src.services.datasets: episodes to Minari and back, checked with Minari's
own reader."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium
import jax
import numpy as np
import pytest
from conftest import ActorCritic, short_cartpole

import jaxrunner as jr

minari = pytest.importorskip("minari")
h5py = pytest.importorskip("h5py")


@pytest.fixture
def datasets_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def sampled() -> tuple[list[jr.Episode], object]:
    """CartPole episodes cut at 20 steps: some terminated, some truncated."""
    envs = jr.make_vec(short_cartpole, num_envs=3)
    policy = jr.Policy.from_linen(ActorCritic(2), envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, rollout_length=16, seed=0) as runner:
        episodes = runner.sample_episodes(8)
        spaces = runner.get_spaces()
    assert any(e.terminated for e in episodes) and any(e.truncated for e in episodes)
    return episodes, spaces


def test_minari_reads_what_to_minari_writes(datasets_path: Path, sampled) -> None:
    episodes, spaces = sampled
    seeds = {episodes[0].episode_id: 123, episodes[2].episode_id: 7}
    jr.to_minari(
        episodes,
        "jaxrunner/cartpole/test-v0",
        observation_space=spaces["observation_space"],
        action_space=spaces["action_space"],
        seeds=seeds,
        algorithm_name="random init",
    )
    dataset = minari.load_dataset("jaxrunner/cartpole/test-v0")
    assert dataset.total_episodes == len(episodes)
    assert dataset.total_steps == sum(e.length for e in episodes)
    for data, episode in zip(dataset.iterate_episodes(), episodes):
        # The reset observation and the true final one, both kept.
        np.testing.assert_array_equal(data.observations, episode.obs)
        assert len(data.observations) == episode.length + 1
        np.testing.assert_array_equal(data.actions, episode.action)
        assert data.actions.dtype == spaces["action_space"].dtype
        np.testing.assert_array_equal(data.rewards, episode.reward)
        # Terminated and truncated stay separate, set at the last step only.
        want_term = np.zeros(episode.length, bool)
        want_trunc = np.zeros(episode.length, bool)
        want_term[-1], want_trunc[-1] = episode.terminated, episode.truncated
        np.testing.assert_array_equal(data.terminations, want_term)
        np.testing.assert_array_equal(data.truncations, want_trunc)
    metadata = list(dataset.storage.get_episode_metadata(range(len(episodes))))
    for meta, episode in zip(metadata, episodes):
        assert meta.get("seed") == seeds.get(episode.episode_id)

    back = jr.from_minari("jaxrunner/cartpole/test-v0")
    assert len(back) == len(episodes)
    for got, want in zip(back, episodes):
        np.testing.assert_array_equal(got.obs, want.obs)
        np.testing.assert_array_equal(got.action, want.action)
        np.testing.assert_array_equal(got.reward, want.reward)
        assert (got.terminated, got.truncated) == (want.terminated, want.truncated)
        assert (got.episode_id, got.env_id) == (want.episode_id, want.env_id)
        assert set(got.extras) == set(want.extras) == {"log_prob", "value"}
        for key in want.extras:
            np.testing.assert_array_equal(got.extras[key], want.extras[key])
        assert got.is_complete


def test_from_minari_reads_a_dataset_minari_collected(datasets_path: Path) -> None:
    """A dataset written by Minari's own DataCollector: no jaxrunner infos."""
    import gymnasium as gym
    from minari import DataCollector

    env = DataCollector(gym.make("CartPole-v1", max_episode_steps=15))
    for seed in range(3):
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            done = terminated or truncated
    env.create_dataset("jaxrunner/collected/test-v0", algorithm_name="random")
    dataset = minari.load_dataset("jaxrunner/collected/test-v0")
    episodes = jr.from_minari(dataset, episode_indices=[0, 2])
    assert [e.episode_id for e in episodes] == [0, 2]
    for episode, data in zip(episodes, dataset.iterate_episodes([0, 2])):
        np.testing.assert_array_equal(episode.obs, data.observations)
        assert episode.length == len(data.rewards) and episode.extras == {}
        assert episode.terminated == bool(data.terminations[-1])
        assert episode.truncated == bool(data.truncations[-1])


def test_faulty_episodes_are_left_out_unless_asked(datasets_path: Path, sampled) -> None:
    episodes, spaces = sampled
    faulty = episodes[1].replace(faulty=True, terminated=False, truncated=True)
    mixed = [episodes[0], faulty, episodes[2]]
    kwargs = dict(
        observation_space=spaces["observation_space"], action_space=spaces["action_space"]
    )
    assert jr.to_minari(mixed, "jaxrunner/faulty/out-v0", **kwargs).total_episodes == 2
    written = jr.to_minari(mixed, "jaxrunner/faulty/in-v0", include_faulty=True, **kwargs)
    assert written.total_episodes == 3
    assert jr.from_minari(written)[1].truncated


def _spaces(sampled) -> dict:
    spaces = sampled[1]
    return dict(observation_space=spaces["observation_space"], action_space=spaces["action_space"])


def test_a_faulty_episode_cut_before_its_first_step_is_left_out(datasets_path, sampled) -> None:
    # A sub-env that fails its first step: a faulty episode of no transition.
    episodes, cut = sampled[0], jax.tree.map(lambda x: x[:0], sampled[0][1])
    empty = cut.replace(obs=episodes[1].obs[:1], faulty=True, terminated=False, truncated=True)
    written = jr.to_minari([episodes[0], empty], "jr/empty/in-v0", include_faulty=True,
                           **_spaces(sampled))  # fmt: skip
    assert written.total_episodes == 1
    np.testing.assert_array_equal(jr.from_minari("jr/empty/in-v0")[0].obs, episodes[0].obs)


def test_a_failed_write_leaves_no_dataset_behind(datasets_path, sampled, monkeypatch) -> None:
    write = minari.create_dataset_from_buffers

    def fails_after_writing(*args, **kwargs):
        write(*args, **kwargs)
        raise OSError("disk full")

    monkeypatch.setattr(minari, "create_dataset_from_buffers", fails_after_writing)
    with pytest.raises(OSError, match="disk full"):
        jr.to_minari(sampled[0], "jr/failed/write-v0", **_spaces(sampled))
    assert "jr/failed/write-v0" not in minari.list_local_datasets()
    monkeypatch.setattr(minari, "create_dataset_from_buffers", write)
    # The id is free again; an existing dataset is never removed.
    jr.to_minari(sampled[0], "jr/failed/write-v0", **_spaces(sampled))
    with pytest.raises(jr.errors.InvalidArgumentError, match="that dataset exists"):
        jr.to_minari(sampled[0], "jr/failed/write-v0", **_spaces(sampled))
    assert "jr/failed/write-v0" in minari.list_local_datasets()


def test_observations_outside_their_box_read_back_as_written(datasets_path, sampled) -> None:
    # Envs may report observations past their Box's bounds; the runner keeps them.
    episode = sampled[0][0]
    obs = np.array(episode.obs)
    obs[:, 0] = 10.0  # CartPole's Box: [-4.8, 4.8]
    wide = episode.replace(obs=obs)
    jr.to_minari([wide], "jr/wide/obs-v0", **_spaces(sampled))
    np.testing.assert_array_equal(jr.from_minari("jr/wide/obs-v0")[0].obs, wide.obs)


def test_an_extras_name_with_a_slash_is_refused_not_read_back_nested(datasets_path, sampled):
    # An info entry named "a/b" (info_keys="all") is stored by Minari as groups a, b:
    # from_minari would return {"a": {"b": ...}}, not what was sampled.
    episode = sampled[0][0]
    flag = np.ones(episode.length, np.float64)
    tagged = episode.replace(extras={**episode.extras, "infos": {"stats/ok": flag}})
    with pytest.raises(ValueError, match=r"extras entry \['infos'\]\['stats/ok'\].*'/'"):
        jr.to_minari([tagged], "jr/slash/refused-v0", **_spaces(sampled))
    assert "jr/slash/refused-v0" not in minari.list_local_datasets()


class ActionInInfo(gymnasium.Wrapper):
    """Reports the action the env received, as info["received"]."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, "received": float(action[0])}


def test_rescaled_actions_are_stored_as_the_env_received_them(datasets_path) -> None:
    from jaxrunner import connectors as C

    def pendulum():
        return ActionInInfo(gymnasium.make("Pendulum-v1", max_episode_steps=9))

    envs = jr.make_vec(pendulum, num_envs=2)
    connectors = C.Connectors(action=[C.RescaleActions.for_space(envs.single_action_space)])
    policy = jr.models.mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, 8, seed=0, connectors=connectors,
                      info_keys=("received",)) as runner:  # fmt: skip
        episodes = runner.sample_episodes(2)
        spaces = _spaces((episodes, runner.get_spaces()))
    jr.to_minari(episodes, "jr/rescaled/actions-v0", connectors=connectors, **spaces)
    for got, episode in zip(jr.from_minari("jr/rescaled/actions-v0"), episodes):
        received = episode.extras["infos"]["received"].astype(np.float32)
        np.testing.assert_array_equal(got.action[:, 0], received)
        assert np.abs(received).max() > 1.0  # the policy's [-1, 1] scale would differ
    with pytest.raises(TypeError, match=r"to_minari\(connectors=3\): expected None or"):
        jr.to_minari(episodes, "jr/rescaled/refused-v0", connectors=3, **spaces)


def test_agent_episodes_are_refused_by_name(datasets_path, sampled) -> None:
    from jaxrunner._src.core.episode import as_agent_episode

    agent_episode = as_agent_episode(sampled[0][0], "agent_0", "default_policy")
    with pytest.raises(ValueError, match=r"AgentEpisode of agent 'agent_0'.*single-agent"):
        jr.to_minari([agent_episode], "jr/agents/refused-v0", **_spaces(sampled))
    assert "jr/agents/refused-v0" not in minari.list_local_datasets()


@pytest.mark.parametrize(
    "dataset_id, kwargs, error, match",
    [  # each raised Minari's, numpy's or gymnasium's own error before
        ("cartpole", {}, ValueError, r"dataset_id='cartpole'\): not a Minari dataset id"),
        ("x/cartpole-v0", {}, ValueError, r"namespace \(if any\) of 2 characters or more"),
        (3, {}, TypeError, r"to_minari\(dataset_id=3\): expected a str"),
        ("jr/a-v0", {"episodes": 5}, TypeError, r"to_minari\(episodes=5\): expected an iter"),
        ("jr/b-v0", {"authr": "me"}, ValueError, r"to_minari\(authr=...\): minari.create_"),
        ("jr/c-v0", {"author": 5}, ValueError, r"'jr/c-v0'\): Minari refused .*AssertionErr"),
        ("jr/d-v0", {"env": 5}, ValueError, r"Minari refused .*Unsupported env type"),
        ("jr/e-v0", {"env": "NoSuchEnv-v9"}, ValueError, r"Minari refused .*NameNotFound"),
    ],
)
def test_to_minari_refuses_what_minari_would_by_name(
    datasets_path, sampled, dataset_id, kwargs, error, match
) -> None:
    kwargs = {"episodes": sampled[0], **_spaces(sampled), **kwargs}
    with pytest.raises(jr.errors.JaxRunnerError, match=match) as info:
        jr.to_minari(dataset_id=dataset_id, **kwargs)
    assert isinstance(info.value, error)
    assert minari.list_local_datasets() == {}


def test_what_from_minari_would_refuse_is_never_written(datasets_path: Path, sampled) -> None:
    episodes, spaces = sampled
    narrow = gymnasium.spaces.Box(-1, 1, (3,), np.float32)  # another env's space
    with pytest.raises(ValueError, match=r"episode \d+ of env \d+, field observations: expected"):
        jr.to_minari(episodes, "jr/wrong/space-v0", **{**spaces, "observation_space": narrow})
    with pytest.raises(ValueError, match=r"field actions: row \d+ .* is outside Discrete\(1\)"):
        jr.to_minari(
            episodes,
            "jr/wrong/space-v0",
            **{**spaces, "action_space": gymnasium.spaces.Discrete(1)},
        )
    with pytest.raises(TypeError, match=r"to_minari\(action_space=...\): expected a gymnasium"):
        jr.to_minari(episodes, "jr/wrong/space-v0", **{**spaces, "action_space": 2})
    with pytest.raises(TypeError, match=r"item 1 is a dict; expected jaxrunner.Episode"):
        jr.to_minari([episodes[0], {}], "jr/wrong/space-v0", **spaces)
    with pytest.raises(ValueError, match=r"seeds=\{0: 1.5\}"):
        jr.to_minari(episodes, "jr/wrong/space-v0", seeds={0: 1.5}, **spaces)
    for seeds in (5, [(0, 1)]):  # a bare TypeError, and a list of pairs read as a dict
        with pytest.raises(TypeError, match=r"to_minari\(seeds=.*\): expected a dict"):
            jr.to_minari(episodes, "jr/wrong/space-v0", seeds=seeds, **spaces)
    assert "jr/wrong/space-v0" not in minari.list_local_datasets()
    with pytest.raises(TypeError, match=r"from_minari\(dataset=3\): expected a dataset id"):
        jr.from_minari(3)


def test_incomplete_episodes_are_refused(datasets_path: Path, sampled) -> None:
    episodes, spaces = sampled
    tail = episodes[0].replace(start_step=4)
    with pytest.raises(ValueError, match=r"not complete.*sample_episodes"):
        jr.to_minari(
            [tail],
            "jaxrunner/tail/test-v0",
            observation_space=spaces["observation_space"],
            action_space=spaces["action_space"],
        )


def ingest(env: jr.ExternalEnv, episode: jr.Episode) -> None:
    """docs/evaluation-and-datasets.md's recipe: one logged episode into an ExternalEnv."""
    eid = env.start_episode()
    env.log_steps(eid, list(episode.obs[:-1]), list(episode.action), episode.reward.tolist())
    env.end_episode(eid, episode.obs[-1], truncated=not episode.terminated)


def test_external_env_ingests_a_dataset(datasets_path: Path, sampled) -> None:
    """Offline logs into an ExternalEnv: the episodes come out with the logged steps
    and the current policy's log-probs of the logged actions."""
    episodes, spaces = sampled
    obs_space, action_space = spaces["observation_space"], spaces["action_space"]
    jr.to_minari(
        episodes,
        "jaxrunner/ingest/test-v0",
        observation_space=obs_space,
        action_space=action_space,
    )
    logged = jr.from_minari("jaxrunner/ingest/test-v0")
    policy = jr.Policy.from_linen(ActorCritic(2), action_space)
    params = policy.init(jax.random.key(0), obs_space)
    config = jr.ExternalEnvConfig(max_batch=32, buckets=(32,))
    with jr.ExternalEnv(obs_space, action_space, policy, params, config=config) as env:
        for episode in logged:
            ingest(env, episode)
        out = env.sample_episodes(len(logged), timeout_s=60)
    out.sort(key=lambda e: e.episode_id)
    assert len(out) == len(logged)
    for got, want in zip(out, logged):
        np.testing.assert_array_equal(got.obs, want.obs)
        np.testing.assert_array_equal(got.action, want.action)
        np.testing.assert_array_equal(got.reward, want.reward)
        # ExternalEnv ends an episode one way: terminated wins where both are set.
        assert got.terminated == want.terminated
        # Same params as the sampler's: the log-probs are the ones it stored.
        np.testing.assert_allclose(
            got.extras["log_prob"], want.extras["log_prob"], rtol=1e-5, atol=1e-6
        )


# -- datasets that run code, and corrupt datasets (issue 30, items 2 and 6) ---------------------

CARTPOLE = "gymnasium.envs.classic_control.cartpole:CartPoleEnv"


def write_base(datasets_path: Path, sampled, dataset_id: str) -> Path:
    """``sampled``'s first three episodes as ``dataset_id``; returns its data folder."""
    episodes, spaces = sampled
    jr.to_minari(
        episodes[:3],
        dataset_id,
        observation_space=spaces["observation_space"],
        action_space=spaces["action_space"],
    )
    return datasets_path / dataset_id / "data"


def edit_metadata(data: Path, edit) -> None:
    path = data / "metadata.json"
    metadata = json.loads(path.read_text())
    edit(metadata)
    path.write_text(json.dumps(metadata))


def without_spaces(data: Path, env_spec: dict) -> None:
    """The metadata loses its spaces and names ``env_spec`` instead."""

    def edit(metadata: dict) -> None:
        metadata.pop("observation_space", None)
        metadata.pop("action_space", None)
        metadata["env_spec"] = json.dumps(env_spec)

    edit_metadata(data, edit)


def cartpole_spec(**changes) -> dict:
    return {**json.loads(gymnasium.spec("CartPole-v1").to_json()), **changes}


def test_from_minari_never_runs_what_a_dataset_names(datasets_path: Path, sampled) -> None:
    """A dataset without spaces naming os:mkdir as its env: refused, nothing made."""
    data = write_base(datasets_path, sampled, "jaxrunner/hostile/mkdir-v0")
    target = datasets_path / "made-by-the-dataset"
    without_spaces(data, cartpole_spec(entry_point="os:mkdir", kwargs={"path": str(target)}))
    for trusted in (None, CARTPOLE):
        with pytest.raises(
            jr.errors.InvalidArgumentError, match=r"'os:mkdir'.*trusted_entry_point"
        ):
            jr.from_minari("jaxrunner/hostile/mkdir-v0", trusted_entry_point=trusted)
    assert not target.exists()


def test_from_minari_makes_a_named_env_only_when_trusted_by_name(
    datasets_path: Path, sampled
) -> None:
    data = write_base(datasets_path, sampled, "jaxrunner/nospaces/cartpole-v0")
    without_spaces(data, cartpole_spec())
    with pytest.raises(jr.errors.InvalidArgumentError, match="no observation_space or action"):
        jr.from_minari("jaxrunner/nospaces/cartpole-v0")
    episodes = jr.from_minari("jaxrunner/nospaces/cartpole-v0", trusted_entry_point=CARTPOLE)
    for got, want in zip(episodes, sampled[0][:3], strict=True):
        np.testing.assert_array_equal(got.obs, want.obs)
    wrapped = cartpole_spec(
        additional_wrappers=[{"name": "X", "entry_point": "os:mkdir", "kwargs": {}}]
    )
    without_spaces(data, wrapped)
    with pytest.raises(jr.errors.InvalidArgumentError, match="wrappers"):
        jr.from_minari("jaxrunner/nospaces/cartpole-v0", trusted_entry_point=CARTPOLE)


def h5_edit(edit):
    """A damage that edits the dataset's HDF5 file with ``edit(file)``."""

    def damage(data: Path) -> None:
        with h5py.File(data / "main_data.hdf5", "a") as file:
            edit(file)

    return damage


def replace(name: str, change):
    """Dataset ``name`` (e.g. ``episode_0/rewards``) replaced by ``change(its values)``."""

    def edit(file) -> None:
        values = file[name][()]
        del file[name]
        file[name] = change(values)

    return h5_edit(edit)


def with_nan_at(values: np.ndarray, index: int) -> np.ndarray:
    values = values.astype(np.float64)
    values[index] = np.nan
    return values


def with_value_at(values: np.ndarray, index: int, value) -> np.ndarray:
    values = values.copy()
    values[index] = value
    return values


# id -> (how the dataset is damaged, what the error must say)
CORRUPT = {
    "metadata not JSON": (
        lambda data: (data / "metadata.json").write_text("{" * 10_000),
        "not readable JSON",
    ),
    "metadata a list": (lambda data: (data / "metadata.json").write_text("[]"), "not a JSON"),
    "unknown data_format": (
        lambda data: edit_metadata(data, lambda m: m.update(data_format="pickle")),
        "data_format",
    ),
    "total_episodes a string": (
        lambda data: edit_metadata(data, lambda m: m.update(total_episodes="3")),
        "total_episodes",
    ),
    "space not a space": (
        lambda data: edit_metadata(data, lambda m: m.update(action_space='{"type": "Nope"}')),
        "action_space is not a serialized space",
    ),
    "data file gone": (lambda data: (data / "main_data.hdf5").unlink(), "cannot be"),
    "data file truncated": (
        lambda data: (data / "main_data.hdf5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64),
        "episode 0 cannot be",
    ),
    "episode missing": (
        h5_edit(lambda file: file.__delitem__("episode_1")),
        "episode 1 cannot be read",
    ),
    "rewards missing": (
        h5_edit(lambda file: file.__delitem__("episode_2/rewards")),
        "episode 2 cannot be read",
    ),
    "observations one short": (
        replace("episode_0/observations", lambda v: v[:-1]),
        "episode 0, field observations: expected",
    ),
    "NaN reward": (
        replace("episode_1/rewards", lambda v: with_nan_at(v, 2)),
        "episode 1, field rewards: step 2 is nan",
    ),
    "action outside the space": (
        replace("episode_0/actions", lambda v: with_value_at(v, 3, 7)),
        "episode 0, field actions: row 3",
    ),
    "observation NaN": (
        replace("episode_2/observations", lambda v: with_nan_at(v, 0)),
        "episode 2, field observations: row 0",
    ),
    "ended early": (
        replace("episode_0/terminations", lambda v: with_value_at(v, 1, True)),
        "episode 0, field terminations: the episode ends at step 1",
    ),
    "flags short": (
        replace("episode_1/truncations", lambda v: v[:-2]),
        "episode 1, field truncations",
    ),
    "extras rows": (
        replace("episode_0/infos/extras/log_prob", lambda v: v[:-1]),
        r"episode 0, field infos\.extras\.log_prob: expected",
    ),
    "episode ids differ": (
        replace("episode_2/infos/episode_id", lambda v: with_value_at(v, 4, 99)),
        r"episode 2, field infos\.episode_id",
    ),
}


@pytest.mark.parametrize("case", list(CORRUPT))
def test_from_minari_refuses_corrupt_datasets(datasets_path: Path, sampled, case: str) -> None:
    damage, match = CORRUPT[case]
    dataset_id = f"jaxrunner/corrupt/case{list(CORRUPT).index(case)}-v0"
    damage(write_base(datasets_path, sampled, dataset_id))
    with pytest.raises(jr.errors.InvalidArgumentError, match=match):
        jr.from_minari(dataset_id)


def test_from_minari_names_a_bad_index_or_a_missing_dataset(datasets_path: Path, sampled) -> None:
    write_base(datasets_path, sampled, "jaxrunner/index/base-v0")
    with pytest.raises(jr.errors.InvalidArgumentError, match="episode 3 is out of range"):
        jr.from_minari("jaxrunner/index/base-v0", episode_indices=[0, 3])
    with pytest.raises(jr.errors.InvalidArgumentError, match="no local dataset"):
        jr.from_minari("jaxrunner/index/absent-v0")
