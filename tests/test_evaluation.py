"""Tests for jaxrunner._src.services.evaluation: jr.evaluate on envs of its own."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner.errors import EvaluationIncompleteError, InvalidArgumentError


class Net(nn.Module):
    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        init = nn.initializers.normal(1.0)
        return nn.Dense(2, kernel_init=init)(obs), nn.Dense(1)(obs)[:, 0]


@pytest.fixture(scope="module")
def setup() -> tuple[jr.Policy, object, Net]:
    module = Net()
    envs = jr.make_vec("CartPole-v1", num_envs=1)
    policy = jr.Policy.from_linen(module, envs.single_action_space)
    params = policy.init(jax.random.key(3), envs.single_observation_space)
    envs.close()
    return policy, params, module


def test_deterministic_acts_with_the_mode_over_complete_episodes(setup) -> None:
    policy, params, module = setup
    envs = jr.make_vec("CartPole-v1", num_envs=3)
    result = jr.evaluate(envs, policy, params, num_episodes=7, seed=5)
    assert result.num_episodes == 7
    # A fixed share per env: 3, 2, 2, each env's first episodes.
    assert [e.env_id for e in result.episodes] == [0, 0, 0, 1, 1, 2, 2]
    np.testing.assert_array_equal(result.env_ids, [0, 0, 0, 1, 1, 2, 2])
    assert result.agent_returns == {}  # multi-agent envs only
    for episode in result.episodes:
        assert episode.is_complete and episode.is_done and not episode.faulty
        logits, value = module.apply(params["module"], episode.obs[:-1])
        np.testing.assert_array_equal(episode.action, np.argmax(logits, axis=-1))
        np.testing.assert_allclose(episode.extras["value"], value, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(result.returns, [e.total_return for e in result.episodes])
    np.testing.assert_array_equal(result.lengths, [e.length for e in result.episodes])
    assert result.return_mean == pytest.approx(np.mean(result.returns))
    assert result.return_std == pytest.approx(np.std(result.returns))
    assert result.return_min == result.returns.min()
    assert result.return_max == result.returns.max()
    assert result.length_mean == pytest.approx(np.mean(result.lengths))
    assert result.summary()["num_episodes"] == 7.0

    # The envs stay open, and the same call gives the same episodes.
    again = jr.evaluate(envs, policy, params, num_episodes=7, seed=5)
    np.testing.assert_array_equal(again.returns, result.returns)
    envs.close()


def test_stochastic_matches_a_sampling_runner(setup) -> None:
    """deterministic=False: the episodes a plain runner samples, env by env."""
    policy, params, _ = setup
    result = jr.evaluate(
        jr.make_vec("CartPole-v1", num_envs=2),
        policy,
        params,
        num_episodes=4,
        deterministic=False,
        seed=9,
    )
    with jr.EnvRunner(
        jr.make_vec("CartPole-v1", num_envs=2), policy, params, rollout_length=32, seed=9
    ) as runner:
        sampled = runner.sample_episodes(12)
    for env_id in (0, 1):
        want = [e for e in sampled if e.env_id == env_id][:2]
        got = [e for e in result.episodes if e.env_id == env_id]
        assert len(got) == 2
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a.action, b.action)
            np.testing.assert_array_equal(a.obs, b.obs)
            np.testing.assert_array_equal(a.extras["log_prob"], b.extras["log_prob"])
    # Sampling differs from the mode somewhere.
    actions = np.concatenate([e.action for e in result.episodes])
    obs = np.concatenate([e.obs[:-1] for e in result.episodes])
    mode = np.argmax(policy.distribution(params, obs).logits, axis=-1)
    assert np.any(actions != mode)


class _Endless(gymnasium.Env):
    """CartPole's spaces, an episode that never ends (no time limit)."""

    observation_space = gymnasium.make("CartPole-v1").observation_space
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        return np.zeros(4, np.float32), 1.0, False, False, {}


