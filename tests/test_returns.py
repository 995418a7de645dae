"""jr.gae and jr.discounted_returns: hand-computed episode boundaries, and property
tests against a plain Python loop written the other way round (forward sums)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxrunner as jr

GAMMA, LAM = 0.5, 0.5

# Env 0: a termination at t=1, a truncation at t=3, the batch ends at t=4.
# Env 1: no flags, but slot t=2 holds no transition (a crashed step): the episode
#        before it is cut there, and t=3 starts a new one.
# Env 2: terminated and truncated together at t=2: termination wins (zero future).
REWARD = np.array([[1, 1, 1], [1, 2, 1], [1, 3, 1], [1, 4, 1], [1, 5, 1]], np.float64)
TERMINATED = np.zeros((5, 3), bool)
TERMINATED[1, 0] = TERMINATED[2, 2] = True
TRUNCATED = np.zeros((5, 3), bool)
TRUNCATED[3, 0] = TRUNCATED[2, 2] = True
VALID = np.ones((5, 3), bool)
VALID[2, 1] = False
NEXT_VALUE = np.tile(np.array([[10.0], [20.0], [30.0], [40.0], [50.0]]), (1, 3))
VALUE = np.tile(np.array([[1.0], [2.0], [3.0], [4.0], [5.0]]), (1, 3))


def arrays(**overrides):
    kwargs = dict(
        reward=REWARD,
        terminated=TERMINATED,
        truncated=TRUNCATED,
        valid=VALID,
        next_value=NEXT_VALUE,
    )
    kwargs.update(overrides)
    return kwargs


def test_discounted_returns_hand_computed():
    expected = np.array(
        [
            # env 0: G4 = 1 + .5*50 (batch end), G3 = 1 + .5*40 (truncated),
            # G2 = 1 + .5*G3, G1 = 1 (terminated), G0 = 1 + .5*G1.
            # env 1: G4 = 5 + .5*50, G3 = 4 + .5*G4, G2 = 0 (no transition),
            # G1 = 2 + .5*20 (cut before the empty slot), G0 = 1 + .5*G1.
            # env 2: G4 = 1 + .5*50, G3 = 1 + .5*G4, G2 = 1 (terminated and truncated),
            # G1 = 1 + .5*G2, G0 = 1 + .5*G1.
            [1.5, 7.0, 1.75],
            [1.0, 12.0, 1.5],
            [11.5, 0.0, 1.0],
            [21.0, 19.0, 14.0],
            [26.0, 30.0, 26.0],
        ]
    )
    got = jr.discounted_returns(**arrays(), gamma=GAMMA)
    np.testing.assert_array_equal(np.asarray(got), expected)


def test_gae_hand_computed():
    # delta[t] = r + .5 * (0 if terminated else next_value) - value; gamma*lam = .25.
    # env 0: deltas 5, -1, 13, 17, 21 -> A4 = 21, A3 = 17 (truncated),
    #        A2 = 13 + .25*17, A1 = -1 (terminated), A0 = 5 + .25*(-1).
    # env 1: deltas 5, 10, (none), 20, 25 -> A4 = 25, A3 = 20 + .25*25, A2 = 0,
    #        A1 = 10 (cut before the empty slot), A0 = 5 + .25*10.
    # env 2: deltas 5, 9, -2 (terminated), 17, 21 -> A4 = 21, A3 = 17 + .25*21, A2 = -2,
    #        A1 = 9 + .25*(-2), A0 = 5 + .25*8.5.
    expected = np.array(
        [
            [4.75, 7.5, 7.125],
            [-1.0, 10.0, 8.5],
            [17.25, 0.0, -2.0],
            [17.0, 26.25, 22.25],
            [21.0, 25.0, 21.0],
        ]
    )
    out = jr.gae(**arrays(), value=VALUE, gamma=GAMMA, lam=LAM)
    np.testing.assert_array_equal(np.asarray(out.advantages), expected)
    np.testing.assert_array_equal(np.asarray(out.returns), np.where(VALID, expected + VALUE, 0.0))


def test_no_valid_mask_means_all_valid():
    kwargs = arrays()
    del kwargs["valid"]
    np.testing.assert_array_equal(
        np.asarray(jr.discounted_returns(**kwargs, gamma=GAMMA)),
        np.asarray(jr.discounted_returns(**kwargs, valid=np.ones((5, 3), bool), gamma=GAMMA)),
    )


def test_from_trajectory_matches_arrays_and_jits(cartpole_runner):
    # Short CartPole (time limit 20) over 64 steps: terminations, truncations and
    # episodes running past the batch's end, all in one batch.
    runner = cartpole_runner(num_envs=4, rollout_length=64)
    traj = runner.sample()
    assert traj.truncated.any() and traj.terminated.any()
    next_value = np.random.default_rng(0).normal(size=traj.reward.shape)
    from_traj = jr.gae(traj, next_value=next_value, gamma=0.99, lam=0.95)
    from_arrays = jr.gae(
        reward=traj.reward,
        terminated=traj.terminated,
        truncated=traj.truncated,
        value=traj.extras["value"],
        next_value=next_value,
        gamma=0.99,
        lam=0.95,
    )
    np.testing.assert_array_equal(from_traj.advantages, from_arrays.advantages)
    jitted = jax.jit(lambda tr, nv: jr.gae(tr, next_value=nv, gamma=0.99, lam=0.95))
    np.testing.assert_allclose(jitted(traj, next_value).advantages, from_traj.advantages, atol=1e-5)
    returns = jr.discounted_returns(traj, next_value=next_value, gamma=0.99)
    assert returns.shape == traj.reward.shape


def test_errors():
    with pytest.raises(ValueError, match=r"next_value=.*expected shape \(5, 3\)"):
        jr.discounted_returns(**arrays(next_value=np.zeros((4, 3))), gamma=GAMMA)
    with pytest.raises(ValueError, match=r"terminated=.*boolean"):
        jr.discounted_returns(**arrays(terminated=TERMINATED.astype(np.float32)), gamma=GAMMA)
    with pytest.raises(ValueError, match=r"gamma=1.5.*\[0, 1\]"):
        jr.discounted_returns(**arrays(), gamma=1.5)
    with pytest.raises(ValueError, match="no value given"):
        jr.gae(**arrays(), gamma=GAMMA, lam=LAM)
    with pytest.raises(TypeError, match="Trajectory"):
        jr.gae(REWARD, next_value=NEXT_VALUE)
    with pytest.raises(jr.errors.JaxRunnerError, match="T >= 1"):
        jr.discounted_returns(**{k: v[:0] for k, v in arrays().items()})


# -- property tests against a plain Python loop ----------------------------------------------


def reference(reward, terminated, truncated, valid, value, next_value, gamma, lam):
    """Advantages and discounted returns by summing forward over each step's episode."""
    num_steps, num_envs = reward.shape
    advantages = np.zeros(reward.shape)
    returns = np.zeros(reward.shape)
    for b in range(num_envs):
        for t in range(num_steps):
            if not valid[t, b]:
                continue
            adv, ret, adv_discount, ret_discount = 0.0, 0.0, 1.0, 1.0
            k = t
            while True:
                future = 0.0 if terminated[k, b] else next_value[k, b]
                adv += adv_discount * (reward[k, b] + gamma * future - value[k, b])
                ret += ret_discount * reward[k, b]
                last = k == num_steps - 1
                if terminated[k, b] or truncated[k, b] or last or not valid[k + 1, b]:
                    ret += ret_discount * gamma * future
                    break
                adv_discount *= gamma * lam
                ret_discount *= gamma
                k += 1
            advantages[t, b], returns[t, b] = adv, ret
    return advantages, returns


