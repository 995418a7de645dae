"""Connectors on Dict and Tuple observations: statistics per Box leaf against numpy,
other leaves passed through, frame stacks leaf by leaf, checkpoints."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium import spaces

import jaxrunner as jr
from jaxrunner import connectors as C
from jaxrunner._src.connectors import moments
from jaxrunner._src.testing.envs import DictObsEnv
from jaxrunner.errors import InvalidArgumentError
from tests.test_connectors import assert_moments_match


def pos_policy() -> jr.Policy:
    """Box actions from the last frame of ``obs["pos"]`` plus noise (any other leaf is
    ignored), so actions depend on what the policy saw."""

    def apply_fn(params: Any, obs: Any, carry: Any, keys: jax.Array) -> Any:
        pos = obs["pos"].reshape(keys.shape[0], -1)[:, -2:]
        noise = jax.vmap(lambda k: jax.random.normal(k, (2,)))(keys)
        return jnp.tanh(params["w"] * pos) + 0.3 * noise, {}, carry

    return jr.Policy(apply_fn)


def dict_runner(connectors: C.Connectors, seed: int = 1) -> jr.EnvRunner:
    envs = jr.SyncVectorEnv([lambda: DictObsEnv(max_steps=6) for _ in range(3)])
    return jr.EnvRunner(
        envs, pos_policy(), {"w": jnp.float32(-1.0)}, 7, seed, connectors=connectors
    )


def test_dict_observations_are_normalized_per_box_leaf_and_the_rest_passes_through():
    conn = C.Connectors(obs=[C.NormalizeObservation(clip=None)])
    with dict_runner(conn) as runner:
        first, second = runner.sample(), runner.sample()
        state = runner.get_connector_state()
    shared = state.obs[0].shared
    assert shared["mask"] is None and shared["nested"][0] is None
    for path in (("pos",), ("nested", 1)):

        def leaf(tree: Any, path: tuple = path) -> Any:
            for key in path:
                tree = tree[key]
            return tree

        seen = np.concatenate([leaf(first.obs), leaf(second.obs)])
        assert_moments_match(leaf(shared).stats, seen)
        # The second sample used the first one's statistics, leaf by leaf.
        ref = leaf(first.obs).reshape(-1, *leaf(first.obs).shape[2:])
        want = (leaf(second.obs) - ref.mean(0)) / ref.std(0)
        np.testing.assert_allclose(leaf(second.extras["policy_obs"]), want, rtol=1e-3, atol=1e-4)
    # Discrete and MultiBinary leaves: the values the env gave, as they were.
    for traj in (first, second):
        seen = traj.extras["policy_obs"]
        np.testing.assert_array_equal(seen["mask"], traj.obs["mask"])
        np.testing.assert_array_equal(seen["nested"][0], traj.obs["nested"][0])
        nxt = traj.extras["policy_next_obs"]
        np.testing.assert_array_equal(nxt["mask"], traj.next_obs["mask"])
    # Two statistics for an EnvRunnerGroup to merge.
    assert len(moments.take_deltas(state)[1]) == 2


def test_observation_space_of_structured_observations():
    space = DictObsEnv().observation_space
    seen = C.NormalizeObservation(clip=5.0).observation_space(space)
    assert seen["pos"] == spaces.Box(-5.0, 5.0, (2,), np.float32)
    assert seen["mask"] == space["mask"]
    assert seen["nested"][0] == space["nested"][0]
    assert seen["nested"][1] == spaces.Box(-5.0, 5.0, (2, 2), np.float32)
    stacked = C.FrameStack(num_frames=3).observation_space(
        spaces.Dict(
            {
                "box": spaces.Box(-1.0, 2.0, (2,), np.float32),
                "d": spaces.Discrete(4, start=1),
                "mb": spaces.MultiBinary(3),
                "md": spaces.Tuple((spaces.MultiDiscrete([2, 5]),)),
            }
        )
    )
    assert stacked["box"] == spaces.Box(-1.0, 2.0, (3, 2), np.float32)
    assert stacked["d"] == spaces.Box(1, 4, (3,), np.int64)
    assert stacked["mb"] == spaces.Box(0, 1, (3, 3), np.int8)
    assert stacked["md"][0] == spaces.Box(0, np.array([[1, 4]] * 3), (3, 2), np.int64)


def test_tuple_statistics_take_in_only_the_valid_rows():
    space = spaces.Tuple((spaces.Box(-9, 9, (2,), np.float32), spaces.Discrete(3)))
    norm = C.NormalizeObservation(clip=None)
    state = norm.init(4, space)
    rng = np.random.default_rng(0)
    box = rng.normal(2.0, 3.0, (5, 4, 2)).astype(np.float32)  # [T, B, 2]
    disc = rng.integers(0, 3, (5, 4))
    valid = rng.random((5, 4)) < 0.6
    state = norm.end_sample(state, (box, disc), jnp.asarray(valid))
    assert state.shared[1] is None
    assert_moments_match(state.shared[0].stats, box[valid])
    out, _ = norm(state, (box[0], disc[0]), jnp.zeros(4, bool), jnp.ones(4, bool))
    np.testing.assert_allclose(
        out[0], (box[0] - box[valid].mean(0)) / box[valid].std(0), rtol=1e-4, atol=1e-5
    )
    np.testing.assert_array_equal(out[1], disc[0])


def test_frame_stack_on_dict_observations_stacks_each_leaf_per_env_and_episode():
    k = 2
    conn = C.Connectors(obs=[C.NormalizeObservation(clip=None), C.FrameStack(num_frames=k)])
    with dict_runner(conn) as runner:
        traj = jr.concatenate([runner.sample(), runner.sample()])
    stacks = traj.extras["policy_obs"]
    assert stacks["pos"].shape == (14, 3, k, 2) and stacks["nested"][0].shape == (14, 3, k)
    for b in range(3):
        for t in range(traj.num_steps):
            start = t - traj.step[t, b]
            frames = [max(start, t - k + 1 + j) for j in range(k)]
            want = np.stack([traj.obs["mask"][f, b] for f in frames])
            np.testing.assert_array_equal(stacks["mask"][t, b], want, f"t={t} b={b}")
            want = np.stack([traj.obs["nested"][0][f, b] for f in frames])
            np.testing.assert_array_equal(stacks["nested"][0][t, b], want)
    assert traj.done.any()
    nxt = traj.extras["policy_next_obs"]
    np.testing.assert_array_equal(nxt["mask"][:, :, -1], traj.next_obs["mask"])
    np.testing.assert_array_equal(nxt["pos"][:, :, :-1], stacks["pos"][:, :, 1:])


def test_structured_connector_state_is_part_of_the_checkpoint(tmp_path):
    path = tmp_path / "runner.npz"
    conn = C.Connectors(obs=[C.NormalizeObservation(), C.FrameStack(num_frames=2)])
    with dict_runner(conn, seed=5) as runner:
        runner.sample()
        runner.save(path)
        expected = runner.sample()
        state = runner.get_connector_state()
    with dict_runner(conn, seed=5) as resumed:
        resumed.restore(path, load_env_pickles=True)
        actual = resumed.sample()
        jr.testing.assert_trees_equal(resumed.get_connector_state(), state, "state")
    jr.testing.assert_trees_equal(actual, expected, "sample after restore")


def test_unsupported_leaves_are_refused_with_the_fix():
    text = spaces.Dict({"box": spaces.Box(-1, 1, (2,)), "name": spaces.Text(5)})
    for connector in (C.NormalizeObservation(), C.FrameStack()):
        with pytest.raises(InvalidArgumentError, match="Flatten it"):
            connector.init(2, text)
    no_box = spaces.Dict({"d": spaces.Discrete(3), "mb": spaces.MultiBinary(2)})
    with pytest.raises(InvalidArgumentError, match="nothing to normalize"):
        C.NormalizeObservation().init(2, no_box)
