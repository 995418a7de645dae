"""jr.gae and jr.discounted_returns: hand-computed episode boundaries, and property
tests against a plain Python loop written the other way round (forward sums), over
[T, B] and [T, B, A] arrays, with invalid slots cutting or skipped."""

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


def reference(reward, terminated, truncated, valid, value, next_value, gamma, lam, skip=False):
    """Advantages and discounted returns by summing forward over each step's episode;
    with ``skip``, over each column's valid slots only (invalid slots left at zero)."""
    if reward.ndim > 2 or skip:
        # Column by column, as [T, 1] batches (with skip: of the column's valid rows).
        columns = [x.reshape(len(x), -1) for x in (reward, terminated, truncated, valid)]
        columns += [x.reshape(len(x), -1) for x in (value, next_value)]
        advantages, returns = np.zeros(columns[0].shape), np.zeros(columns[0].shape)
        for n in range(columns[0].shape[1]):
            rows = np.flatnonzero(columns[3][:, n]) if skip else slice(None)
            adv, ret = reference(*(x[rows, n : n + 1] for x in columns), gamma, lam)
            advantages[rows, n], returns[rows, n] = adv[:, 0], ret[:, 0]
        return advantages.reshape(reward.shape), returns.reshape(reward.shape)
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
    agents = draw(st.sampled_from([(), (2,)]))  # [T, B] or a group's [T, B, A]
    p_term, p_trunc, p_invalid = (draw(st.sampled_from([0.0, 0.1, 0.4])) for _ in range(3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = (num_steps, num_envs, *agents)
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


@settings(max_examples=60, deadline=None)
@given(batch=batches(), gamma=st.floats(0.0, 1.0), lam=st.floats(0.0, 1.0), skip=st.booleans())
def test_matches_python_loop(batch, gamma, lam, skip):
    expected_adv, expected_ret = reference(**batch, gamma=gamma, lam=lam, skip=skip)
    out = jr.gae(**batch, skip_invalid=skip, gamma=gamma, lam=lam)
    np.testing.assert_allclose(out.advantages, expected_adv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        out.returns, np.where(batch["valid"], expected_adv + batch["value"], 0), atol=1e-4
    )
    del batch["value"]
    got = jr.discounted_returns(**batch, skip_invalid=skip, gamma=gamma)
    np.testing.assert_allclose(got, expected_ret, rtol=1e-4, atol=1e-4)


def group_of(batch):
    """A GroupTrajectory holding ``batch``'s arrays (``value`` as ``extras["value"]``),
    its ``agent_step`` counting each column's valid slots from its last episode end (an
    episode under way at the start: 3 steps in)."""
    reward, valid = batch["reward"], np.asarray(batch["valid"])
    done = np.asarray(batch["terminated"]) | np.asarray(batch["truncated"])
    agent_step, count = np.zeros(reward.shape, np.int64), np.full(reward.shape[1:], 3)
    for t in range(len(reward)):
        agent_step[t] = np.where(valid[t], count, 0)
        count = np.where(valid[t], np.where(done[t], 0, count + 1), count)
    return jr.multi_agent.GroupTrajectory(
        obs=reward, action=reward, reward=reward, terminated=batch["terminated"],
        truncated=batch["truncated"], next_obs=reward, extras={"value": batch["value"]},
        valid=batch["valid"], agent_step=agent_step,
    )  # fmt: skip


@settings(max_examples=20, deadline=None)
@given(batch=batches(), gamma=st.floats(0.0, 1.0), lam=st.floats(0.0, 1.0))
def test_a_group_skips_its_invalid_slots_and_group_gae_is_gae(batch, gamma, lam):
    """On a group, gae chains each agent's valid slots by default (an agent's turns):
    exactly the arrays' result with skip_invalid=True; group_gae is the same function."""
    assert jr.multi_agent.group_gae is jr.gae
    group, next_value = group_of(batch), batch["next_value"]
    out = jr.gae(group, next_value=next_value, gamma=gamma, lam=lam)
    by_keyword = jr.gae(**batch, skip_invalid=True, gamma=gamma, lam=lam)
    np.testing.assert_array_equal(out.advantages, by_keyword.advantages)
    np.testing.assert_array_equal(out.returns, by_keyword.returns)
    cut = jr.gae(group, next_value=next_value, skip_invalid=False, gamma=gamma, lam=lam)
    np.testing.assert_array_equal(cut.advantages, jr.gae(**batch, gamma=gamma, lam=lam).advantages)
    del batch["value"]
    np.testing.assert_array_equal(
        jr.discounted_returns(group, next_value=next_value, gamma=gamma),
        jr.discounted_returns(**batch, skip_invalid=True, gamma=gamma),
    )


def test_a_group_never_chains_across_an_unflagged_episode_start():
    """A failed env step cuts each agent's episode without a flag on its last slot (the
    failed slot is empty, as an agent's gap between turns): the next valid slot starting
    an episode (``agent_step`` 0) ends the slot before it, bootstrapped as a truncation,
    as a Trajectory's failed slot does."""
    ones = np.ones((3, 1, 1))
    flags = np.zeros((3, 1, 1), bool)
    valid = np.array([True, False, True])[:, None, None]  # t=1: the failed step
    group = jr.multi_agent.GroupTrajectory(
        obs=ones, action=ones, reward=ones, terminated=flags, truncated=flags, next_obs=ones,
        extras={"value": np.zeros_like(ones)}, valid=valid,
        agent_step=np.array([4, 0, 0])[:, None, None],  # t=2 starts a new episode
    )  # fmt: skip
    next_value = np.full_like(ones, 10.0)
    out = jr.gae(group, next_value=next_value, gamma=0.5, lam=1.0).advantages[:, 0, 0]
    assert out.tolist() == [1 + 0.5 * 10, 0.0, 1 + 0.5 * 10]  # t=0 bootstraps, unchained
    chained = group.replace(agent_step=np.array([4, 0, 5])[:, None, None])
    out = jr.gae(chained, next_value=next_value, gamma=0.5, lam=1.0).advantages[:, 0, 0]
    assert out.tolist() == [1 + 0.5 * 10 + 0.5 * 6, 0.0, 6.0]  # one episode: chained
    returns = jr.discounted_returns(group, next_value=next_value, gamma=0.5)[:, 0, 0]
    assert returns.tolist() == [6.0, 0.0, 6.0]


def test_skip_invalid_hand_computed():
    """Env 1's empty slot t=2 is skipped: t=1 chains to t=3 (the cut result's A1 = 10
    becomes 10 + .25 * A3); the other envs have no empty slot and are unchanged."""
    out = jr.gae(**arrays(), value=VALUE, skip_invalid=True, gamma=GAMMA, lam=LAM)
    expected = np.array(
        [
            [4.75, 5 + 0.25 * (10 + 0.25 * 26.25), 7.125],
            [-1.0, 10 + 0.25 * 26.25, 8.5],
            [17.25, 0.0, -2.0],
            [17.0, 26.25, 22.25],
            [21.0, 25.0, 21.0],
        ]
    )
    np.testing.assert_array_equal(np.asarray(out.advantages), expected)
    with pytest.raises(TypeError, match=r"gae\(skip_invalid=.*True or False"):
        jr.gae(**arrays(), value=VALUE, skip_invalid=1)


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


def test_float64_rates_keep_float32_values_under_x64():
    """With ``jax_enable_x64``, numpy float64 rates (a sweep's ``np.linspace``) are cast
    to the values' precision: the scan's carry stays float32 (it raised before)."""
    ones, flags = np.ones((4, 2), np.float32), np.zeros((4, 2), bool)
    arrays = {"reward": ones, "terminated": flags, "truncated": flags, "next_value": ones}
    expected = jr.gae(**arrays, value=ones, gamma=0.99, lam=0.95).advantages
    with jax.enable_x64(True):
        for rates in ({"gamma": np.float64(0.99)}, {"lam": np.float64(0.95)}):
            got = jr.gae(**arrays, value=ones, **{"gamma": 0.99, "lam": 0.95, **rates})
            assert got.advantages.dtype == np.float32
            np.testing.assert_allclose(got.advantages, expected, rtol=1e-6)


def test_trailing_value_axis_suggests_the_squeeze():
    """A critic's [T, B, 1] output: the error names the squeeze; other shapes do not."""
    with pytest.raises(ValueError, match=r"next_value=next_value\[\.\.\., 0\]"):
        jr.discounted_returns(**arrays(next_value=np.zeros((5, 3, 1))), gamma=GAMMA)
    with pytest.raises(ValueError, match=r"expected shape \(5, 3\)") as info:
        jr.discounted_returns(**arrays(next_value=np.zeros((5, 3, 2))), gamma=GAMMA)
    assert "[..., 0]" not in str(info.value)
