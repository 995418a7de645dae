"""Tests for jaxrunner._src.core.policy: Policy.from_linen / from_nnx and the built-in heads."""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import flax.linen as nn
import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from gymnasium import spaces

import jaxrunner as jr
from jaxrunner.errors import InvalidArgumentError, JaxRunnerError, SpaceMismatchError

B = 6
OBS_SPACE = spaces.Box(-1.0, 1.0, (4,), np.float32)


def env_keys(seed: int, num_envs: int = B) -> jax.Array:
    """One key per env: fold the env index into a base key."""
    base = jax.random.key(seed)
    return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.arange(num_envs))


def make_obs(seed: int = 0, num_envs: int = B) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (num_envs, 4)).astype(np.float32)


class Net(nn.Module):
    """A linear head; ``output`` picks the shape of what it returns."""

    features: int
    output: str = "array"  # array | tuple | tuple1 | dict | dict_log_std | dict_no_value
    key: str = "logits"

    @nn.compact
    def __call__(self, obs: jax.Array) -> Any:
        init = nn.initializers.normal(2.0)  # spread logits so argmax is unambiguous
        out = nn.Dense(self.features, kernel_init=init, name="out")(obs)
        if self.output == "array":
            return out
        value = nn.Dense(1, name="value")(obs)
        if self.output == "tuple1":
            return out, value
        if self.output == "tuple":
            return out, value[:, 0]
        if self.output == "dict_no_value":
            return {self.key: out}
        result = {self.key: out, "value": value[:, 0]}
        if self.output == "dict_log_std":
            result["log_std"] = 0.3 * nn.Dense(self.features, name="log_std")(obs)
        return result


class Case(NamedTuple):
    space: spaces.Space
    features: int
    output: str

    @property
    def key(self) -> str:
        return "mean" if isinstance(self.space, spaces.Box) else "logits"

    @property
    def module(self) -> Net:
        return Net(self.features, self.output, self.key)


CASES = {
    "discrete": Case(spaces.Discrete(5, start=-2), 5, "array"),
    "discrete_tuple": Case(spaces.Discrete(4, start=3), 4, "tuple"),
    "discrete_tuple1": Case(spaces.Discrete(3, start=1), 3, "tuple1"),
    "discrete_dict": Case(spaces.Discrete(4, start=-1), 4, "dict"),
    "multidiscrete": Case(spaces.MultiDiscrete([3, 2, 4], start=[1, 0, -1]), 9, "array"),
    "multidiscrete_2d": Case(
        spaces.MultiDiscrete([[2, 3], [3, 2]], start=[[0, 1], [2, -3]]), 10, "dict"
    ),
    "multibinary": Case(spaces.MultiBinary(3), 3, "array"),
    "multibinary_2d": Case(spaces.MultiBinary([2, 2]), 4, "tuple"),
    "box": Case(spaces.Box(-1.0, 1.0, (2,), np.float32), 2, "array"),
    "box_scalar": Case(spaces.Box(-1.0, 1.0, (), np.float32), 1, "tuple1"),
    "box_2d": Case(spaces.Box(-1.0, 1.0, (2, 2), np.float32), 4, "dict_no_value"),
    "box_dict_log_std": Case(spaces.Box(-2.0, 2.0, (3,), np.float32), 3, "dict_log_std"),
}
CASE_NAMES = sorted(CASES)


class Built(NamedTuple):
    policy: jr.Policy
    params: Any
    apply: Any  # jitted apply_fn


def build(name: str, deterministic: bool = False) -> Built:
    """Policy, params and jitted apply_fn for a case; compiled once per test session."""
    return _build(name, deterministic)


@functools.cache
def _build(name: str, deterministic: bool) -> Built:
    case = CASES[name]
    policy = jr.Policy.from_linen(case.module, case.space, deterministic=deterministic)
    params = policy.init(jax.random.key(1), OBS_SPACE)
    if isinstance(case.space, spaces.Box):
        # A non-zero learned log-std, so that using it (or not) shows.
        params = {
            **params,
            "log_std": jnp.linspace(-0.5, 0.4, case.features).reshape(case.space.shape),
        }
    return Built(policy, params, jax.jit(policy.apply_fn))


# -- independent references (numpy, float64) ---------------------------------------------------


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def log_sigmoid(x: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -x)


def raw_output(case: Case, params: Any, obs: np.ndarray) -> dict[str, np.ndarray]:
    """The module's own output by hand, as {'params', ['log_std'], ['value']} in float64."""
    out = case.module.apply(params["module"], obs)
    if isinstance(out, tuple):
        out = {case.key: out[0], "value": out[1]}
    elif not isinstance(out, dict):
        out = {case.key: out}
    parsed = {"params": np.asarray(out[case.key], np.float64)}
    if "value" in out:
        parsed["value"] = np.asarray(out["value"], np.float64).reshape(-1)
    if "log_std" in out:
        parsed["log_std"] = np.asarray(out["log_std"], np.float64)
    return parsed


