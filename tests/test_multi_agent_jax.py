"""Pure-JAX (JaxMARL-style) multi-agent envs sampled as one jitted scan, checked
against the env stepped by hand with the documented keys; JaxMARL's own MPE where
jaxmarl is installed."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium import spaces

import jaxrunner as jr
from jaxrunner._src.core.metrics import RunnerMetrics
from jaxrunner._src.samplers.env_streams import (
    ENV_FIRST_RESET_STREAM,
    ENV_RESET_STREAM,
    ENV_STEP_STREAM,
)
from jaxrunner._src.samplers.episode_ids import EpisodeBook
from jaxrunner._src.samplers.sampler import SamplerSetup
from jaxrunner._src.samplers.scan import ScanSampler
from jaxrunner.errors import InvalidArgumentError, SpaceMismatchError
from jaxrunner.testing import Drift


def random_policy(num_actions):
    def apply_fn(params, obs, carry, keys):
        logits = jnp.zeros((keys.shape[0], num_actions)) + params["w"]
        action = jax.vmap(jax.random.categorical)(keys, logits)
        return action, {"log_prob": jnp.zeros(keys.shape)}, carry

    return jr.Policy(apply_fn)


def test_scan_matches_env_stepped_by_hand():
    env = Drift()
    envs = jr.multi_agent.JaxMultiAgentVectorEnv(env, 3)
    with jr.EnvRunner(envs, random_policy(3), {"w": jnp.zeros(3)}, 14, seed=9) as r:
        traj = r.sample().to_numpy()
        second = r.sample()
        metrics = r.get_metrics()
    group = traj.groups["policy_0"]
    root = jax.random.key(9)
    for i in range(3):
        first = jax.random.fold_in(jax.random.fold_in(root, ENV_FIRST_RESET_STREAM), i)
        obs, state = env.reset(first)
        alive = {"x0": True, "x1": True}
        for n in range(14):
            actions = {a: jnp.int32(group.action[n, i, k]) for k, a in enumerate(env.agents)}
            for k, a in enumerate(env.agents):
                assert group.valid[n, i, k] == alive[a]
                if alive[a]:
                    np.testing.assert_allclose(group.obs[n, i, k], obs[a], rtol=1e-6)
            key = jax.random.fold_in(
                jax.random.fold_in(jax.random.fold_in(root, ENV_STEP_STREAM), n), i
            )
            next_obs, state, rewards, dones, _ = env.step_env(key, state, actions)
            for k, a in enumerate(env.agents):
                if alive[a]:
                    # jit fuses the arithmetic: equal up to float32 rounding.
                    np.testing.assert_allclose(group.reward[n, i, k], rewards[a], rtol=1e-6)
                    assert group.terminated[n, i, k] == bool(dones[a])
                    np.testing.assert_allclose(group.next_obs[n, i, k], next_obs[a], rtol=1e-6)
                    alive[a] = not bool(dones[a])
                else:
                    assert group.reward[n, i, k] == 0 and not group.next_obs[n, i, k].any()
            assert traj.env_done[n, i] == bool(dones["__all__"])
            obs = next_obs
            if dones["__all__"]:
                reset = jax.random.fold_in(
                    jax.random.fold_in(jax.random.fold_in(root, ENV_RESET_STREAM), n), i
                )
                obs, state = env.reset(reset)
                alive = {"x0": True, "x1": True}
    # Episodes go on across samples; metrics count agent steps apart from env steps.
    assert metrics["num_env_steps"] == 2 * 14 * 3
    total = np.count_nonzero(group.valid) + int(np.count_nonzero(second.groups["policy_0"].valid))
    assert metrics["num_agent_steps"] == total
    assert metrics["agents"]["x0"]["episode_length_mean"] == 3


def test_no_sub_env_objects_to_return():
    envs = jr.multi_agent.JaxMultiAgentVectorEnv(Drift(), 2)
    with pytest.raises(InvalidArgumentError, match="no per-env objects"):
        envs.get_sub_environments()


def test_env_episodes_are_numbered_as_the_host_samplers_number_them():
    """The scan loop numbers env episodes on device; the host samplers' EpisodeBook,
    given the env's flags and rewards (the sum of its agents'), gives the same ids,
    steps and returns, across samples."""
    envs = jr.multi_agent.JaxMultiAgentVectorEnv(Drift(), 3)
    config = jr.MetricsConfig(episode_window=1000)
    with jr.EnvRunner(envs, random_policy(3), {"w": jnp.zeros(3)}, 7, seed=2, metrics=config) as r:
        trajs = [r.sample().to_numpy() for _ in range(3)]
        metrics = r.get_metrics()
    book, returns, lengths = EpisodeBook(3), [], []
    for traj in trajs:
        group = traj.groups["policy_0"]
        flags = traj.env_done
        buf = SimpleNamespace(
            reward=group.reward.astype(np.float64).sum(-1),
            terminated=flags.copy(),
            truncated=np.zeros_like(flags),
            valid=np.ones_like(flags),
            episode_id=np.zeros(flags.shape, np.int64),
            step=np.zeros(flags.shape, np.int64),
        )
        counts = book.close(buf, 7)
        np.testing.assert_array_equal(traj.episode_id, buf.episode_id)
        np.testing.assert_array_equal(traj.step, buf.step)
        returns.extend(counts.returns)
        lengths.extend(counts.lengths)
    assert 3 < metrics["num_episodes"] == len(returns)
    assert metrics["episode_length_mean"] == pytest.approx(np.mean(lengths))
    # Summed in float32 on device, in float64 by the book.
    assert metrics["episode_return_mean"] == pytest.approx(np.mean(returns), rel=1e-6)
    assert metrics["episode_return_min"] == pytest.approx(min(returns), rel=1e-6)


def test_jaxmarl_mpe_runs_and_keeps_every_agent_valid():
    jaxmarl = pytest.importorskip("jaxmarl")
    env = jaxmarl.make("MPE_simple_spread_v3")
    envs = jr.multi_agent.JaxMultiAgentVectorEnv(env, 8, dones_are_truncations=True)
    assert [g.agents for g in envs.groups] == [("agent_0", "agent_1", "agent_2")]
    with jr.EnvRunner(envs, random_policy(5), {"w": jnp.zeros(5)}, 30, seed=0) as r:
        traj = r.sample().to_numpy()
        metrics = r.get_metrics()
    group = traj.groups["policy_0"]
    assert group.valid.all()  # MPE agents stay for the whole episode
    # JaxMARL ends an MPE episode once its step count passes max_steps.
    assert (traj.step[traj.env_done] == env.max_steps).all()
    assert group.truncated[traj.env_done].all() and not group.terminated.any()
    assert metrics["num_agent_steps"] == 3 * metrics["num_env_steps"]


def test_a_jaxmarl_box_whose_shape_is_one_int_is_a_1d_box():
    """JaxMARL's Box takes its shape as one int too (Hanabi's observation space has
    shape=np.int64(658)): it must convert to the 1-D gymnasium Box, not fail with a raw
    TypeError while the env is adapted."""
    jaxmarl = pytest.importorskip("jaxmarl")
    from jaxmarl.environments.spaces import Box

    space = jr.multi_agent.to_gymnasium_space(Box(0.0, 1.0, np.int64(4), jnp.float32))
    assert space == spaces.Box(0.0, 1.0, (4,), np.float32)
    envs = jr.JaxVectorEnv(jaxmarl.make("hanabi"), num_envs=2)  # traced only: no compute
    assert [g.observation_space.shape for g in envs.groups] == [(658,)]


def test_a_jaxmarl_multidiscrete_space_is_a_gymnasium_multidiscrete():
    """JaxMARL's MultiDiscrete (switch_riddle's observations) converts, as Discrete and
    Box do; a JaxMARL-style env takes no observation_space=, so a refusal left no way in."""
    jaxmarl = pytest.importorskip("jaxmarl")
    from jaxmarl.environments.spaces import MultiDiscrete

    space = jr.multi_agent.to_gymnasium_space(MultiDiscrete([2, 3]))
    assert space == spaces.MultiDiscrete([2, 3], dtype=np.int32)
    envs = jr.JaxVectorEnv(jaxmarl.make("switch_riddle"), num_envs=2)
    (group,) = envs.groups
    assert group.observation_space == spaces.MultiDiscrete([2, 2], dtype=np.int32)
    with jr.EnvRunner(envs, random_policy(3), {"w": jnp.zeros(3)}, 6, seed=0) as r:
        obs = r.sample().to_numpy().groups[group.policy_id].obs
    assert obs.shape == (6, 2, 3, 2) and ((obs >= 0) & (obs < 2)).all()


def test_jaxmarl_mpe_with_connectors_keeps_statistics_of_every_agent_observation():
    jaxmarl = pytest.importorskip("jaxmarl")
    from jaxrunner import connectors as C

    envs = jr.multi_agent.JaxMultiAgentVectorEnv(
        jaxmarl.make("MPE_simple_spread_v3"), 4, dones_are_truncations=True
    )
    conn = C.Connectors(
        obs=[C.NormalizeObservation(clip=None), C.FrameStack(num_frames=2)],
        reward=C.ScaleReward(),
    )
    with jr.EnvRunner(
        envs, random_policy(5), {"w": jnp.zeros(5)}, 30, seed=0, connectors=conn
    ) as r:
        trajs = [r.sample().to_numpy() for _ in range(2)]
        stats = r.get_connector_state()["policy_0"].obs[0].shared.stats
    groups = [t.groups["policy_0"] for t in trajs]
    seen = np.concatenate([g.obs[g.valid] for g in groups]).astype(np.float64)
    assert float(stats.count) == len(seen) == 2 * 30 * 4 * 3
    np.testing.assert_allclose(stats.mean, seen.mean(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(stats.var, seen.var(0), rtol=1e-3, atol=1e-6)
    assert groups[1].extras["policy_obs"].shape == (30, 4, 3, 2, seen.shape[-1])
    assert np.isfinite(groups[1].extras["scaled_reward"]).all()


class Echo:
    """A JaxMARL-style env whose next observation is the action it got."""

    agents = ("a0", "a1")

    def observation_space(self, agent):
        return spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def action_space(self, agent):
        return spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, key):
        return {a: jnp.zeros(2) for a in self.agents}, jnp.int32(0)

    def step_env(self, key, t, actions):
        dones = {a: t >= 99 for a in self.agents} | {"__all__": t >= 99}
        return dict(actions), t + 1, {a: jnp.float32(0) for a in self.agents}, dones, {}


def test_box_actions_reach_the_env_clipped_and_are_recorded_as_sampled():
    """As on every other path (docs/concepts.md, ``action``)."""

    def outside(params, obs, carry, keys):  # 5: outside the Box [-1, 1]
        return jnp.full((keys.shape[0], 2), 5.0), {}, carry

    with jr.EnvRunner(jr.JaxVectorEnv(Echo(), num_envs=2), jr.Policy(outside), {}, 3, 0) as r:
        group = r.sample().to_numpy().groups["policy_0"]
    np.testing.assert_array_equal(group.action, np.full((3, 2, 2, 2), 5.0))
    np.testing.assert_array_equal(group.next_obs, np.ones((3, 2, 2, 2)))


class DriftFromOne(Drift):
    """Drift with actions 1 to 3: a done agent's recorded action, 0, is outside."""

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(3, start=1)


