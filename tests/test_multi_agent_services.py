"""Runner services for multi-agent envs: evaluation (jr.evaluate), checked against the
env's known episode lengths and the runner's own agent episodes."""

from __future__ import annotations

import collections

import jax
import numpy as np
import pytest

pytest.importorskip("pettingzoo")

import jaxrunner as jr
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.testing import FaultPlan, faulty_env_fns
from tests import multi_agent_envs as envs_mod
from tests.test_multi_agent import random_policy, zero_params


@pytest.mark.parametrize("backend", ["sync", "process"])
def test_evaluate_returns_each_envs_first_episodes(backend):
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2, backend)
    policy, params = random_policy(3), zero_params(3)
    with envs:
        result = jr.evaluate(envs, policy, params, 5, deterministic=False, seed=3)
        again = jr.evaluate(envs, policy, params, 5, deterministic=False, seed=3)
    assert isinstance(result, jr.multi_agent.MultiAgentEvaluationResult)
    # Env 0 gives its first 3 episodes, env 1 its first 2. ComingAndGoing's episode k
    # ends at step 6 + k % 2 (when its last agent, a2, terminates).
    np.testing.assert_array_equal(result.env_ids, [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(result.lengths, [6, 7, 6, 6, 7])
    total = sum(result.agent_returns.values())
    np.testing.assert_allclose(result.returns, total)
    assert result.agent_returns["a3"].tolist() == [0.0] * 5  # never appears
    np.testing.assert_array_equal(result.returns, again.returns)  # same seed, same result

    # The same episodes, from the runner's own agent episodes.
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2, backend)
    with jr.EnvRunner(envs, policy, params, 32, seed=3) as runner:
        by_env_episode: dict[tuple[int, int], float] = collections.defaultdict(float)
        for episode in runner.sample_episodes(40):
            by_env_episode[(episode.env_id, episode.episode_id)] += episode.total_reward
    firsts = [
        [ret for (env, _), ret in sorted(by_env_episode.items()) if env == b] for b in range(2)
    ]
    np.testing.assert_allclose(result.returns, firsts[0][:3] + firsts[1][:2])
    assert result.summary()["num_episodes"] == 5.0


def test_evaluate_skips_env_episodes_cut_by_a_failed_step():
    # As for a single-agent env (sample_episodes skips faulty episodes): env 0's every
    # instance fails at its 10th step, in its second episode, and is restarted; that
    # episode was counted, merged with the next one (length 3 + 6 = 10).
    fault = jr.testing.FaultPlan(kind="raise", at=(10,))
    fns = jr.testing.faulty_env_fns(envs_mod.coming_and_going, 2, {0: [fault]})
    policy, params = random_policy(3), zero_params(3)
    envs = jr.make_vec(fns, 2, restart_policy=jr.RestartPolicy())
    with envs:
        result = jr.evaluate(envs, policy, params, 6, deterministic=False, seed=3)
    np.testing.assert_array_equal(result.env_ids, [0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(result.lengths, [6, 6, 6, 6, 7, 6])  # env 0: first episodes
    envs = jr.make_vec(fns, 2, restart_policy=jr.RestartPolicy())
    with jr.EnvRunner(envs, policy, params, 32, seed=3) as runner:
        by_env_episode: dict[tuple[int, int], float] = collections.defaultdict(float)
        faulty = set()
        for episode in runner.sample_episodes(60, include_faulty=True):
            by_env_episode[(episode.env_id, episode.episode_id)] += episode.total_reward
            if episode.faulty:
                faulty.add((episode.env_id, episode.episode_id))
    assert any(env == 0 for env, _ in faulty)
    firsts = [
        [r for (env, e), r in sorted(by_env_episode.items()) if env == b and (b, e) not in faulty]
        for b in range(2)
    ]
    np.testing.assert_allclose(result.returns, firsts[0][:3] + firsts[1][:3])


def test_evaluate_refuses_a_policy_dict_for_single_agent_envs():
    envs = jr.make_vec("CartPole-v1", 2)
    with envs, pytest.raises(jr.errors.InvalidArgumentError, match=r"one jaxrunner\.Policy"):
        jr.evaluate(envs, {"policy_0": random_policy(2)}, zero_params(2), 2)


class _Recorder(jr.multi_agent.AgentCallbacks):
    def __init__(self):
        self.ended = []

    def on_agent_episode_end(self, runner, episode):
        self.ended.append(episode)


@pytest.mark.parametrize("factory", [envs_mod.coming_and_going, envs_mod.relay])
def test_callbacks_see_each_complete_agent_episode_once(factory):
    n = 3 if factory is envs_mod.coming_and_going else 4
    policy, params = random_policy(n), zero_params(n)
    recorder = _Recorder()
    envs = jr.make_multi_agent_vec(factory, 2)
    with jr.EnvRunner(envs, policy, params, 5, seed=1, callbacks=recorder) as runner:
        for _ in range(4):  # 20 steps: episodes span samples
            runner.sample()
    envs = jr.make_multi_agent_vec(factory, 2)
    with jr.EnvRunner(envs, policy, params, 20, seed=1) as runner:
        reference = runner.sample_episodes(len(recorder.ended))
    # The same agent episodes (the callbacks see them sample by sample, so in another
    # order than one long sample sorts them), each whole.
    assert len(recorder.ended) > 4
    ended = sorted(recorder.ended, key=lambda e: (e.episode_id, e.agent_id))
    reference = sorted(reference, key=lambda e: (e.episode_id, e.agent_id))
    assert [(e.episode_id, e.agent_id) for e in ended] == [
        (e.episode_id, e.agent_id) for e in reference
    ]
    for got, want in zip(ended, reference):
        np.testing.assert_array_equal(got.reward, want.reward)
        np.testing.assert_array_equal(got.action, want.action)


def test_callbacks_and_splits_end_an_agent_episode_a_fault_cuts_at_a_sample_start():
    """A failed env step at the first step of a sample ends, as a fault, the agent
    episodes under way since the sample before: each sample's split holds a zero-length
    faulty piece for them, and the callbacks see each whole, as a split of the samples
    joined does."""
    fault = FaultPlan(kind="raise", at=(4,))
    fns = faulty_env_fns(envs_mod.coming_and_going, 3, {1: [fault]}, agent="a1")
    envs = jr.make_vec(fns, 3, restart_policy=jr.RestartPolicy())
    recorder, samples = _Recorder(), []
    with jr.EnvRunner(envs, random_policy(3), zero_params(3), 11, 5, callbacks=recorder) as runner:
        for _ in range(3):
            samples.append(jax.device_get(runner.sample()))
            recorder.ended.append(None)  # the end of a sample
    assert not samples[1].valid[0].all()  # the case: a fault at a sample's first step
    whole = jr.concatenate(samples).split_episodes()
    key = lambda e: (e.env_id, e.episode_id, e.agent_id)  # noqa: E731
    by_sample = []
    for i in range(3):
        ends = [
            {key(e) for e in jr.concatenate(samples[:n]).split_episodes() if e.is_done}
            for n in (i, i + 1)
            if n
        ]
        new = ends[-1] - (ends[0] if i else set())
        by_sample.append(sorted(new - {key(e) for e in whole if not e.is_complete}))
    complete = {key(e): e for e in whole if e.is_complete}
    seen, i = [], 0
    for episode in recorder.ended:
        if episode is None:
            assert sorted(map(key, seen)) == by_sample[i], f"sample {i}"
            seen, i = [], i + 1
            continue
        seen.append(episode)
        jax.tree.map(np.testing.assert_array_equal, episode, complete[key(episode)])
        assert episode.faulty == complete[key(episode)].faulty
    assert any(e.faulty for e in whole if e.is_complete)


def test_callbacks_that_override_nothing_are_never_called():
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2)
    callbacks = jr.multi_agent.AgentCallbacks()
    with jr.EnvRunner(
        envs, random_policy(3), zero_params(3), 5, seed=1, callbacks=callbacks
    ) as runner:
        assert runner._on_agent_episode_end is None
        runner.sample()
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2)
    with pytest.raises(jr.errors.InvalidArgumentTypeError, match="AgentCallbacks"):
        jr.EnvRunner(envs, random_policy(3), zero_params(3), 5, seed=1, callbacks=object())
    # Refused before the runner took the envs: another runner may have them.
    with jr.EnvRunner(envs, random_policy(3), zero_params(3), 5, seed=1) as runner:
        assert runner.sample().num_steps == 5


def test_evaluate_takes_a_pure_jax_multi_agent_env():
    import jax.numpy as jnp

    from tests.test_multi_agent_jax import Drift
    from tests.test_multi_agent_jax import random_policy as scan_policy

    policy, params = scan_policy(3), {"w": jnp.array([0.3, 0.0, -0.3])}
    envs = jr.multi_agent.JaxMultiAgentVectorEnv(Drift(), 2)
    result = jr.evaluate(envs, policy, params, 5, deterministic=False, seed=3)
    assert isinstance(result, jr.multi_agent.MultiAgentEvaluationResult)
    # The same env episodes from a runner of the same seed: each env's first ones.
    envs = jr.multi_agent.JaxMultiAgentVectorEnv(Drift(), 2)
    with jr.EnvRunner(envs, policy, params, 40, seed=3) as runner:
        traj = runner.sample().to_numpy()
    rewards = sum(np.where(g.valid, g.reward, 0.0).sum(-1) for g in traj.groups.values())
    want: list[tuple[int, float, int]] = []
    for b, share in enumerate([3, 2]):
        ends = np.flatnonzero(traj.env_done[:, b])[:share]
        starts = [0, *(ends[:-1] + 1)]
        want += [(b, rewards[s : e + 1, b].sum(), e + 1 - s) for s, e in zip(starts, ends)]
    np.testing.assert_array_equal(result.env_ids, [b for b, _, _ in want])
    np.testing.assert_allclose(result.returns, [r for _, r, _ in want], rtol=1e-6)
    np.testing.assert_array_equal(result.lengths, [n for _, _, n in want])
    assert set(result.lengths.tolist()) <= {5, 6}  # Drift's episodes: x1 is done at 5 or 6


def test_evaluate_pure_jax_multi_agent_with_connectors_as_normalized_by_hand():
    """Frozen training statistics on a pure-JAX multi-agent env: the same episodes as a
    policy without connectors that compares the raw observations with the mean."""
    import jax.numpy as jnp

    from jaxrunner import connectors as C
    from tests.test_multi_agent_jax import Drift

    def toward(threshold):  # push the position (obs[1]) back toward ``threshold``
        def apply_fn(params, obs, carry, keys):
            return jnp.where(obs[:, 1] > threshold, 0, 2), {}, carry

        return jr.Policy(apply_fn)

    conn = C.Connectors(obs=[C.NormalizeObservation(clip=None)])
    train = jr.multi_agent.JaxMultiAgentVectorEnv(Drift(), 2)
    with jr.EnvRunner(train, toward(np.inf), {}, 16, 0, connectors=conn) as runner:
        runner.sample()  # always pushed right: the mean position is far from 0
        state = runner.get_connector_state()
    mean = jnp.asarray(state["policy_0"].obs[0].shared.stats.mean, jnp.float32)
    assert float(mean[1]) > 1.0
    envs = jr.multi_agent.JaxMultiAgentVectorEnv(Drift(), 3)
    kwargs = {"seed": 4, "deterministic": False}  # the policies act without a distribution
    result = jr.evaluate(envs, toward(0.0), {}, 5, connectors=conn, connector_state=state, **kwargs)
    want = jr.evaluate(envs, toward(mean[1]), {}, 5, **kwargs)
    raw = jr.evaluate(envs, toward(0.0), {}, 5, **kwargs)
    assert type(result) is jr.EvaluationResult and result.episodes == []
    for field in ("env_ids", "returns", "lengths"):
        np.testing.assert_array_equal(getattr(result, field), getattr(want, field))
    assert set(result.agent_returns) == {"x0", "x1"}
    for agent, returns in result.agent_returns.items():
        np.testing.assert_array_equal(returns, want.agent_returns[agent])
    np.testing.assert_allclose(result.returns, sum(result.agent_returns.values()), rtol=1e-12)
    assert result.summary()["return_mean/x1"] == float(np.mean(result.agent_returns["x1"]))
    assert not np.array_equal(result.returns, raw.returns)  # the statistics made the difference


def sign_policy() -> jr.Policy:
    """Action 1 where the (normalized) observation's last entry is positive, else 0."""
    import jax.numpy as jnp

    def apply_fn(params, obs, carry, keys):
        return (obs[:, 2] > 0).astype(jnp.int32), {}, carry

    return jr.Policy(apply_fn)


def by_hand(seed: int, count: int, mean: np.ndarray) -> list[float]:
    """ComingAndGoing's first ``count`` episode returns, every agent acting on whether its
    observation's last entry is above ``mean``'s (what the frozen statistics make of it)."""
    env, returns, total = envs_mod.ComingAndGoing(), [], 0.0
    obs, _ = env.reset(seed=seed)
    while len(returns) < count:
        obs, rewards, _, _, _ = env.step({a: int(obs[a][2] > mean[2]) for a in env.agents})
        total += sum(rewards.values())
        if not env.agents:
            returns, total = [*returns, total], 0.0
            obs, _ = env.reset()
    return returns


def test_evaluate_multi_agent_with_connectors_uses_the_training_statistics_frozen():
    from jaxrunner import connectors as C

    conn = C.Connectors(obs=[C.NormalizeObservation(clip=None)])
    train_envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2)
    with jr.EnvRunner(train_envs, sign_policy(), {}, 16, 0, connectors=conn) as runner:
        runner.sample()
        state = runner.get_connector_state()
    mean = np.asarray(state["policy_0"].obs[0].shared.stats.mean)
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2)
    with envs:
        result = jr.evaluate(
            envs, sign_policy(), {}, 4, deterministic=False, seed=1, connectors=conn,
            connector_state=state,
        )  # fmt: skip
        again = jr.evaluate(
            envs, sign_policy(), {}, 4, deterministic=False, seed=1, connectors={"policy_0": conn},
            connector_state=state,
        )  # fmt: skip
        by_name = jr.evaluate(  # a dict by connector name, as a single-agent env takes it
            envs, sign_policy(), {}, 4, deterministic=False, seed=1, connectors=conn,
            connector_state={"policy_0": conn.state_dict(state["policy_0"])},
        )  # fmt: skip
        with pytest.raises(jr.errors.InvalidArgumentError, match="connector_state=runner"):
            jr.evaluate(envs, sign_policy(), {}, 1, deterministic=False, connectors=conn)
        with pytest.raises(jr.errors.InvalidArgumentError, match="policy ids"):
            jr.evaluate(
                envs, sign_policy(), {}, 1, deterministic=False, connectors=conn,
                connector_state={"ghost": state["policy_0"]},
            )  # fmt: skip
    want = [r for i, s in enumerate(jr.env_seeds(1, 2)) for r in by_hand(s, 2, mean)]
    np.testing.assert_array_equal(result.env_ids, [0, 0, 1, 1])
    np.testing.assert_allclose(result.returns, want, rtol=1e-12)
    np.testing.assert_array_equal(again.returns, result.returns)  # the statistics stay frozen
    np.testing.assert_array_equal(by_name.returns, result.returns)
    assert not np.allclose(want, [r for s in jr.env_seeds(1, 2) for r in by_hand(s, 2, 0 * mean)])