def ref_log_prob(case: Case, params: Any, out: dict[str, np.ndarray], action: Any) -> np.ndarray:
    space, logits = case.space, out["params"]
    action = np.asarray(action)
    n = action.shape[0]
    if isinstance(space, spaces.Discrete):
        return log_softmax(logits)[np.arange(n), action - space.start]
    if isinstance(space, spaces.MultiDiscrete):
        flat = action.reshape(n, -1)
        nvec, start = space.nvec.ravel(), space.start.ravel()
        parts = np.split(logits, np.cumsum(nvec)[:-1], axis=-1)
        return sum(
            log_softmax(part)[np.arange(n), flat[:, j] - start[j]] for j, part in enumerate(parts)
        )
    if isinstance(space, spaces.MultiBinary):
        a, x = action.reshape(n, -1).astype(np.float64), logits.reshape(n, -1)
        return (a * log_sigmoid(x) + (1 - a) * log_sigmoid(-x)).sum(axis=1)
    mean = logits.reshape(n, -1)
    if "log_std" in out:
        log_std = out["log_std"].reshape(n, -1)
    else:
        log_std = np.broadcast_to(np.asarray(params["log_std"], np.float64).reshape(-1), mean.shape)
    z = (action.reshape(n, -1) - mean) / np.exp(log_std)
    return (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(axis=1)


def ref_mode(case: Case, out: dict[str, np.ndarray]) -> np.ndarray:
    space, logits = case.space, out["params"]
    n = logits.shape[0]
    if isinstance(space, spaces.Discrete):
        return logits.argmax(axis=-1) + space.start
    if isinstance(space, spaces.MultiDiscrete):
        nvec, start = space.nvec.ravel(), space.start.ravel()
        parts = np.split(logits, np.cumsum(nvec)[:-1], axis=-1)
        flat = np.stack([p.argmax(-1) + s for p, s in zip(parts, start)], axis=-1)
        return flat.reshape(n, *space.shape)
    if isinstance(space, spaces.MultiBinary):
        return (logits > 0).astype(np.int64).reshape(n, *space.shape)
    return logits.reshape(n, *space.shape)


def check_range(space: spaces.Space, action: np.ndarray) -> None:
    assert action.shape == (B, *space.shape)
    if isinstance(space, spaces.Box):
        assert action.dtype.kind == "f"
        assert np.all(np.isfinite(action))
        return
    assert action.dtype.kind in "iu", action.dtype
    if isinstance(space, spaces.Discrete):
        assert np.all((action >= space.start) & (action < space.start + space.n))
    elif isinstance(space, spaces.MultiDiscrete):
        assert np.all((action >= space.start) & (action < space.start + space.nvec))
    else:
        assert np.all((action == 0) | (action == 1))


# -- from_linen, every action space and output form -------------------------------------------


@pytest.mark.parametrize("name", CASE_NAMES)
def test_sample_shapes_ranges_and_log_prob(name: str) -> None:
    case = CASES[name]
    policy, params, apply = build(name)
    assert policy.initial_carry is None
    obs = make_obs()
    action, extras, carry = apply(params, obs, None, env_keys(0))
    assert carry is None
    action = np.asarray(action)
    check_range(case.space, action)
    for row in action:
        if not isinstance(case.space, spaces.Box):  # Box samples are unclipped
            assert case.space.contains(row.astype(case.space.dtype))

    out = raw_output(case, params, obs)
    assert extras["log_prob"].shape == (B,)
    np.testing.assert_allclose(
        extras["log_prob"], ref_log_prob(case, params, out, action), rtol=1e-5, atol=1e-5
    )
    if "value" in out:
        assert set(extras) == {"log_prob", "value"}
        assert extras["value"].shape == (B,)
        np.testing.assert_allclose(extras["value"], out["value"], rtol=1e-6)
    else:
        assert set(extras) == {"log_prob"}


@pytest.mark.parametrize("name", CASE_NAMES)
def test_evaluate_scores_stored_actions_under_params(name: str) -> None:
    """Policy.evaluate: the log-prob the sampler stored, the value, and an entropy."""
    policy, params, apply = build(name)
    obs = make_obs()
    action, extras, _ = apply(params, obs, None, env_keys(0))
    scored = jax.jit(policy.evaluate)(params, obs, action)
    np.testing.assert_allclose(scored["log_prob"], extras["log_prob"], rtol=1e-5, atol=1e-5)
    assert set(scored) == {"log_prob", "entropy"} | ({"value"} & set(extras))
    if "value" in extras:
        np.testing.assert_allclose(scored["value"], extras["value"], rtol=1e-6)
    assert scored["entropy"].shape == (B,)
    grads = jax.grad(lambda p: policy.evaluate(p, obs, action)["log_prob"].sum())(params)
    assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))