def test_an_acting_agents_action_outside_its_space_fails_the_sample_at_its_step():
    """Drift's x0 is done after 3 steps and waits for x1: its actions then are not the
    env's, and are not checked; an acting agent's bad action fails the sample."""

    def bad(agent, step, value):
        def apply_fn(params, obs, carry, keys):  # obs: [step, position, agent index]
            hit = (obs[:, 2] == agent) & (obs[:, 0] >= step)
            return jnp.where(hit, value, 1), {}, carry

        return jr.Policy(apply_fn)

    envs = lambda: jr.multi_agent.JaxMultiAgentVectorEnv(DriftFromOne(), 2)  # noqa: E731
    with jr.EnvRunner(envs(), bad(0, 3, 9), {}, 12, seed=0) as runner:  # x0's, once done
        assert not runner.sample().groups["policy_0"].valid.all()
    with (
        jr.EnvRunner(envs(), bad(1, 2, 9), {}, 12, seed=0) as runner,
        pytest.raises(
            jr.errors.InvalidActionError,
            match=r"sub-env 0 agent 'x1''s action 9 at step 2 of this sample is outside",
        ) as caught,
    ):
        runner.sample()
    assert caught.value.partial_trajectory.num_steps == 2

    def nan(params, obs, carry, keys):  # a float action that is not finite
        return jnp.full((keys.shape[0], 2), jnp.nan), {}, carry

    with (
        jr.EnvRunner(jr.JaxVectorEnv(Echo(), num_envs=2), jr.Policy(nan), {}, 3, 0) as runner,
        pytest.raises(jr.errors.InvalidActionError, match=r"'a0''s action \[nan, nan\] at step 0"),
    ):
        runner.sample()