@st.composite
def batches(draw):
    # Few distinct shapes: each new one compiles the scans again.
    num_steps = draw(st.sampled_from([1, 2, 7]))
    num_envs = draw(st.sampled_from([1, 3]))
    p_term, p_trunc, p_invalid = (draw(st.sampled_from([0.0, 0.1, 0.4])) for _ in range(3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = (num_steps, num_envs)
    valid = rng.random(shape) >= p_invalid
    return dict(
        reward=rng.normal(size=shape),
        # gymnasium never flags an empty slot; keep flags on valid slots only.
        terminated=(rng.random(shape) < p_term) & valid,
        truncated=(rng.random(shape) < p_trunc) & valid,
        valid=valid,
        value=rng.normal(size=shape),
        next_value=rng.normal(size=shape),
    )


@settings(max_examples=40, deadline=None)
@given(batch=batches(), gamma=st.floats(0.0, 1.0), lam=st.floats(0.0, 1.0))
def test_matches_python_loop(batch, gamma, lam):
    expected_adv, expected_ret = reference(**batch, gamma=gamma, lam=lam)
    out = jr.gae(**batch, gamma=gamma, lam=lam)
    np.testing.assert_allclose(out.advantages, expected_adv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        out.returns, np.where(batch["valid"], expected_adv + batch["value"], 0), atol=1e-4
    )
    del batch["value"]
    got = jr.discounted_returns(**batch, gamma=gamma)
    np.testing.assert_allclose(got, expected_ret, rtol=1e-4, atol=1e-4)


@settings(max_examples=25, deadline=None)
@given(batch=batches(), gamma=st.floats(0.0, 1.0))
def test_lambda_one_with_consistent_values_gives_discounted_returns(batch, gamma):
    # Inside an episode V(next_obs[t]) is V(obs[t+1]); then GAE(lambda=1)'s returns
    # telescope to the discounted returns.
    goes_on = np.zeros_like(batch["valid"])
    goes_on[:-1] = (
        batch["valid"][:-1]
        & batch["valid"][1:]
        & ~batch["terminated"][:-1]
        & ~batch["truncated"][:-1]
    )
    value = batch["value"]
    next_value = np.where(goes_on, np.roll(value, -1, axis=0), batch["next_value"])
    batch["next_value"] = next_value
    out = jr.gae(**batch, gamma=gamma, lam=1.0)
    del batch["value"]
    np.testing.assert_allclose(
        out.returns, jr.discounted_returns(**batch, gamma=gamma), rtol=1e-4, atol=1e-4
    )


def test_scalar_next_value_broadcasts():
    kwargs = arrays(next_value=0.0)
    np.testing.assert_array_equal(
        np.asarray(jr.discounted_returns(**kwargs, gamma=GAMMA)),
        np.asarray(jr.discounted_returns(**arrays(next_value=np.zeros((5, 3))), gamma=GAMMA)),
    )


def test_trailing_value_axis_suggests_the_squeeze():
    """A critic's [T, B, 1] output: the error names the squeeze; other shapes do not."""
    with pytest.raises(ValueError, match=r"next_value=next_value\[\.\.\., 0\]"):
        jr.discounted_returns(**arrays(next_value=np.zeros((5, 3, 1))), gamma=GAMMA)
    with pytest.raises(ValueError, match=r"expected shape \(5, 3\)") as info:
        jr.discounted_returns(**arrays(next_value=np.zeros((5, 3, 2))), gamma=GAMMA)
    assert "[..., 0]" not in str(info.value)
