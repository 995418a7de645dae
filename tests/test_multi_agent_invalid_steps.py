"""Multi-agent sub-envs that fail or return what the single-agent backends refuse: the
failed slot holds zeros (as ``GroupTrajectory.valid`` says), and NaN observations,
missing rewards and agents that come back after their episode ended are invalid steps,
restarted under a ``restart_policy`` as single-agent ones are."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

pytest.importorskip("pettingzoo")

import jaxrunner as jr
from jaxrunner._src.backends.steps import FIELDS
from jaxrunner.errors import EnvError, InvalidStepError
from jaxrunner.testing import coming_and_going
from tests.multi_agent_envs import BadOutputs, UnlistedOutputs, tictactoe_with_infos
from tests.test_multi_agent import random_policy, zero_params
from tests.test_multi_agent_faults import (  # noqa: F401  (ray_for_the_ray_backend: a fixture)
    AT,
    BACKENDS,
    FAILING_ENV,
    NUM_ENVS,
    SEED,
    T,
    backends_and,
    faulty_fns,
    make_envs,
    ray_for_the_ray_backend,
    sample,
)


def assert_zero_where_invalid(traj) -> None:
    """Every field of every group is zero where ``valid`` is False, but ``agent_step`` at
    a failed env step: the length of the agent episode it cut (a first sample's)."""
    failed = np.zeros(traj.env_id.shape, bool) if traj.valid is None else ~traj.valid
    for pid, g in traj.groups.items():
        invalid = ~np.asarray(g.valid)
        fields = {
            "obs": g.obs,
            "action": g.action,
            "extras": g.extras,
            "next_obs": g.next_obs,
            "reward": g.reward,
            "terminated": g.terminated,
            "truncated": g.truncated,
        }
        for name, tree in fields.items():
            for leaf in jax.tree.leaves(tree):
                got = np.asarray(leaf)[invalid]
                assert not got.any(), f"{pid}.{name}: non-zero where valid is False: {got}"
        length = np.zeros(g.valid.shape[1:], np.int64)
        for t in range(len(g.valid)):
            cut = np.broadcast_to(failed[t][:, None], length.shape)
            want = np.where(cut, length, 0)
            np.testing.assert_array_equal(g.agent_step[t][invalid[t]], want[invalid[t]])
            ended = g.valid[t] & (g.terminated[t] | g.truncated[t])
            length = np.where(ended | cut, 0, length + g.valid[t])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_slot_holds_zeros_for_every_agent(backend):
    traj, _, restarts = sample(faulty_fns("raise"), backend, restart=True)
    (g,) = traj.groups.values()
    assert restarts == 1
    assert not g.valid[AT - 1, FAILING_ENV].any()
    assert_zero_where_invalid(traj)


@pytest.fixture(scope="module")
def failed_steps():
    """Each (backend, fault kind)'s step ``AT`` (copies), stepped by hand, made once."""
    steps = {}

    def step(backend, kind):
        if (backend, kind) not in steps:
            timeout = None if kind == "raise" else 60.0  # a death: two envs per worker
            with make_envs(backend, faulty_fns(kind), True, step_timeout_s=timeout) as envs:
                out = envs.reset_batch(list(range(NUM_ENVS)))
                for _ in range(AT):
                    out = envs.step_batch([np.zeros(out.groups["policy_0"].acting.shape, int)])
                (g,) = out.groups.values()
                arrays = {name: getattr(g, name) for name in FIELDS} | out._asdict()
                del arrays["groups"], arrays["infos"], arrays["errors"], arrays["env_ids"]
                steps[backend, kind] = jax.tree.map(np.array, arrays)
        return steps[backend, kind]

    return step


@pytest.mark.parametrize(
    ("backend", "kind"), [("process", "raise"), ("ray", "raise"), ("ray", "kill")]
)
def test_a_failed_slot_reads_the_same_in_the_step_on_every_backend(backend, kind, failed_steps):
    # A sub-env that raises (env 1 fails) as on the sync backend; one that kills its
    # worker or actor (envs 0 and 1 fail) as on the process backend: every field equal,
    # the failed rows' outcomes zero, their acting agents the new sub-envs'.
    out = failed_steps(backend, kind)
    ref = failed_steps("sync" if kind == "raise" else "process", kind)
    failed = [FAILING_ENV] if kind == "raise" else [0, 1]
    np.testing.assert_array_equal(np.flatnonzero(out["failed"]), failed)
    jr.testing.assert_trees_equal(out, ref, "step")
    for name in ("completed", "reward", "terminated", "truncated", "next_obs", "env_reward"):
        assert not out[name][failed].any(), name
    assert out["acting"][failed].any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_slot_of_a_bad_observation_holds_zeros(backend):
    # The agent's observation is written before the bad one comes: nothing of it stays.
    traj, _, restarts = sample(faulty_fns("bad_obs", agent="a1"), backend, restart=True)
    assert restarts == 1
    assert_zero_where_invalid(traj)


def test_a_failed_turn_based_slot_holds_zeros_and_no_infos():
    # tictactoe: move AT returns player_1's observation without its "observation" key;
    # the infos recorded (the moves so far) are zero there too.
    fns = faulty_fns("obs_missing_key", base=tictactoe_with_infos, agent="player_1")
    envs = make_envs("sync", fns, restart=True)
    policy, params = random_policy(9, masked=True), zero_params(9)
    with jr.EnvRunner(envs, policy, params, 12, seed=5, info_keys="all") as runner:
        traj = runner.sample()
    (g,) = traj.groups.values()
    assert not traj.valid[AT - 1, FAILING_ENV] and g.valid[AT - 2, FAILING_ENV].any()
    assert g.extras["infos_present"]["moves"].any()
    assert_zero_where_invalid(traj)


def test_the_check_sees_the_fields_of_valid_slots():
    # The clean run's slots that a fault invalidates do hold data: the check can fail.
    traj = sample([coming_and_going] * NUM_ENVS)[0]
    (g,) = traj.groups.values()
    assert g.valid[AT - 1, FAILING_ENV].any()
    assert np.asarray(g.obs)[AT - 1, FAILING_ENV][g.valid[AT - 1, FAILING_ENV]].any()


# -- outputs the single-agent backends refuse too ----------------------------------------------

STEP_KINDS = list(BadOutputs.STEP)
RESET_KINDS = ["nan_first_obs", "nan_reset_obs"]
AGENT_OF = {
    "nan_obs": "a1",
    "nan_newcomer_obs": "a2",
    "missing_reward": "a1",
    "comeback": "a0",
    "missing_flags": "a1",
    "nan_first_obs": "a0",
    "nan_reset_obs": "a0",
}
# Ray actors step with the sync backend's own loop (AgentBlock), and each Ray test
# starts actors (seconds each): one kind per check (the block's NaN check after a step
# and after a reset, a driver's check).
ON_RAY = ("nan_obs", "nan_reset_obs", "missing_reward")


@pytest.fixture(scope="module")
def clean():
    """The fault-free run (same runner, plain sub-envs)."""
    return sample([coming_and_going] * NUM_ENVS)


def bad_fns(kind):
    fns = [coming_and_going] * NUM_ENVS
    arm_seed = jr.env_seeds(SEED, NUM_ENVS)[FAILING_ENV]  # a restart's seed is another
    fns[FAILING_ENV] = functools.partial(BadOutputs, kind, arm_seed)
    return fns


def assert_finite(traj) -> None:
    for pid, g in traj.groups.items():
        for leaf in jax.tree.leaves((g.obs, g.next_obs, g.reward)):
            assert np.isfinite(np.asarray(leaf)).all(), f"{pid}: a NaN or inf in the trajectory"


@pytest.mark.parametrize(("backend", "kind"), backends_and(STEP_KINDS + RESET_KINDS, on_ray=ON_RAY))
def test_without_a_restart_policy_a_bad_output_is_an_invalid_step_naming_sub_env_and_agent(
    backend, kind
):
    call = "reset" if kind in RESET_KINDS else "step"
    match = rf"sub-env {FAILING_ENV}, agent '{AGENT_OF[kind]}'"
    with pytest.raises(InvalidStepError, match=match) as info:
        sample(bad_fns(kind), backend)
    assert info.value.env_index == FAILING_ENV
    if kind.startswith("nan"):
        assert f"non-finite observation from {call}()" in str(info.value)


@pytest.mark.parametrize(("backend", "kind"), backends_and(STEP_KINDS, on_ray=ON_RAY))
def test_with_a_restart_policy_a_bad_step_is_dropped_as_a_fault(backend, kind, clean):
    traj, metrics, restarts = sample(bad_fns(kind), backend, restart=True)
    (pid,) = traj.groups
    g, ref = traj.groups[pid], clean[0].groups[pid]
    t = BadOutputs.STEP[kind] - 1
    assert restarts == 1
    assert not g.valid[t, FAILING_ENV].any()
    others = [b for b in range(NUM_ENVS) if b != FAILING_ENV]
    for field in ("valid", "reward", "terminated", "truncated", "obs", "action", "next_obs"):
        a, b = getattr(g, field), getattr(ref, field)
        np.testing.assert_array_equal(a[:t], b[:t], err_msg=field)
        np.testing.assert_array_equal(a[:, others], b[:, others], err_msg=field)
    assert_finite(traj)
    assert_zero_where_invalid(traj)
    assert metrics["num_dropped_steps"] == metrics["num_faulty_episodes"] == 1
    assert metrics["num_dropped_agent_steps"] == int(ref.valid[t, FAILING_ENV].sum()) > 0
    assert metrics["num_env_steps"] == NUM_ENVS * T - 1
    assert metrics["num_agent_steps"] == int(g.valid.sum())


@pytest.mark.parametrize(("backend", "kind"), backends_and(RESET_KINDS, on_ray=ON_RAY))
def test_with_a_restart_policy_a_bad_reset_restarts_the_sub_env_and_drops_nothing(
    backend, kind, clean
):
    traj, metrics, restarts = sample(bad_fns(kind), backend, restart=True)
    (pid,) = traj.groups
    g, ref = traj.groups[pid], clean[0].groups[pid]
    assert restarts == 1
    assert_finite(traj)
    assert metrics["num_dropped_steps"] == metrics["num_faulty_episodes"] == 0
    assert metrics["num_env_steps"] == NUM_ENVS * T
    if kind == "nan_reset_obs":  # the autoreset after the last slot's good step failed
        assert clean[0].env_done[T - 1, FAILING_ENV]
        for field in ("valid", "reward", "terminated", "truncated", "obs", "next_obs"):
            a, b = getattr(g, field), getattr(ref, field)
            np.testing.assert_array_equal(a, b, err_msg=field)


@pytest.mark.parametrize(
    ("kind", "match"),
    [
        ("selection", r"sub-env 0: agent 'zz' is not among possible_agents"),
        ("reward", r"sub-env 0: agent 'zz' is not among possible_agents"),
        ("rewards", r"sub-env 0: step\(\) returned rewards of type NoneType"),
        ("infos", r"sub-env 0: step\(\) returned infos of type NoneType"),
        ("flags", r"sub-env 0, agent 'r\d': step\(\) left no termination or truncation flag"),
    ],
)
def test_a_turn_based_sub_envs_malformed_outputs_are_named_not_raised_from_its_code(kind, match):
    """These failed in jaxrunner's own look-ups (a KeyError, an AttributeError), which the
    error then put on the env's code."""
    with pytest.raises((EnvError, InvalidStepError), match=match) as info:
        sample([functools.partial(UnlistedOutputs, kind)] * 2, num_actions=4)
    assert info.value.__cause__ is None and info.value.partial_trajectory is not None


def test_a_reward_for_an_undeclared_agent_is_refused_not_counted_unassigned():
    class Unlisted(BadOutputs):
        def step(self, actions):
            obs, rewards, terms, truncs, infos = super().step(actions)
            return obs, {**rewards, "zz": 5.0}, terms, truncs, infos

    fns = [functools.partial(Unlisted, "nan_obs", -1)] * 2  # (never armed)
    with pytest.raises(EnvError, match="agent 'zz' is not among possible_agents"):
        sample(fns, "sync")