def test_one_agent_env_is_one_group_of_one_agent():
    """The scan sampler run as groups on a one-agent JaxVectorEnv: its one group holds the
    EnvRunner's trajectory with an agent axis of one, bit for bit."""
    venv = lambda: jr.JaxVectorEnv(jr.testing.RandomWalk(), num_envs=3)  # noqa: E731
    policy = random_policy(2)
    params = {"w": jnp.zeros(2)}
    with jr.EnvRunner(venv(), policy, params, 9, seed=4) as single:
        trajs = [single.sample().to_numpy() for _ in range(2)]
        num_episodes = single.get_metrics()["num_episodes"]
    envs = venv()
    assert envs.policy_ids == ("default_policy",) and envs.possible_agents == ("agent_0",)
    metrics = RunnerMetrics(jr.MetricsConfig(), {"default_policy": ("agent_0",)})
    by_id = {"default_policy": jax.device_put(params)}
    setup = SamplerSetup({"default_policy": policy}, by_id, 9, 4, metrics, by_group=True)
    multi = ScanSampler(envs, setup)
    for traj in trajs:
        out = multi.sample(by_id).to_numpy()
        group = out.groups["default_policy"]
        for name in ("obs", "action", "reward", "terminated", "truncated", "next_obs"):
            np.testing.assert_array_equal(getattr(group, name)[:, :, 0], getattr(traj, name))
        np.testing.assert_array_equal(group.extras["log_prob"][:, :, 0], traj.extras["log_prob"])
        assert group.valid.all()
        np.testing.assert_array_equal(group.agent_step[:, :, 0], traj.step)
        np.testing.assert_array_equal(out.episode_id, traj.episode_id)
        np.testing.assert_array_equal(out.env_done, traj.terminated | traj.truncated)
    assert metrics.summary()["num_episodes"] == num_episodes > 0