class _Steps(jr.multi_agent.AgentCallbacks):
    """Every env episode the per-step hooks saw: its hooks in order, and what they read."""

    def __init__(self):
        self.calls, self.ended = [], []

    def on_episode_start(self, runner, env_index, episode):
        self.calls.append(("start", env_index, episode.episode_id))
        episode.user_data["first"] = episode.obs[0]

    def on_episode_step(self, runner, env_index, episode):
        self.calls.append(("step", env_index, episode.episode_id))

    def on_episode_end(self, runner, env_index, episode):
        self.calls.append(("end", env_index, episode.episode_id))
        self.ended.append(
            (env_index, episode.episode_id, list(episode.reward), list(episode.infos),
             episode.action, episode.obs, episode.user_data["first"], episode.faulty)
        )  # fmt: skip


def test_per_step_hooks_see_each_env_episode_as_pettingzoo_stepped_by_hand():
    # MPE simple_tag (two groups, 8 cycles per episode) over samples of 5 steps: every
    # env episode that ended, its env rewards (summed over agents), per-agent infos,
    # first observations and actions, against the env stepped by hand.
    factory, length, num_envs = envs_mod.simple_tag_with_infos, 5, 2
    hooks = _Steps()
    envs = jr.make_vec(factory, num_envs)
    params = dict.fromkeys(envs.policy_ids, zero_params(5))
    with jr.EnvRunner(envs, random_policy(5), params, length, seed=1, callbacks=hooks) as r:
        trajs = [r.sample() for _ in range(4)]
    traj = jax.tree.map(lambda *x: np.concatenate(x), *trajs)
    assert len(hooks.ended) == 4  # two 8-step episodes per env in 20 steps
    for b in range(num_envs):
        mine = [e for e in hooks.ended if e[0] == b]
        env = factory()
        obs, _ = env.reset(seed=jr.env_seeds(1, num_envs)[b])
        t = 0
        for _, episode_id, rewards, infos, actions, seen, first, faulty in mine:
            assert not faulty and seen[0] is first and len(rewards) == len(actions) == 8
            for pid, agents in traj.agents.items():
                np.testing.assert_array_equal(first[pid], np.stack([obs[a] for a in agents]))
            for k in range(8):
                assert traj.episode_id[t, b] == episode_id and traj.step[t, b] == k
                step_actions = {}
                for pid, agents in traj.agents.items():
                    np.testing.assert_array_equal(actions[k][pid], traj.groups[pid].action[t, b])
                    step_actions.update(zip(agents, actions[k][pid]))
                obs, step_rewards, _, _, step_infos = env.step(step_actions)
                assert rewards[k] == sum(step_rewards.values())
                assert infos[k] == step_infos
                for pid, agents in traj.agents.items():
                    np.testing.assert_array_equal(
                        seen[k + 1][pid], np.stack([obs[a] for a in agents])
                    )
                t += 1
            assert not env.agents and traj.env_done[t - 1, b]
            obs, _ = env.reset()
    # Each env's hooks: start, its steps, end, then the next episode's start (ids go on).
    for b in range(num_envs):
        calls = [(kind, i) for kind, env_index, i in hooks.calls if env_index == b]
        first_id = calls[0][1]
        assert calls[:10] == [("start", first_id)] + [("step", first_id)] * 8 + [("end", first_id)]
        assert calls[10][0] == "start" and calls[10][1] == traj.episode_id[8, b]


