"""Multi-agent sub-envs that fail or return what the single-agent backends refuse: the
failed slot holds zeros (as ``GroupTrajectory.valid`` says), and NaN observations,
missing rewards and agents that come back after their episode ended are invalid steps,
restarted under a ``restart_policy`` as single-agent ones are."""

from __future__ import annotations

import jax
import numpy as np
import pytest

pytest.importorskip("pettingzoo")

from jaxrunner.testing import coming_and_going
from tests.test_multi_agent_faults import (  # noqa: F401  (ray_for_the_ray_backend: a fixture)
    AT,
    BACKENDS,
    FAILING_ENV,
    NUM_ENVS,
    faulty_fns,
    ray_for_the_ray_backend,
    sample,
)


def assert_zero_where_invalid(traj) -> None:
    """Every field of every group is zero where ``valid`` is False."""
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
            "agent_step": g.agent_step,
        }
        for name, tree in fields.items():
            for leaf in jax.tree.leaves(tree):
                got = np.asarray(leaf)[invalid]
                assert not got.any(), f"{pid}.{name}: non-zero where valid is False: {got}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_slot_holds_zeros_for_every_agent(backend):
    traj, _, restarts = sample(faulty_fns("raise"), backend, restart=True)
    (g,) = traj.groups.values()
    assert restarts == 1
    assert not g.valid[AT - 1, FAILING_ENV].any()
    assert_zero_where_invalid(traj)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_slot_of_a_bad_observation_holds_zeros(backend):
    # The agent's observation is written before the bad one comes: nothing of it stays.
    traj, _, restarts = sample(faulty_fns("bad_obs", agent="a1"), backend, restart=True)
    assert restarts == 1
    assert_zero_where_invalid(traj)


def test_the_check_sees_the_fields_of_valid_slots():
    # The clean run's slots that a fault invalidates do hold data: the check can fail.
    traj = sample([coming_and_going] * NUM_ENVS)[0]
    (g,) = traj.groups.values()
    assert g.valid[AT - 1, FAILING_ENV].any()
    assert np.asarray(g.obs)[AT - 1, FAILING_ENV][g.valid[AT - 1, FAILING_ENV]].any()