def test_max_env_steps_gives_up_with_the_episodes_that_completed(setup) -> None:
    policy, params, _ = setup
    envs = jr.make_vec([lambda: gymnasium.make("CartPole-v1"), _Endless], 2)
    with envs:
        with pytest.raises(EvaluationIncompleteError, match=r"envs \[1\] have not") as info:
            jr.evaluate(envs, policy, params, num_episodes=4, max_env_steps=512)
        with pytest.raises(InvalidArgumentError, match="max_env_steps"):
            jr.evaluate(envs, policy, params, num_episodes=4, max_env_steps=0)
    message = str(info.value)
    assert "max_env_steps=512): 2 of 4 episodes complete after 512 env steps" in message
    partial = info.value.partial_result
    assert partial.num_episodes == 2 and partial.env_ids.tolist() == [0, 0]
    assert [e.env_id for e in partial.episodes] == [0, 0]


class _ThreeSteps(_Endless):
    """CartPole's spaces, episodes of 3 steps."""

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.t += 1
        return np.zeros(4, np.float32), 1.0, self.t == 3, False, {}


class _ResetSlots(jr.SyncVectorEnv):
    """A SyncVectorEnv whose envs spend the call after each episode's end on a reset slot
    (no transition, no fault), as EnvPool's with ``keep_reset_steps=True``."""

    capabilities = dataclasses.replace(jr.SyncVectorEnv.capabilities, reset_steps=True)

    def reset_batch(self, seeds, options=None):
        self._ended = np.zeros(self.num_envs, bool)
        return super().reset_batch(seeds, options)

    def _step(self, per_env, rows):
        lo, hi = (0, self.num_envs) if rows is None else (rows.start, rows.stop)
        buf, resets = self._buffers, self._ended[lo:hi].copy()
        infos, reset_infos = [], {}
        for i in range(lo, hi):
            if resets[i - lo]:  # the new episode's first observation (reset already) again
                buf.next_obs[i], buf.reward[i] = buf.obs[i], 0.0
                buf.terminated[i] = buf.truncated[i] = False
                infos.append({})
                continue
            out = self._block.step(i, i + 1, per_env[i - lo : i - lo + 1])
            infos += out.infos
            reset_infos.update(out.reset_infos)
        self._ended[lo:hi] = ~resets & (buf.terminated[lo:hi] | buf.truncated[lo:hi])
        step = buf.batch_step(self.single_observation_space, rows, infos, reset_infos)
        return step._replace(reset_rows=resets if resets.any() else None)


def test_max_env_steps_counts_transitions_not_reset_slots(setup) -> None:
    """Each 3-step episode takes 4 slots (its reset slot after it). After 2 samples of 4
    slots, 6 transitions: evaluate gave up at max_env_steps=7, counting 8 env steps."""
    policy, params, _ = setup
    with _ResetSlots([_ThreeSteps]) as envs:
        kwargs = {"num_episodes": 3, "rollout_length": 4}
        result = jr.evaluate(envs, policy, params, **kwargs, max_env_steps=7)
        assert result.lengths.tolist() == [3, 3, 3]
        with pytest.raises(EvaluationIncompleteError, match="2 of 3 episodes complete after 6 env"):
            jr.evaluate(envs, policy, params, **kwargs, max_env_steps=6)


def test_bad_num_episodes(setup) -> None:
    policy, params, _ = setup
    envs = jr.make_vec("CartPole-v1", num_envs=1)
    with pytest.raises(ValueError, match="num_episodes"):
        jr.evaluate(envs, policy, params, num_episodes=0)
    with pytest.raises(TypeError, match=r"evaluate\(deterministic='no'\)"):  # ran greedy
        jr.evaluate(envs, policy, params, num_episodes=1, deterministic="no")
    for name, bad in (("rollout_length", True), ("seed", -1)):  # evaluate's, named so
        with pytest.raises(InvalidArgumentError, match=rf"^evaluate\({name}={bad}\): expected"):
            jr.evaluate(envs, policy, params, num_episodes=1, **{name: bad})
    # The runner's own checks of policy and params, noted as evaluate()'s.
    with pytest.raises(jr.errors.InvalidArgumentError, match="could not be applied") as raised:
        jr.evaluate(envs, policy, {"w": np.zeros(3)}, num_episodes=1)
    assert any("evaluate()" in note for note in raised.value.__notes__)
    envs.close()
    with pytest.raises(ValueError, match=r"make_vec\(seed=-1\): expected an int >= 0"):
        jr.make_vec("CartPole-v1", 2, seed=-1)  # was refused by gymnasium, after building