@pytest.mark.parametrize("name", ["discrete", "box"])
def test_evaluate_entropy_is_the_distributions(name: str) -> None:
    case = CASES[name]
    policy, params, _ = build(name)
    obs = make_obs()
    if isinstance(case.space, spaces.Discrete):
        # Enumerate the actions: H = -sum_a p(a) log p(a).
        log_probs = np.stack(
            [
                policy.evaluate(params, obs, np.full(B, case.space.start + a))["log_prob"]
                for a in range(case.space.n)
            ]
        )
        expected = -(np.exp(log_probs) * log_probs).sum(axis=0)
    else:  # diagonal Gaussian: sum of 0.5 * log(2 pi e sigma^2)
        log_std = np.asarray(params["log_std"], np.float64)
        expected = np.full(B, (0.5 * np.log(2 * np.pi * np.e) + log_std).sum())
    entropy = policy.evaluate(params, obs, np.zeros((B, *case.space.shape)))["entropy"]
    np.testing.assert_allclose(entropy, expected, rtol=1e-5)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_deterministic_gives_mode(name: str) -> None:
    case = CASES[name]
    _, params, apply = build(name, deterministic=True)
    obs = make_obs(1)
    action, extras, _ = apply(params, obs, None, env_keys(0))
    again, _, _ = apply(params, obs, None, env_keys(123))
    np.testing.assert_array_equal(action, again)  # the key does not matter

    out = raw_output(case, params, obs)
    want = ref_mode(case, out)
    if isinstance(case.space, spaces.Box):
        np.testing.assert_allclose(action, want, rtol=1e-6)
    else:
        np.testing.assert_array_equal(action, want)
    np.testing.assert_allclose(
        extras["log_prob"], ref_log_prob(case, params, out, action), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("name", CASE_NAMES)
def test_action_dtype_safely_castable_to_space(name: str) -> None:
    """EnvRunner requires np.can_cast(action dtype, space dtype, 'safe')."""
    case = CASES[name]
    for deterministic in (False, True):
        _, params, apply = build(name, deterministic)
        action, _, _ = apply(params, make_obs(), None, env_keys(0))
        assert np.can_cast(action.dtype, case.space.dtype, "safe"), (action.dtype, case.space)


def test_box_log_std_head_is_used_and_module_log_std_wins() -> None:
    """State-independent log-std from params; a module's own 'log_std' replaces it."""
    _, params, apply = build("box")
    obs = make_obs(2)
    keys = env_keys(5)
    action, _, _ = apply(params, obs, None, keys)
    narrow, _, _ = apply({**params, "log_std": params["log_std"] - 3.0}, obs, None, keys)
    mean = raw_output(CASES["box"], params, obs)["params"]
    # Same noise, std scaled by e^-3: the deviation from the mean shrinks by that factor.
    np.testing.assert_allclose(narrow - mean, (action - mean) * math.exp(-3.0), rtol=1e-4)

    _, params, apply = build("box_dict_log_std")
    a1, e1, _ = apply(params, obs, None, keys)
    a2, e2, _ = apply({**params, "log_std": params["log_std"] - 3.0}, obs, None, keys)
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(e1["log_prob"], e2["log_prob"])


def test_discrete_sampling_frequencies_match_softmax() -> None:
    name = "discrete"
    case = CASES[name]
    _, params, apply = build(name)
    n = 4000
    obs = np.repeat(make_obs(3, 1), n, axis=0)
    action, _, _ = apply(params, obs, None, env_keys(7, n))
    probs = np.exp(log_softmax(raw_output(case, params, obs[:1])["params"]))[0]
    freq = np.bincount(np.asarray(action) - case.space.start, minlength=case.space.n) / n
    np.testing.assert_allclose(freq, probs, atol=0.03)


def test_masked_logits_give_the_unmasked_actions_entropy_and_finite_grads() -> None:
    from jaxrunner._src.core.distributions import Categorical

    logits = jnp.array([[1.0, -jnp.inf, 0.5, -jnp.inf], [0.0, 2.0, -jnp.inf, -1.0]])
    kept = [np.array([1.0, 0.5]), np.array([0.0, 2.0, -1.0])]
    want = [
        -(np.exp(x - np.logaddexp.reduce(x)) * (x - np.logaddexp.reduce(x))).sum() for x in kept
    ]
    np.testing.assert_allclose(Categorical(logits).entropy(), want, rtol=1e-6)
    raw = jnp.array([[1.0, 3.0, 0.5, 2.0], [0.0, 2.0, 1.0, -1.0]])
    masked = lambda x: Categorical(jnp.where(jnp.isinf(logits), -jnp.inf, x)).entropy().sum()  # noqa: E731
    assert np.isfinite(np.asarray(jax.grad(masked)(raw))).all()


def test_box_sampling_moments_match_gaussian() -> None:
    name = "box"
    _, params, apply = build(name)
    n = 4000
    obs = np.repeat(make_obs(3, 1), n, axis=0)
    action, _, _ = apply(params, obs, None, env_keys(7, n))
    mean = raw_output(CASES[name], params, obs[:1])["params"][0]
    std = np.exp(np.asarray(params["log_std"]))
    np.testing.assert_allclose(np.mean(action, axis=0), mean, atol=4 * std.max() / np.sqrt(n))
    np.testing.assert_allclose(np.std(action, axis=0), std, rtol=0.05)


# -- per-env keys ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CASE_NAMES)
def test_env_action_depends_only_on_its_key_and_obs(name: str) -> None:
    _, params, apply = build(name)
    obs, keys = make_obs(4), env_keys(11)
    action, extras, _ = apply(params, obs, None, keys)
    action, log_prob = np.asarray(action), np.asarray(extras["log_prob"])
    is_box = isinstance(CASES[name].space, spaces.Box)

    def check(index: np.ndarray) -> None:
        got, got_extras, _ = apply(params, obs[index], None, keys[index])
        if is_box:  # a different batch size may change float rounding in the matmul
            np.testing.assert_allclose(got, action[index], rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(got, action[index])
        np.testing.assert_allclose(got_extras["log_prob"], log_prob[index], rtol=1e-5, atol=1e-5)

    check(np.array([3, 0, 5, 1, 4, 2]))  # permuted
    check(np.array([4, 1]))  # sub-selected

    # Changing one env's key changes (at most) that env's action.
    other = keys.at[2].set(jax.random.key(999))
    changed, _, _ = apply(params, obs, None, other)
    keep = np.arange(B) != 2
    np.testing.assert_array_equal(np.asarray(changed)[keep], action[keep])


def test_different_keys_give_different_samples() -> None:
    _, params, apply = build("box")
    obs = make_obs()
    a1, _, _ = apply(params, obs, None, env_keys(0))
    a2, _, _ = apply(params, obs, None, env_keys(1))
    assert not np.allclose(a1, a2)


# -- observations of any structure -------------------------------------------------------------


class DictObsNet(nn.Module):
    @nn.compact
    def __call__(self, obs: dict[str, Any]) -> jax.Array:
        x = jnp.concatenate([obs["pos"], obs["id"][:, None].astype(jnp.float32)], axis=-1)
        return nn.Dense(3)(x)


def test_init_with_dict_observation_space() -> None:
    obs_space = spaces.Dict(
        {"pos": spaces.Box(-1.0, 1.0, (2,), np.float32), "id": spaces.Discrete(4)}
    )
    policy = jr.Policy.from_linen(DictObsNet(), spaces.Discrete(3))
    params = policy.init(jax.random.key(0), obs_space)
    assert params["module"]["params"]["Dense_0"]["kernel"].shape == (3, 3)
    obs = {"pos": make_obs()[:, :2], "id": np.arange(B) % 4}
    action, extras, _ = policy.apply_fn(params, obs, None, env_keys(0))
    assert action.shape == (B,)
    assert extras["log_prob"].shape == (B,)


# -- from_nnx -----------------------------------------------------------------------------------


class NnxNet(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.logits = nnx.Linear(4, 3, rngs=rngs)
        self.value = nnx.Linear(4, 1, rngs=rngs)

    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        return self.logits(obs), self.value(obs)


def test_from_nnx() -> None:
    module = NnxNet(nnx.Rngs(0))
    space = spaces.Discrete(3, start=2)
    policy = jr.Policy.from_nnx(module, space)
    params = policy.init(jax.random.key(0), OBS_SPACE)
    again = policy.init(jax.random.key(99), OBS_SPACE)
    want_state = nnx.state(module)
    assert jax.tree.structure(params["module"]) == jax.tree.structure(want_state)
    for got, want, other in zip(
        jax.tree.leaves(params["module"]), jax.tree.leaves(want_state), jax.tree.leaves(again)
    ):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(other, want)  # the key is ignored

    obs = make_obs(5)
    logits, value = (np.asarray(x, np.float64) for x in module(jnp.asarray(obs)))
    action, extras, carry = jax.jit(policy.apply_fn)(params, obs, None, env_keys(0))
    assert carry is None
    action = np.asarray(action)
    assert np.all((action >= 2) & (action < 5))
    np.testing.assert_allclose(
        extras["log_prob"], log_softmax(logits)[np.arange(B), action - 2], rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(extras["value"], value[:, 0], rtol=1e-6)

    mode_policy = jr.Policy.from_nnx(module, space, deterministic=True)
    mode, _, _ = jax.jit(mode_policy.apply_fn)(params, obs, None, env_keys(1))
    np.testing.assert_array_equal(mode, logits.argmax(-1) + 2)


# -- recurrent ---------------------------------------------------------------------------------

HIDDEN = 8


class GRUPolicy(nn.Module):
    num_actions: int

    @nn.compact
    def __call__(self, carry: jax.Array, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        carry, h = nn.GRUCell(HIDDEN)(carry, obs)
        return carry, nn.Dense(self.num_actions)(h)


def test_recurrent_linen_gru() -> None:
    module = GRUPolicy(3)
    policy = jr.Policy.from_linen(
        module, spaces.Discrete(3), initial_carry=jnp.zeros(HIDDEN), deterministic=True
    )
    params = policy.init(jax.random.key(0), OBS_SPACE)
    assert params["module"]["params"]["GRUCell_0"]["ir"]["kernel"].shape == (4, HIDDEN)

    carry0 = policy.batched_carry(B)
    assert carry0.shape == (B, HIDDEN)
    np.testing.assert_array_equal(carry0, 0)

    apply, by_hand = jax.jit(policy.apply_fn), jax.jit(module.apply)
    obs = make_obs(6)
    action, extras, carry1 = apply(params, obs, carry0, env_keys(0))
    assert carry1.shape == (B, HIDDEN)
    want_carry, logits = by_hand(params["module"], carry0, obs)
    np.testing.assert_allclose(carry1, want_carry, rtol=1e-6, atol=1e-6)
    assert not np.allclose(carry1, 0)
    np.testing.assert_array_equal(action, np.asarray(logits).argmax(-1))
    np.testing.assert_allclose(
        extras["log_prob"],
        log_softmax(np.asarray(logits, np.float64))[np.arange(B), np.asarray(action)],
        rtol=1e-5,
        atol=1e-5,
    )

    # The new carry is used: stepping again from carry1 matches the module by hand.
    _, _, carry2 = apply(params, obs, carry1, env_keys(1))
    want2, _ = by_hand(params["module"], carry1, obs)
    np.testing.assert_allclose(carry2, want2, rtol=1e-6, atol=1e-6)
    assert not np.allclose(carry2, carry1)


def test_recorded_carries_are_what_each_step_acted_from_and_evaluate_takes() -> None:
    module = GRUPolicy(2)
    policy = jr.Policy.from_linen(module, spaces.Discrete(2), initial_carry=jnp.zeros(HIDDEN))
    recording = policy.recording_carry()
    assert recording == policy.recording_carry()  # the same function: nothing recompiles
    envs = jr.make_vec("CartPole-v1", 3, max_episode_steps=6)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, recording, params, 9, seed=1) as runner:
        traj, later = runner.sample(), runner.sample()
    carry = np.asarray(traj.extras["carry"])
    assert carry.shape == (9, 3, HIDDEN)
    # Each step's carry: the initial one at an episode's start, else the previous step's
    # output (the GRU applied by hand), carried across samples too.
    both = jr.concatenate([traj, later])
    every = np.asarray(both.extras["carry"])
    for t in range(1, 18):
        for b in range(3):
            if both.step[t, b] == 0:
                np.testing.assert_array_equal(every[t, b], 0.0)
            else:
                prev = jnp.asarray(every[t - 1, b][None]), jnp.asarray(both.obs[t - 1, b][None])
                want, _ = module.apply(params["module"], *prev)
                np.testing.assert_allclose(every[t, b], want[0], rtol=1e-5, atol=1e-6)
    assert (both.step == 0).any() and (both.step > 0).any()
    scores = policy.evaluate(params, traj.obs, traj.action, traj.extras["carry"])
    np.testing.assert_allclose(scores["log_prob"], traj.extras["log_prob"], rtol=1e-5, atol=1e-6)
    with pytest.raises(InvalidArgumentError, match="feed-forward"):
        build("discrete").policy.recording_carry()


def test_feed_forward_batched_carry_is_none() -> None:
    assert build("discrete").policy.batched_carry(B) is None


# -- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "space",
    [
        spaces.Text(5),
        spaces.Dict({"a": spaces.Discrete(2)}),
        spaces.Tuple((spaces.Discrete(2), spaces.Discrete(3))),
    ],
    ids=["text", "dict", "tuple"],
)
def test_unsupported_action_space(space: spaces.Space) -> None:
    with pytest.raises(SpaceMismatchError, match="supported are Discrete") as info:
        jr.Policy.from_linen(Net(2), space)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, JaxRunnerError)
    assert type(space).__name__ in str(info.value)


@pytest.mark.parametrize(
    ("space", "features", "expected"),
    [
        (spaces.Discrete(5), 4, 5),
        (spaces.MultiDiscrete([3, 2]), 6, 5),
        (spaces.MultiBinary(3), 2, 3),
        (spaces.Box(-1.0, 1.0, (2, 2), np.float32), 3, 4),
    ],
    ids=["discrete", "multidiscrete", "multibinary", "box"],
)
def test_wrong_number_of_features(space: spaces.Space, features: int, expected: int) -> None:
    policy = jr.Policy.from_linen(Net(features), space)
    params = policy.init(jax.random.key(0), OBS_SPACE)
    with pytest.raises(SpaceMismatchError, match=f"output {expected} features") as info:
        policy.apply_fn(params, make_obs(), None, env_keys(0))
    assert f"[batch, {expected}]" in str(info.value)
    assert f"({B}, {features})" in str(info.value)


class RawOutput(nn.Module):
    """Returns ``make(dense_output)``, for malformed-output tests."""

    make: Any

    @nn.compact
    def __call__(self, obs: jax.Array) -> Any:
        return self.make(nn.Dense(3)(obs))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda h: {"logits": h, "mean": h}, "exactly one of 'logits'/'mean'"),
        (lambda h: {"value": h[:, 0]}, "exactly one of 'logits'/'mean'"),
        (lambda h: {"logits": h, "entropy": h}, r"keys \['entropy', 'logits'\]"),
        (lambda h: (h, h[:, 0], h), "tuple of 3 items"),
        (lambda h: (h, h[:, :2]), r"value has shape \(6, 2\)"),
        (lambda h: {"logits": h, "value": h[:, :, None]}, r"value has shape \(6, 3, 1\)"),
        (lambda h: (h, h[0, 0]), r"value has shape \(\)"),
    ],
    ids=[
        "logits_and_mean",
        "no_logits",
        "unknown_key",
        "tuple3",
        "value_b2",
        "value_3d",
        "value_0d",
    ],
)
def test_bad_module_output(make: Any, match: str) -> None:
    policy = jr.Policy.from_linen(RawOutput(make), spaces.Discrete(3))
    params = policy.init(jax.random.key(0), OBS_SPACE)
    with pytest.raises(SpaceMismatchError, match=match):
        policy.apply_fn(params, make_obs(), None, env_keys(0))


