"""Connectors with agent groups (EnvRunner): statistics from valid agent slots
only, frame stacks per agent and agent episode, identical outputs whatever the backend,
one compile, the scan path, and the per-policy API."""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium import spaces

pytest.importorskip("pettingzoo")

import jaxrunner as jr
from jaxrunner import connectors as C
from jaxrunner._src.connectors.per_group import per_policy_connectors
from jaxrunner._src.core.agent_groups import AgentGroup
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError, SpaceMismatchError
from tests import multi_agent_envs as envs_mod
from tests.test_connectors import CountingTraces, assert_moments_match, full_connectors
from tests.test_multi_agent import random_policy, zero_params
from tests.test_multi_agent_jax import Drift
from tests.test_multi_agent_jax import random_policy as scan_policy

# (factory, number of actions): a parallel env whose agents come and go (a3 never acts:
# pure padding) and a turn-based one (slots invalid between an agent's turns).
ENVS = [(envs_mod.coming_and_going, 3), (envs_mod.relay, 4)]


def sample(
    factory: Any,
    n: int,
    connectors: Any,
    num_samples: int = 2,
    backend: str = "sync",
    rollout_length: int = 10,
    **kwargs: Any,
) -> tuple[list[jr.MultiAgentTrajectory], dict[str, C.ConnectorsState]]:
    envs = jr.make_multi_agent_vec(factory, 3, backend, **kwargs)
    with jr.EnvRunner(
        envs, random_policy(n), zero_params(n), rollout_length, seed=4, connectors=connectors
    ) as runner:
        trajs = [runner.sample() for _ in range(num_samples)]
        return trajs, runner.get_connector_state()


def concatenate(trajs: list[jr.MultiAgentTrajectory]) -> jr.MultiAgentTrajectory:
    return jax.tree.map(lambda *x: np.concatenate(x), *trajs)


def check_stacks(group: jr.GroupTrajectory, k: int) -> None:
    """Each valid slot's stack is its agent's last ``k`` observations of the agent
    episode (its own turns, oldest first, the first repeated at the start); invalid slots
    hold zeros; the stack of next_obs is the stack shifted by it."""
    stacks = np.asarray(group.extras["policy_obs"])
    _, num_envs, num_agents = group.valid.shape
    checked = 0
    for b in range(num_envs):
        for a in range(num_agents):
            rows = np.flatnonzero(group.valid[:, b, a])
            for j, t in enumerate(rows):
                start = j - int(group.agent_step[t, b, a])
                assert start >= 0, "sampled from the reset: every agent episode is whole"
                want = [group.obs[rows[max(start, j - k + 1 + i)], b, a] for i in range(k)]
                np.testing.assert_array_equal(stacks[t, b, a], np.stack(want), f"{t} {b} {a}")
                checked += 1
    assert checked > 20
    assert not stacks[~np.asarray(group.valid)].any()
    nxt, valid = np.asarray(group.extras["policy_next_obs"]), np.asarray(group.valid)
    np.testing.assert_array_equal(nxt[valid][:, -1], np.asarray(group.next_obs)[valid])
    np.testing.assert_array_equal(nxt[valid][:, :-1], stacks[valid][:, 1:])
    assert not nxt[~valid].any()


# -- statistics --------------------------------------------------------------------------------


@pytest.mark.parametrize(("factory", "n"), ENVS)
def test_statistics_equal_numpy_over_the_valid_agent_observations_only(factory, n):
    conn = C.Connectors(obs=[C.NormalizeObservation(clip=None)])
    trajs, state = sample(factory, n, conn)
    groups = [t.groups["policy_0"] for t in trajs]
    seen = np.concatenate([g.obs[g.valid] for g in groups])
    assert (~groups[0].valid).any()  # there is padding, and it is left out
    assert_moments_match(state["policy_0"].obs[0].shared.stats, seen)
    # The first sample saw the raw obs (mean 0, var 1); the second used its statistics.
    first, second = groups
    np.testing.assert_allclose(first.extras["policy_obs"], first.obs, rtol=1e-7)
    ref = first.obs[first.valid]
    mean, var = ref.mean(0), ref.var(0)
    want = (second.obs - mean) / np.sqrt(var + 1e-8)
    # A turn-based agent's first slot of a sample may complete a turn it took in the
    # previous one (seen with that sample's statistics): left out.
    later = second.valid & (np.cumsum(second.valid, axis=0) > 1)
    np.testing.assert_allclose(
        second.extras["policy_obs"][later], want[later], rtol=1e-4, atol=1e-4
    )
    assert not np.asarray(second.extras["policy_obs"])[~second.valid].any()