# -- with the training runner's connectors (issue 29) ------------------------------------------


def test_evaluate_with_connectors_uses_the_training_statistics_frozen(setup) -> None:
    from jaxrunner import connectors as C

    policy, params, module = setup
    conn = C.Connectors(obs=[C.NormalizeObservation(clip=None)], reward=C.ScaleReward())
    with jr.EnvRunner(jr.make_vec("CartPole-v1", 2), policy, params, 16, 0, connectors=conn) as r:
        r.sample()
        r.sample()
        state = r.get_connector_state()
    stats = state.obs[0].shared.stats
    mean, std = np.asarray(stats.mean), np.sqrt(np.asarray(stats.var) + 1e-8)
    envs = jr.make_vec("CartPole-v1", num_envs=3)  # per-env state of 2 envs is not taken
    result = jr.evaluate(
        envs, policy, params, 3, seed=1, connectors=conn, connector_state=conn.state_dict(state)
    )
    for episode in result.episodes:  # the policy acted on the training statistics, frozen
        logits, _ = module.apply(params["module"], (episode.obs[:-1] - mean) / std)
        np.testing.assert_array_equal(episode.action, np.argmax(logits, axis=-1))
    with pytest.raises(jr.errors.InvalidArgumentError, match="connector_state=runner"):
        jr.evaluate(envs, policy, params, 1, connectors=conn)
    with pytest.raises(jr.errors.InvalidArgumentError, match="connectors=<"):
        jr.evaluate(envs, policy, params, 1, connector_state=state)
    # A state that does not fit the connectors: the connectors' own check (worded as
    # set_connector_state's), noted as evaluate's argument.
    for bad in ({"nope": state.obs[0]}, 5):
        with pytest.raises(jr.errors.JaxRunnerError, match="set_connector_state") as raised:
            jr.evaluate(envs, policy, params, 1, connectors=conn, connector_state=bad)
        assert "evaluate(connector_state=...)" in " ".join(getattr(raised.value, "__notes__", []))
    envs.close()


def test_evaluate_called_again_compiles_nothing(setup, compile_events) -> None:
    """``deterministic()`` gives the same acting function each time, so a second
    evaluation takes the first one's compiled program, with the same episodes."""
    policy, params, _ = setup

    def returns() -> list[float]:
        envs = jr.make_vec("CartPole-v1", num_envs=2)
        return jr.evaluate(envs, policy, params, 3, seed=1).returns.tolist()

    first = returns()
    with compile_events() as events:
        assert returns() == first
    assert events == []


def test_deterministic_with_a_policy_without_distribution_names_evaluate_and_the_way_out() -> None:
    """The default ``deterministic=True`` on a hand-written Policy (apply_fn only) is
    refused as evaluate's argument, with ``deterministic=False`` as the fix, not as a
    ``Policy.deterministic`` call the caller never made."""

    def apply_fn(params, obs, carry, keys):
        return jnp.zeros(obs.shape[0], jnp.int32), {}, carry

    policy = jr.Policy(apply_fn)
    with jr.make_vec("CartPole-v1", num_envs=2) as envs:
        refused = r"^evaluate\(deterministic=True\): the policy .*deterministic=False"
        with pytest.raises(InvalidArgumentError, match=refused):
            jr.evaluate(envs, policy, {}, num_episodes=2)
        result = jr.evaluate(envs, policy, {}, num_episodes=2, deterministic=False)
    assert result.num_episodes == 2 and (result.episodes[0].action == 0).all()