def test_bad_log_std_shape() -> None:
    def make(h: jax.Array) -> dict[str, jax.Array]:
        return {"mean": h, "log_std": h[:, :2]}

    policy = jr.Policy.from_linen(RawOutput(make), spaces.Box(-1.0, 1.0, (3,), np.float32))
    params = policy.init(jax.random.key(0), OBS_SPACE)
    with pytest.raises(SpaceMismatchError, match="log_std output has shape"):
        policy.apply_fn(params, make_obs(), None, env_keys(0))


def test_from_linen_names_a_module_class_or_another_object() -> None:
    with pytest.raises(TypeError, match=r"got the class GRUPolicy; construct it first"):
        jr.Policy.from_linen(GRUPolicy, spaces.Discrete(2))
    with pytest.raises(TypeError, match=r"expected a flax.linen module instance, got 3"):
        jr.Policy.from_linen(3, spaces.Discrete(2))
    with pytest.raises(
        TypeError, match=r"from_linen\(action_space=...\): expected a gymnasium space"
    ):
        jr.Policy.from_linen(nn.Dense(2), 2)  # the number of actions, not a space
    policy = jr.Policy.from_linen(nn.Dense(2), spaces.Discrete(2))
    with pytest.raises(
        TypeError, match=r"init\(observation_space=...\): expected a gymnasium space"
    ):
        policy.init(jax.random.key(0), (4,))


