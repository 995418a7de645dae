"""jr.models: the ready-made policies' shapes, determinism under a key, and Box actions
sampled unclipped (the Policy contract: the runner clips them for the env only)."""

from __future__ import annotations

import gymnasium
import jax
import numpy as np
import pytest
from gymnasium import spaces

import jaxrunner as jr
from jaxrunner._src import bench
from jaxrunner.errors import SpaceMismatchError
from jaxrunner.models import mlp_policy


def _act(policy: jr.Policy, params, obs: np.ndarray, seed: int):
    keys = jax.random.split(jax.random.key(seed), obs.shape[0])
    action, extras, _ = jax.jit(policy.apply_fn)(params, obs, None, keys)
    return np.asarray(action), {k: np.asarray(v) for k, v in extras.items()}


def test_bench_reexports_the_models_mlp() -> None:
    assert bench.mlp_policy is jr.models.mlp_policy
    assert bench.MLP is jr.models.MLP


@pytest.mark.parametrize("shape", [(84, 84, 4), (4, 84, 84)])
def test_nature_cnn_shapes_and_determinism(shape: tuple[int, ...]) -> None:
    obs_space = spaces.Box(0, 255, shape, np.uint8)
    policy = jr.models.nature_cnn_policy(obs_space, spaces.Discrete(6))
    params = policy.init(jax.random.key(0), obs_space)
    first_conv = params["module"]["params"]["Conv_0"]["kernel"]
    assert first_conv.shape == (8, 8, 4, 32)  # 4 stacked frames are the channels either way
    obs = np.random.default_rng(0).integers(0, 256, (3, *shape), dtype=np.uint8)
    action, extras = _act(policy, params, obs, seed=1)
    assert action.shape == (3,) and action.dtype.kind == "i"
    assert ((action >= 0) & (action < 6)).all()
    assert extras["log_prob"].shape == (3,) and extras["value"].shape == (3,)
    assert (extras["log_prob"] <= 0).all()
    again, extras_again = _act(policy, params, obs, seed=1)
    np.testing.assert_array_equal(action, again)
    np.testing.assert_array_equal(extras["log_prob"], extras_again["log_prob"])
    same = policy.init(jax.random.key(0), obs_space)
    jax.tree.map(np.testing.assert_array_equal, params, same)


def test_nature_cnn_refuses_vectors_and_box_actions() -> None:
    with pytest.raises(SpaceMismatchError, match="Box of images"):
        jr.models.nature_cnn_policy(spaces.Box(-1, 1, (4,)), spaces.Discrete(2))
    with pytest.raises(SpaceMismatchError, match="Discrete"):
        jr.models.nature_cnn_policy(spaces.Box(0, 255, (84, 84, 4), np.uint8), spaces.Box(-1, 1))


def test_gaussian_mlp_shapes_determinism_and_unclipped_actions() -> None:
    obs_space = spaces.Box(-np.inf, np.inf, (17,), np.float64)
    action_space = spaces.Box(-0.01, 0.01, (6,), np.float32)  # narrow: samples fall outside
    policy = jr.models.gaussian_mlp_policy(action_space)
    params = policy.init(jax.random.key(0), obs_space)
    assert params["module"]["params"]["Dense_0"]["kernel"].shape == (17, 256)
    assert params["module"]["params"]["Dense_1"]["kernel"].shape == (256, 256)
    assert params["log_std"].shape == (6,)
    obs = np.random.default_rng(0).normal(size=(64, 17))
    action, extras = _act(policy, params, obs, seed=2)
    assert action.shape == (64, 6) and action.dtype == np.float32
    assert extras["log_prob"].shape == (64,) and extras["value"].shape == (64,)
    # Sampled from N(mean, 1): as drawn, not clipped to the space (the runner clips
    # the env's copy only).
    assert (np.abs(action) > 0.01).mean() > 0.9
    again, _ = _act(policy, params, obs, seed=2)
    np.testing.assert_array_equal(action, again)
    other, _ = _act(policy, params, obs, seed=3)
    assert not np.array_equal(action, other)


def test_gaussian_mlp_refuses_discrete_actions() -> None:
    with pytest.raises(SpaceMismatchError, match="Box"):
        jr.models.gaussian_mlp_policy(gymnasium.spaces.Discrete(3))


def test_mlp_policy_names_dict_observations_and_the_fix() -> None:
    obs_space = spaces.Dict({"a": spaces.Box(-1, 1, (2,)), "b": spaces.Discrete(3)})
    policy = mlp_policy(spaces.Discrete(2))
    with pytest.raises(SpaceMismatchError, match=r"got a dict\. Flatten .*FlattenObservation"):
        policy.init(jax.random.key(0), obs_space)


@pytest.mark.parametrize("hidden", [64, (0,), (32, "64")])
def test_mlp_policy_refuses_bad_layer_widths_when_built(hidden) -> None:
    with pytest.raises(
        ValueError, match=r"mlp_policy\(hidden=.*\): expected a tuple of layer widths"
    ):
        mlp_policy(spaces.Discrete(2), hidden=hidden)