@pytest.mark.parametrize("faulty", [False, True], ids=["", "faulty"])
def test_reward_scaling_follows_each_agent_s_return_across_its_turns(faulty):
    """In a turn-based env, an agent's slots are invalid between its turns: its
    discounted return goes on across them (reset only where its episode ends, or where
    its sub-env's step failed and the env was restarted)."""
    gamma = 0.9
    conn = C.Connectors(reward=C.ScaleReward(gamma=gamma))
    factory, options = envs_mod.relay, {}
    if faulty:  # env 1's 5th step raises, in every incarnation
        plan = jr.testing.FaultPlan(kind="raise", at=(5,))
        factory = jr.testing.faulty_env_fns(envs_mod.relay, 3, {1: [plan]})
        options = {"restart_policy": jr.RestartPolicy(backoff_s=0.0)}
    trajs, _ = sample(factory, 4, conn, rollout_length=12, **options)
    failures = [np.zeros(t.env_id.shape, bool) if t.valid is None else ~t.valid for t in trajs]
    assert faulty == any(f.any() for f in failures)
    ret, seen = np.zeros((3, 3)), []
    for traj, failed in zip(trajs, failures):
        g = traj.groups["policy_0"]
        for t in range(traj.num_steps):
            valid = g.valid[t]
            ret = np.where(valid, gamma * ret + g.reward[t], ret)
            seen.append(ret[valid])
            returns = np.concatenate(seen)
            var = returns.var() if len(returns) > 1 else 1.0  # as jr's Moments
            std = np.sqrt(var + 1e-8)
            want = np.where(valid, g.reward[t] / std, 0.0)
            np.testing.assert_allclose(g.extras["scaled_reward"][t], want, rtol=1e-4, atol=1e-6)
            ret[g.done[t] | failed[t][:, None]] = 0.0
    # Each agent waits between its turns, so resetting there would have shown.
    assert (~trajs[0].groups["policy_0"].valid).sum() > 20


# -- frame stack -------------------------------------------------------------------------------


@pytest.mark.parametrize(("factory", "n"), ENVS)
def test_frame_stack_restarts_per_agent_episode_and_never_mixes_envs_or_agents(factory, n):
    k = 3
    trajs, _ = sample(factory, n, C.Connectors(obs=[C.FrameStack(num_frames=k)]))
    group = concatenate(trajs).groups["policy_0"]
    check_stacks(group, k)
    # Each observation carries its agent's index: a stack holds one agent's frames.
    slot = np.arange(group.valid.shape[2])[None, None, :, None]
    stacks = group.extras["policy_obs"]
    assert (
        stacks[..., 1][group.valid] == np.broadcast_to(slot, stacks[..., 1].shape)[group.valid]
    ).all()


# -- determinism, compiles, transfers ----------------------------------------------------------


@pytest.mark.parametrize(("factory", "n"), ENVS)
def test_process_backend_gives_the_sync_backend_s_outputs_and_state(factory, n):
    sync, sync_state = sample(factory, n, full_connectors())
    proc, proc_state = sample(
        factory, n, full_connectors(), backend="process", config=jr.ProcessConfig(num_workers=2)
    )
    jax.tree.map(np.testing.assert_array_equal, sync, proc)
    jr.testing.assert_trees_equal(proc_state, sync_state, "connector state")
    assert set(sync[1].groups["policy_0"].extras) >= {
        "policy_obs",
        "policy_next_obs",
        "scaled_reward",
    }


def test_one_compile_and_new_statistics_never_retrace():
    counter = CountingTraces()
    conn = C.Connectors(obs=[C.NormalizeObservation(), counter])
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 3)
    with jr.EnvRunner(envs, random_policy(3), zero_params(3), 8, 0, connectors=conn) as r:
        assert len(counter.traces) == 1  # the group's one compiled step
        trajs = [r.sample() for _ in range(2)]
        state = r.get_connector_state()
        new_stats = C.set_statistics(state["policy_0"], [C.Moments.of(np.ones((5, 3)))])
        r.set_connector_state({"policy_0": new_stats})
        r.set_params(zero_params(3), "policy_0")
        trajs.append(r.sample())
        with jax.transfer_guard("disallow"):  # explicit transfers only, connectors included
            trajs.append(r.sample())
        shared = r.get_connector_state()["policy_0"].obs[1].shared
    # In a parallel env each acting agent completes its transition in the same step:
    # the in-step counter took in exactly the valid slots, never the padding.
    assert float(shared) == sum(int(t.groups["policy_0"].valid.sum()) for t in trajs)
    # One more trace: the per-sample part's default follow (compiled once).
    assert len(counter.traces) == 2, counter.traces


class Flip(C.ActionConnector):
    """Discrete action ``a`` -> ``2 - a``."""

    def __call__(self, action: Any) -> Any:
        return 2 - action