def test_each_kind_refuses_the_other_kinds_options():
    with pytest.raises(InvalidArgumentError, match="dones_are_truncations"):
        jr.JaxVectorEnv(jr.testing.RandomWalk(), num_envs=2, dones_are_truncations=True)
    with pytest.raises(InvalidArgumentError, match="num_envs= by keyword"):
        jr.JaxVectorEnv(Drift(), 2)
    envs = jr.JaxVectorEnv(Drift(), num_envs=2, dones_are_truncations=True)
    assert envs.multi_agent and envs.policy_ids == ("policy_0",)
    with pytest.raises(InvalidArgumentError, match="compact_next_obs=True"):
        jr.EnvRunner(envs, random_policy(3), {"w": jnp.zeros(3)}, 4, 0, compact_next_obs=True)
    with jr.EnvRunner(envs, random_policy(3), {"w": jnp.zeros(3)}, 4, seed=0) as runner:
        assert runner.multi_agent and runner.sample().groups["policy_0"].valid.shape[:2] == (4, 2)


class _WrongObs(Drift):
    """Drift, with one thing reset returns unlike what it declares."""

    def __init__(self, wrong: str) -> None:
        self.wrong = wrong

    def observation_space(self, agent: str) -> spaces.Box:
        if self.wrong == "dtype":
            return spaces.Box(-9, 9, (3,), np.int32)
        return spaces.Box(-np.inf, np.inf, (4,) if self.wrong == "shape" else (3,), np.float32)

    def reset(self, key: jax.Array) -> tuple[dict[str, jax.Array], tuple]:
        obs, state = super().reset(key)
        return ({"x0": obs["x0"]} if self.wrong == "agent" else obs), state


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        ("shape", r"for agent 'x0': expected dtype float32 and shape \(4,\)"),
        ("dtype", r"for agent 'x0': expected dtype int32"),
        ("agent", r"without agent 'x1'"),
    ],
)
def test_reset_observations_unlike_the_agents_spaces_are_refused(wrong, match):
    # As a one-agent env's are (test_jax_env.py::test_bad_input_errors), when built,
    # not sampled with observations the policy was not initialised on.
    with pytest.raises(SpaceMismatchError, match=match):
        jr.multi_agent.JaxMultiAgentVectorEnv(_WrongObs(wrong), 2)