def test_init_without_init_fn() -> None:
    policy = jr.Policy(apply_fn=build("discrete").policy.apply_fn)
    with pytest.raises(ValueError, match="no init_fn"):
        policy.init(jax.random.key(0), OBS_SPACE)


def test_init_takes_a_key_and_names_anything_else() -> None:
    policy, _, _ = build("discrete")
    old_style = policy.init(jax.random.PRNGKey(1), OBS_SPACE)  # a raw uint32[2] key
    typed = policy.init(jax.random.wrap_key_data(jax.random.PRNGKey(1)), OBS_SPACE)
    jax.tree.map(np.testing.assert_array_equal, old_style, typed)
    for bad in (0, "key", np.zeros(2, np.int32)):  # flax's InvalidRngError before
        with pytest.raises(TypeError, match=r"Policy.init\(key=.*expected a JAX random key"):
            policy.init(bad, OBS_SPACE)


# -- learner glue: value, distribution, deterministic() -------------------------------------


@pytest.mark.parametrize("name", CASE_NAMES)
def test_deterministic_method_acts_with_the_mode(name: str) -> None:
    """policy.deterministic() takes the mode, as from_linen(deterministic=True) does."""
    case = CASES[name]
    policy, params, _ = build(name)
    mode_apply = jax.jit(policy.deterministic().apply_fn)
    obs = make_obs(3)
    action, extras, _ = mode_apply(params, obs, None, env_keys(0))
    want = ref_mode(case, raw_output(case, params, obs))
    if isinstance(case.space, spaces.Box):
        np.testing.assert_allclose(action, want, rtol=1e-6)
    else:
        np.testing.assert_array_equal(action, want)
    flag_action, flag_extras, _ = build(name, deterministic=True).apply(
        params, obs, None, env_keys(5)
    )
    np.testing.assert_array_equal(action, flag_action)
    assert jax.tree.structure(extras) == jax.tree.structure(flag_extras)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_value_and_distribution_agree_with_evaluate(name: str) -> None:
    """policy.value and policy.distribution give what evaluate, extras and the module give."""
    case = CASES[name]
    policy, params, apply = build(name)
    obs = make_obs(4)
    out = raw_output(case, params, obs)
    action, extras, _ = apply(params, obs, None, env_keys(0))
    dist = jax.jit(policy.distribution)(params, obs)
    np.testing.assert_allclose(dist.log_prob(action), extras["log_prob"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        dist.entropy(), policy.evaluate(params, obs, action)["entropy"], rtol=1e-6
    )
    raw = out["params"].reshape(B, -1)
    if isinstance(case.space, spaces.Box):
        np.testing.assert_allclose(np.reshape(dist.mean, (B, -1)), raw, rtol=1e-6)
    else:
        np.testing.assert_allclose(np.reshape(dist.logits, (B, -1)), raw, rtol=1e-6)
    if "value" not in out:
        with pytest.raises(ValueError, match="no value head"):
            policy.value(params, obs)
        return
    value = jax.jit(policy.value)(params, obs)
    np.testing.assert_allclose(value, out["value"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(value, extras["value"], rtol=1e-6)
    np.testing.assert_allclose(value, policy.evaluate(params, obs, action)["value"], rtol=1e-6)


def test_value_over_time_is_gae_ready() -> None:
    """vmap over the time axis gives the [T, B] next_value that jr.gae takes."""
    policy, params, _ = build("discrete_tuple1")
    next_obs = np.stack([make_obs(seed) for seed in range(3)])  # [T=3, B, 4]
    next_value = jax.vmap(policy.value, in_axes=(None, 0))(params, next_obs)
    assert next_value.shape == (3, B)
    for t in range(3):
        np.testing.assert_allclose(next_value[t], policy.value(params, next_obs[t]), rtol=1e-6)
    zeros = np.zeros((3, B))
    result = jr.gae(
        reward=zeros,
        terminated=zeros > 0,
        truncated=zeros > 0,
        value=zeros,
        next_value=next_value,
        gamma=0.5,
        lam=0.0,
    )
    np.testing.assert_allclose(result.advantages, 0.5 * np.asarray(next_value), rtol=1e-6)


def test_glue_without_distribution_fn_says_how() -> None:
    policy = jr.Policy(apply_fn=build("discrete").policy.apply_fn)
    for call in (policy.deterministic, lambda: policy.value(None, make_obs())):
        with pytest.raises(ValueError, match="no distribution_fn"):
            call()


@pytest.mark.parametrize(
    ("batched", "features"),
    [
        (spaces.MultiDiscrete([2] * B), 2),
        (spaces.Box(-1.0, 1.0, (B, 3), np.float32), 3),
    ],
    ids=["discrete", "box"],
)
def test_batched_action_space_suggests_single_action_space(
    batched: spaces.Space, features: int
) -> None:
    """from_linen(module, envs.action_space) fails naming envs.single_action_space."""
    policy = jr.Policy.from_linen(Net(features), batched)
    params = policy.init(jax.random.key(0), OBS_SPACE)
    with pytest.raises(SpaceMismatchError, match="single_action_space"):
        policy.apply_fn(params, make_obs(), None, env_keys(0))


# -- any leading batch shape (issue 29) -----------------------------------------------------------


@pytest.mark.parametrize("name", CASE_NAMES)
def test_evaluate_takes_any_leading_batch_shape(name: str) -> None:
    """A learner's [T, B] batch: each result [T, B], equal to the per-step calls."""
    policy, params, apply = build(name)
    obs = np.stack([make_obs(seed) for seed in range(3)])  # [T=3, B, 4]
    action = jnp.stack([apply(params, obs[t], None, env_keys(t))[0] for t in range(3)])
    scored = jax.jit(policy.evaluate)(params, obs, action)
    for key, value in scored.items():
        assert value.shape == (3, B), key
        for t in range(3):
            step = policy.evaluate(params, obs[t], action[t])[key]
            np.testing.assert_allclose(value[t], step, rtol=1e-5, atol=1e-6)
    flat = policy.evaluate(params, obs.reshape(3 * B, 4), action.reshape(3 * B, *action.shape[2:]))
    np.testing.assert_allclose(scored["log_prob"].reshape(-1), flat["log_prob"], rtol=1e-6)
    with pytest.raises(jr.errors.InvalidArgumentError, match=r"leading batch shape \(3, "):
        policy.evaluate(params, obs[:2], action)  # the batch is the actions' (named so)


def test_value_takes_any_leading_batch_shape() -> None:
    policy, params, _ = build("discrete_tuple1")
    next_obs = np.stack([make_obs(seed) for seed in range(3)])  # [T=3, B, 4]
    value = jax.jit(functools.partial(policy.value, batch_ndim=2))(params, next_obs)
    assert value.shape == (3, B)
    for t in range(3):
        np.testing.assert_allclose(value[t], policy.value(params, next_obs[t]), rtol=1e-6)
    with pytest.raises(jr.errors.InvalidArgumentError, match="batch_ndim"):
        policy.value(params, next_obs, batch_ndim=0)


def test_mlp_policy_evaluates_a_trajectory_batch() -> None:
    """The learner-glue recipe (docs/evaluation-and-datasets.md) with jr.models' MLP, which
    flattens [batch, ...] itself."""
    from jaxrunner.models import mlp_policy

    space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    policy = mlp_policy(space, hidden=(8,))
    params = policy.init(jax.random.key(0), OBS_SPACE)
    obs = np.stack([make_obs(seed) for seed in range(4)])  # [T=4, B, 4]
    action = np.random.default_rng(0).normal(size=(4, B, 2)).astype(np.float32)
    scored = policy.evaluate(params, obs, action)
    assert scored["log_prob"].shape == (4, B)
    np.testing.assert_allclose(
        scored["log_prob"][2], policy.evaluate(params, obs[2], action[2])["log_prob"], rtol=1e-6
    )


def test_a_runner_built_again_on_an_equal_linen_policy_compiles_nothing(compile_events) -> None:
    """``mlp_policy`` called again gives the same functions, so a second runner with the
    same connectors (a cell run again) takes the first one's compiled policy step and
    per-sample connector program: JAX traces, lowers and compiles nothing, and the
    samples are the same for the same seed."""
    connectors = jr.connectors.Connectors(obs=[jr.connectors.NormalizeObservation()])

    def samples() -> list[jr.Trajectory]:
        envs = jr.make_vec("CartPole-v1", 3)
        policy = jr.models.mlp_policy(envs.single_action_space, hidden=(8,))
        params = policy.init(jax.random.key(0), envs.single_observation_space)
        with jr.EnvRunner(envs, policy, params, 5, seed=2, connectors=connectors) as runner:
            return [runner.sample(), runner.sample()]

    first = samples()
    with compile_events() as events:
        again = samples()
    assert events == []
    jr.testing.assert_trees_equal(again, first)


def test_linen_policies_share_functions_only_where_module_space_and_mode_are_equal() -> None:
    box = spaces.Box(-1.0, 1.0, (2,))
    mlp = jr.models.MLP(2, (8,))
    first = jr.Policy.from_linen(jr.models.MLP(2, (8,)), spaces.Box(-1.0, 1.0, (2,)))
    assert first.apply_fn is jr.Policy.from_linen(mlp, box).apply_fn  # equal: the same
    others = [
        jr.Policy.from_linen(jr.models.MLP(2, (4,)), box),  # another module
        jr.Policy.from_linen(mlp, spaces.Box(-2.0, 2.0, (2,))),  # other bounds
        jr.Policy.from_linen(mlp, spaces.Box(-1.0, 1.0, (2,), np.float64)),  # other dtype
        jr.Policy.from_linen(mlp, box, deterministic=True),
        jr.Policy.from_linen(mlp, spaces.MultiDiscrete([2, 2])),  # another type, same shape
    ]
    fns = {id(p.apply_fn) for p in [first, *others]}
    assert len(fns) == 1 + len(others)


@pytest.mark.parametrize(
    "space",
    [spaces.Box(-1, 1, (2,), np.float16)]
    + [spaces.MultiDiscrete([3, 4], start=[1, 0], dtype=d) for d in (np.uint8, np.int16, np.int32)],
    ids=["box-float16", "multi-discrete-uint8", "multi-discrete-int16", "multi-discrete-int32"],
)
def test_the_built_in_heads_give_actions_of_the_spaces_dtype_with_their_log_prob(space) -> None:
    """A float16 Box, a MultiDiscrete of uint8 or int16: the built-in head's actions are
    cast to the space's dtype (JAX's float32/int32 do not cast safely to it: the runner
    refused the policy, which a user of mlp_policy could not change), with their log_prob
    recorded. int32 is the control."""
    dtype, discrete = space.dtype, isinstance(space, spaces.MultiDiscrete)

    class Small(gymnasium.Env):
        observation_space = spaces.Box(-1, 1, (3,), np.float32)
        action_space = space

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            return np.zeros(3, np.float32), {}

        def step(self, action):
            assert action.dtype == dtype, action.dtype  # as the space says
            assert not discrete or space.contains(action), action
            return np.zeros(3, np.float32), 0.0, False, False, {}

    envs = jr.make_vec(Small, 2)
    policy = jr.models.mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, 4, seed=0) as runner:
        traj = runner.sample()
    assert traj.action.dtype == dtype
    dist = policy.distribution(params, jax.numpy.asarray(traj.obs.reshape(8, 3)))
    expected = dist.log_prob(jax.numpy.asarray(traj.action.reshape(8, 2)))
    np.testing.assert_allclose(traj.extras["log_prob"].reshape(8), expected, rtol=1e-6)