class RecordsActions(envs_mod.ComingAndGoing):
    log: ClassVar[list] = []  # what the env got

    def step(self, actions):
        RecordsActions.log.append(dict(actions))
        return super().step(actions)


def test_the_env_gets_the_action_connectors_actions_and_the_trajectory_the_policy_s():
    RecordsActions.log.clear()
    envs = jr.make_multi_agent_vec(RecordsActions, 1)
    conn = C.Connectors(action=[Flip()])
    with jr.EnvRunner(envs, random_policy(3), zero_params(3), 6, 0, connectors=conn) as r:
        group = r.sample().groups["policy_0"]
    agents = ("a0", "a1", "a2", "a3")
    for t, got in enumerate(RecordsActions.log):
        for agent, action in got.items():
            assert group.valid[t, 0, agents.index(agent)]
            assert action == 2 - group.action[t, 0, agents.index(agent)]
    assert len(RecordsActions.log) == 6


# -- the pure-JAX scan --------------------------------------------------------------------------


def test_scan_path_statistics_frame_stack_and_state():
    envs = jr.multi_agent.JaxMultiAgentVectorEnv(Drift(), 3)
    conn = C.Connectors(
        obs=[C.NormalizeObservation(clip=None), C.FrameStack(num_frames=2)],
        reward=C.ScaleReward(),
    )
    params = {"w": jnp.zeros(3)}
    with jr.EnvRunner(envs, scan_policy(3), params, 8, seed=2, connectors=conn) as r:
        trajs = [r.sample().to_numpy() for _ in range(2)]
        state = r.get_connector_state()
        r.set_connector_state(state)  # a copy in, never a recompile (compiled ahead of time)
        third = r.sample().to_numpy()
        with pytest.raises(InvalidArgumentError, match="state of 3 connectors"):
            r.set_connector_state({"policy_0": C.ConnectorsState()})
    groups = [t.groups["policy_0"] for t in trajs]
    assert (~groups[0].valid).any()  # x0 waits, done, until the episode ends
    seen = np.concatenate([g.obs[g.valid] for g in groups])
    assert_moments_match(state["policy_0"].obs[0].shared.stats, seen)
    # The policy's view: the normalized obs, stacked per agent episode.
    normalized = concatenate(trajs).groups["policy_0"]
    first = groups[0].obs[groups[0].valid]
    mean, std = first.mean(0), first.std(0)
    second = groups[1]
    last = second.extras["policy_obs"][:, :, :, -1]
    np.testing.assert_allclose(
        last[second.valid], ((second.obs - mean) / std)[second.valid], rtol=1e-3, atol=1e-4
    )
    stacked = normalized.replace(obs=normalized.extras["policy_obs"][:, :, :, -1])
    stacked = stacked.replace(next_obs=stacked.extras["policy_next_obs"][:, :, :, -1])
    check_stacks(stacked, 2)
    assert third.groups["policy_0"].extras["scaled_reward"].shape == (8, 3, 2)


# -- the API -----------------------------------------------------------------------------------


def test_connectors_per_policy_id_and_their_state():
    mapping = {"a0": "left", "a1": "right", "a2": "right", "a3": "left"}
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2, policy_mapping_fn=mapping.get)
    policies = {"left": random_policy(3), "right": random_policy(3)}
    params = {"left": zero_params(3), "right": zero_params(3)}
    conn = C.Connectors(obs=[C.NormalizeObservation()])
    with jr.EnvRunner(
        envs, policies, params, 6, seed=0, connectors={"right": conn, "left": None}
    ) as runner:
        traj = runner.sample()
        state = runner.get_connector_state()
        assert list(state) == ["right"]
        with pytest.raises(InvalidArgumentError, match="policy ids with connectors"):
            runner.set_connector_state({"left": state["right"]})
        with pytest.raises(InvalidArgumentError, match="policy 'right'"):
            runner.set_connector_state({"right": C.ConnectorsState()})
        # Checked as a single-agent runner's is: dtypes, finite floats; or a dict by name.
        leaves, treedef = jax.tree.flatten(state["right"])
        f = next(i for i, x in enumerate(leaves) if np.asarray(x).dtype == np.float32)
        for change, why in [
            (lambda x: x.astype(np.float16), "dtype float32"),
            (lambda x: np.full_like(x, np.nan), "finite values"),
        ]:
            bad = list(leaves)
            bad[f] = change(np.asarray(bad[f]))
            with pytest.raises(SpaceMismatchError, match=why):
                runner.set_connector_state({"right": treedef.unflatten(bad)})
        runner.set_connector_state({"right": conn.state_dict(state["right"])})
    assert "policy_obs" in traj.groups["right"].extras
    assert "policy_obs" not in traj.groups["left"].extras
    right = traj.groups["right"]
    assert_moments_match(state["right"].obs[0].shared.stats, right.obs[right.valid])