def test_per_step_hooks_end_a_failed_env_episode_as_faulty(tmp_path):
    from tests.test_multi_agent_faults import AT, FAILING_ENV, faulty_fns, make_envs

    hooks = _Steps()
    envs = make_envs("sync", faulty_fns("raise"), True)
    with jr.EnvRunner(envs, random_policy(3), zero_params(3), 6, seed=5, callbacks=hooks) as runner:
        traj = runner.sample()
    (cut,) = [e for e in hooks.ended if e[-1]]
    assert cut[0] == FAILING_ENV and len(cut[2]) == AT - 1
    assert cut[1] == traj.episode_id[0, FAILING_ENV] != traj.episode_id[AT, FAILING_ENV]
    starts = [i for kind, b, i in hooks.calls if kind == "start" and b == FAILING_ENV]
    assert starts[1] == traj.episode_id[AT, FAILING_ENV]


def test_per_step_hooks_are_refused_where_they_cannot_run_in_order():
    class OnStep(jr.multi_agent.AgentCallbacks):
        def on_episode_step(self, runner, env_index, episode):
            pass

    config = jr.ProcessConfig(num_workers=2, ready_first=True)
    envs = jr.make_vec(envs_mod.coming_and_going, 2, backend="process", config=config)
    with pytest.raises(InvalidArgumentError, match="ready-first"):
        jr.EnvRunner(envs, random_policy(3), zero_params(3), 5, seed=1, callbacks=OnStep())
    envs.close()
    import jax.numpy as jnp

    from tests.test_multi_agent_jax import Drift
    from tests.test_multi_agent_jax import random_policy as scan_policy

    envs = jr.JaxVectorEnv(Drift(), num_envs=2)
    with pytest.raises(InvalidArgumentError, match=r"lax\.scan"):
        jr.EnvRunner(envs, scan_policy(3), {"w": jnp.zeros(3)}, 4, seed=0, callbacks=OnStep())