def test_one_connectors_for_every_group_keeps_a_state_per_group():
    mapping = {"a0": "left", "a1": "right", "a2": "right", "a3": "left"}
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 2, policy_mapping_fn=mapping.get)
    policies = {"left": random_policy(3), "right": random_policy(3)}
    params = {"left": zero_params(3), "right": zero_params(3)}
    conn = C.Connectors(obs=[C.NormalizeObservation()])
    with jr.EnvRunner(envs, policies, params, 9, 0, connectors=conn) as runner:
        traj = runner.sample()
        state = runner.get_connector_state()
    for pid in ("left", "right"):
        g = traj.groups[pid]
        assert_moments_match(state[pid].obs[0].shared.stats, g.obs[g.valid])


def test_connectors_argument_is_checked():
    def make(connectors: Any) -> jr.EnvRunner:
        envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 1)
        try:
            return jr.EnvRunner(envs, random_policy(3), zero_params(3), 4, 0, connectors=connectors)
        finally:
            envs.close()

    with pytest.raises(InvalidArgumentError, match=r"no policy ids \['nobody'\]"):
        make({"nobody": C.Connectors()})
    with pytest.raises(InvalidArgumentTypeError, match="Wrap a list"):
        make([C.NormalizeObservation()])
    with pytest.raises(InvalidArgumentTypeError, match=r"expected a jaxrunner\.connectors"):
        make({"policy_0": [C.FrameStack()]})
    envs = jr.make_multi_agent_vec(envs_mod.coming_and_going, 1)
    with (
        jr.EnvRunner(envs, random_policy(3), zero_params(3), 4, 0) as runner,
        pytest.raises(InvalidArgumentError, match="no connectors"),
    ):
        runner.get_connector_state()


def test_connectors_that_do_not_fit_a_group_name_its_policy_id():
    group = AgentGroup("p", ("a",), spaces.Discrete(4), spaces.Discrete(2))
    with pytest.raises(InvalidArgumentError, match="nothing to normalize") as info:
        per_policy_connectors(C.Connectors(obs=[C.NormalizeObservation()]), [group])
    assert "for policy 'p'" in "".join(info.value.__notes__)


def random_actions(n: int) -> jr.Policy:
    """Random actions of ``n``, whatever the observation (the same with and without
    connectors)."""

    def apply_fn(params, obs, carry, keys):
        return jax.vmap(lambda k: jax.random.randint(k, (), 0, n))(keys), {}, carry

    return jr.Policy(apply_fn)


@pytest.mark.parametrize("backend", ["sync", "process"])
@pytest.mark.parametrize("kind", envs_mod.HOST_KINDS)
def test_a_failed_sample_keeps_its_steps_with_the_connectors_extras(kind, backend):
    """What must hold: err.partial_trajectory is the first steps of the sample as a
    sample returns them, connectors' extras included (scaled_reward, policy_next_obs),
    equal to those of the run the fault did not break, on every kind and backend."""
    from jaxrunner.testing import FaultPlan, faulty_env_fns

    base = {"gymnasium": jr.testing.CountingEnv, "parallel": envs_mod.coming_and_going,
            "aec": envs_mod.relay}[kind]  # fmt: skip
    config = {"config": jr.ProcessConfig(num_workers=2)} if backend == "process" else {}

    def run(faults: Any) -> Any:
        envs = jr.make_vec(faulty_env_fns(base, 3, faults=faults), 3, backend, **config)
        conn = C.Connectors(obs=[C.NormalizeObservation()], reward=C.ScaleReward())
        with jr.EnvRunner(envs, random_actions(2), {}, 5, seed=0, connectors=conn) as runner:
            runner.sample()
            try:
                return jax.device_get(runner.sample()), None
            except jr.errors.EnvError as err:
                return None, err.partial_trajectory

    whole, _ = run(())
    _, partial = run({1: [FaultPlan(at=(8,))]})  # the second sample's 3rd step (or less)
    assert partial is not None and 0 < partial.num_steps < 5

    def parts(traj: Any) -> list[Any]:
        return [traj] if isinstance(traj, jr.Trajectory) else list(traj.groups.values())

    for got, want in zip(parts(partial), parts(whole.time_slice(0, partial.num_steps))):
        assert sorted(got.extras) == sorted(want.extras)
        assert {"scaled_reward", "policy_next_obs"} <= set(got.extras)
        jr.testing.assert_trees_equal(got.extras, want.extras, "extras")
        jr.testing.assert_trees_equal(got.reward, want.reward, "reward")
