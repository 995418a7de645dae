"""jaxrunner._src.space_arrays: Box clipping (numpy and JAX alike) and the checks' one wording."""

from __future__ import annotations

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium import spaces

import jaxrunner as jr
from jaxrunner._src import space_arrays
from jaxrunner.errors import InvalidActionError, InvalidStepError, SpaceMismatchError
from jaxrunner.testing import assert_trees_equal

NESTED = spaces.Dict(
    {
        "move": spaces.Box(-1.0, 2.0, (2,), np.float32),
        "free": spaces.Box(-np.inf, np.inf, (1,), np.float32),
        "pick": spaces.Tuple((spaces.Discrete(3), spaces.Box(0.0, 1.0, (), np.float32))),
    }
)


def test_numpy_and_jax_clips_agree_and_touch_only_bounded_boxes() -> None:
    actions = {
        "move": np.array([[-3.0, 0.5], [5.0, 1.5]], np.float32),
        "free": np.array([[-9.0], [9.0]], np.float32),
        "pick": (np.array([0, 2], np.int32), np.array([-0.5, 0.25], np.float32)),
    }
    expected = {
        "move": np.array([[-1.0, 0.5], [2.0, 1.5]], np.float32),
        "free": actions["free"],
        "pick": (actions["pick"][0], np.array([0.0, 0.25], np.float32)),
    }
    assert_trees_equal(space_arrays.clip_box_actions(NESTED)(actions), expected, "numpy")
    clipped = jax.jit(space_arrays.clip_box_actions_jax(NESTED))(jax.tree.map(jnp.asarray, actions))
    assert_trees_equal(jax.tree.map(np.asarray, clipped), expected, "jax")


def test_nothing_to_clip() -> None:
    free = spaces.Tuple((spaces.Discrete(2), spaces.Box(-np.inf, np.inf, (2,))))
    assert space_arrays.clip_box_actions(free) is None
    actions = (jnp.array([1]), jnp.array([[7.0, -7.0]]))
    assert space_arrays.clip_box_actions_jax(free)(actions) is actions


def test_the_jax_test_of_action_values_refuses_the_rows_the_host_check_refuses() -> None:
    """``bad_action_rows`` (the pure-JAX scan's) against ``check_action_batch`` (the host
    backends'), row by row, on a nested space and on MultiDiscrete."""
    cases = [
        (
            NESTED,
            {
                "move": np.array([[0.0, 1.0], [0.0, 9.0], [0.0, np.nan], [0.0, 0.0]], np.float32),
                "free": np.array([[1e30], [-5.0], [0.0], [np.inf]], np.float32),
                "pick": (np.array([0, 2, 1, 3]), np.array([0.5, 0.5, 0.5, 0.5], np.float32)),
            },
        ),
        (spaces.MultiDiscrete([2, 3], start=[-1, 0]), np.array([[-1, 2], [1, 0], [0, 3], [0, 0]])),
    ]
    for (space, batch), expected in zip(cases, ([0, 0, 1, 1], [0, 1, 1, 0])):
        bad = np.asarray(jax.jit(lambda a, s=space: space_arrays.bad_action_rows(s, a, 4))(batch))
        assert bad.tolist() == [bool(e) for e in expected]
        for row in range(4):
            one = jax.tree.map(lambda x, r=row: x[r : r + 1], batch)
            try:
                space_arrays.check_action_batch(space, one, 1)
                refused = False
            except InvalidActionError:
                refused = True
            assert bad[row] == refused, (space, row)
    assert space_arrays.bad_action_rows(spaces.MultiBinary(2), jnp.zeros((2, 2)), 2) is None


@pytest.mark.parametrize(
    "check, error, match",
    [
        (
            lambda: space_arrays.check_reward([1.0, 1.0], 2),
            InvalidStepError,
            r"got a list of 2 items",
        ),
        (lambda: space_arrays.check_flag(np.int64(0), 1, "truncated"), InvalidStepError, "numpy"),
        (lambda: space_arrays.check_info((), 0, "reset"), InvalidStepError, r"got a tuple of 0"),
        (
            lambda: space_arrays.check_value(NESTED, {"move": 1}, "obs"),
            SpaceMismatchError,
            r"obs: expected a dict with keys \['free', 'move', 'pick'\], got a dict with keys",
        ),
        (
            lambda: space_arrays.check_action_batch(NESTED["move"], np.zeros((3, 2), int), 3),
            InvalidActionError,
            r"actions: expected .* got an ndarray of dtype int64 and shape \(3, 2\)",
        ),
    ],
)
def test_errors_say_expected_and_got(check, error, match) -> None:
    with pytest.raises(error, match=match) as info:
        check()
    assert ": expected " in str(info.value) and ", got " in str(info.value)


RANGED = [
    (spaces.Discrete(3), np.array([0, 2, 1])),
    (spaces.Discrete(4, start=-2), np.array([-2, 1, 0])),
    (spaces.MultiDiscrete([2, 5]), np.array([[1, 4], [0, 0], [1, 3]])),
]


@pytest.mark.parametrize("space, good", RANGED, ids=["discrete", "discrete_start", "multi"])
def test_out_of_range_actions_are_refused_naming_sub_env_row_and_value(space, good) -> None:
    """Every value just outside the range, at either end, and int32's extremes, in any row;
    the sub-env is the row's own (or as ``row_name`` names it); in-range batches pass as
    they are."""
    assert space_arrays.check_action_batch(space, good, 3) is not None
    low = np.asarray(space.start)
    high = low + (space.n if isinstance(space, spaces.Discrete) else space.nvec)
    for value in (high, low - 1, np.full_like(low, 2**31 - 1), np.full_like(low, -(2**31))):
        for row in range(3):
            bad = good.copy()
            bad[row] = value
            for row_name, env in ((None, row), (lambda i: f"sub-env {7 + i}", 7 + row)):
                with pytest.raises(InvalidActionError) as caught:
                    space_arrays.check_action_batch(space, bad, 3, row_name=row_name)
                message = str(caught.value)
                assert f"sub-env {env}'s action {bad[row].tolist()!r} (row {row}" in message
                assert str(space) in message


LEAVES = [
    *(space for space, _ in RANGED),
    spaces.Box(-1.0, 1.0, (2,), np.float32),
    spaces.MultiBinary(3),
]


@pytest.mark.parametrize("space", LEAVES, ids=lambda space: type(space).__name__)
@pytest.mark.parametrize("lead", [(3,), (2, 3), (40,)], ids=str)
def test_the_inline_batch_test_passes_only_what_the_checks_accept(space, lead) -> None:
    """passing_batch_test (the per-step path of the sync step loop and the multi-agent
    check) says True only where check_action_batch accepts the batch, and True for
    the common good batch; wrong shapes, dtype kinds, types and ranges go to the checks."""
    passes = space_arrays.passing_batch_test(space, lead)
    rng = np.random.default_rng(0)
    space.seed(0)  # the good batch's samples: the same every run
    shape, dtype = space_arrays.leaf_spec(space)
    good = np.stack([space.sample() for _ in range(int(np.prod(lead)))]).astype(dtype)
    good = good.reshape(*lead, *shape)
    candidates = [good, good.astype(np.int32), good.astype(np.float64), good.tolist()]
    candidates += [good[:1], good.reshape(-1), good + 100, good - 100, good * -1]
    candidates += [rng.integers(-3, 6, good.shape), rng.normal(size=good.shape)]
    for value in (np.nan, np.inf, 3e38):  # 3e38: finite, its float32 sum is not
        candidates.append(good.astype(np.float32))
        candidates[-1].flat[-1] = value
    rows = int(np.prod(lead))
    for batch in candidates:
        try:
            flat = np.reshape(batch, (rows, *shape))
            space_arrays.check_action_batch(space, flat, rows)
            accepted = np.shape(batch) == good.shape
        except (InvalidActionError, ValueError):
            accepted = False
        if passes(batch):
            assert accepted, (space, batch)
    assert passes(good)


@pytest.mark.parametrize("space", LEAVES, ids=lambda space: type(space).__name__)
def test_the_policy_steps_check_says_what_the_inline_test_says(space) -> None:
    """batch_passes (traced in the policy step, so the backends skip their check) agrees
    with passing_batch_test on the host copy, row by row out of range or not finite, in
    every dtype a policy's output may have; None where the inline test would not cover
    the dtype (the host checks those)."""
    passes = space_arrays.passing_batch_test(space, (5,))
    flag = jax.jit(lambda batch: space_arrays.batch_passes(space, batch))
    shape, dtype = space_arrays.leaf_spec(space)
    space.seed(0)
    good = np.stack([space.sample() for _ in range(5)]).astype(dtype)
    if dtype.kind == "f":
        values, dtypes = (np.nan, np.inf, -np.inf, 3e38, 9.0), (np.float32, np.float16)
    else:
        low = int(np.min(getattr(space, "start", 0)))
        values = (low - 1, low + 99, 2**31 - 1, -(2**31), 255)
        dtypes = (np.int32, np.uint8, np.uint32, np.int8)
    checked = 0
    for out_dtype in dtypes:
        for row in range(5):
            for value in (None, *values):
                batch = good.astype(out_dtype)
                if value is not None:
                    with np.errstate(over="ignore", invalid="ignore"):
                        batch.reshape(5, -1)[row, -1] = np.array(value).astype(out_dtype)
                traced = flag(jnp.asarray(batch))
                assert traced is not None and traced.dtype == np.bool_, (space, out_dtype)
                assert bool(traced) == passes(batch), (space, batch)
                checked += 1
    assert checked == len(dtypes) * 5 * (len(values) + 1)
    if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)):  # bool: a safe cast too
        ones = np.ones((5, *shape), np.bool_)
        np.testing.assert_array_equal(
            space_arrays.bad_action_rows(space, jnp.asarray(ones), 5),
            space_arrays.bad_action_rows(space, jnp.asarray(ones.astype(np.int32)), 5),
        )
    # What check_policy_actions refuses after the step is traced, and composites: None.
    for other in (jnp.zeros((5, *shape), jnp.bool_), jnp.zeros((5, 7)), jnp.int32(1)):
        assert space_arrays.batch_passes(space, other) is None
    assert space_arrays.batch_passes(space, {"a": jnp.asarray(good)}) is None
    assert space_arrays.batch_passes(spaces.Tuple([space]), (jnp.asarray(good),)) is None


@pytest.mark.filterwarnings("error:overflow:RuntimeWarning")  # huge finite rows: no warning
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_box_actions_are_refused_before_the_env_steps(value) -> None:
    space = spaces.Box(-2.0, 2.0, (1,), np.float32)
    batch = np.full((3, 1), 9.0, np.float32)  # outside the bounds: the env's to clip
    assert space_arrays.passing_batch_test(space, (3,))(batch)
    batch[1] = value
    assert not space_arrays.passing_batch_test(space, (3,))(batch)
    with pytest.raises(
        InvalidActionError, match=r"sub-env 1's action \[.*\] \(row 1 of the batch\) is not finite"
    ):
        space_arrays.check_action_batch(space, batch, 3)
    huge = np.full((3, 1), 3e38, np.float32)  # finite rows whose sum overflows: accepted
    assert space_arrays.passing_batch_test(space, (3,))(huge)
    with jr.make_vec("Pendulum-v1", 3) as envs:  # refused before any sub-env steps
        envs.reset(seed=0)
        with pytest.raises(InvalidActionError, match="not finite"):
            envs.step(batch)
        _, reward, *_ = envs.step(np.zeros((3, 1), np.float32))
        assert np.isfinite(reward).all()  # no sub-env went on in a NaN state
    # A runner clips for the env before the backend checks: an inf must not become a
    # bound there while the trajectory records inf.
    policy = jr.Policy(apply_fn=lambda p, o, c, k: (jnp.full((len(k), 1), value), {}, None))
    with jr.make_vec("Pendulum-v1", 2) as envs:
        runner = jr.EnvRunner(envs, policy, {}, rollout_length=2, seed=0)
        with runner, pytest.raises(InvalidActionError, match="is not finite"):
            runner.sample()


def test_policy_action_spec_names_the_part_and_refuses_extra_keys() -> None:
    space = spaces.Dict({"b": spaces.Box(-1, 1, (2,)), "t": spaces.Tuple([spaces.Discrete(3)])})
    good = {"b": jax.ShapeDtypeStruct((4, 2), jnp.float32), "t": (np.zeros(4, np.int32),)}
    space_arrays.check_policy_actions(space, good, 4)
    with pytest.raises(
        SpaceMismatchError, match=r"^policy actions: expected a dict with keys \['b', 't'\]"
    ):
        space_arrays.check_policy_actions(space, {**good, "zz": np.zeros(4)}, 4)  # not dropped
    wrong = {**good, "b": np.zeros((4, 5), np.float32)}
    with pytest.raises(
        SpaceMismatchError, match=r"^policy actions\['b'\]: expected shape \(4, 2\)"
    ):
        space_arrays.check_policy_actions(space, wrong, 4)
    with pytest.raises(
        SpaceMismatchError, match=r"^policy actions\['t'\]\[0\]: expected shape \(4,\)"
    ):
        space_arrays.check_policy_actions(space, {**good, "t": (np.zeros(3, np.int32),)}, 4)
    with pytest.raises(SpaceMismatchError, match=r"^policy actions\['t'\]: expected a tuple of 1"):
        space_arrays.check_policy_actions(space, {**good, "t": (np.zeros(4),) * 2}, 4)


def test_out_of_range_checks_reach_inside_dicts_and_large_batches() -> None:
    space = spaces.Dict({"move": spaces.Discrete(2), "aim": spaces.Box(-1, 1, (2,))})
    batch = {"move": np.zeros(100, np.int64), "aim": np.full((100, 2), 5.0, np.float32)}
    space_arrays.check_action_batch(space, batch, 100)  # Box bounds: the env's to clip
    batch["move"][63] = 2
    with pytest.raises(InvalidActionError, match=r"actions\['move'\]: sub-env 63's action 2"):
        space_arrays.check_action_batch(space, batch, 100)


class ActionBits(gymnasium.Wrapper):
    """Its info reports the bits of the action's dtype it received."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return (
            obs,
            reward,
            terminated,
            truncated,
            dict(info, bits=np.asarray(action).dtype.itemsize * 8),
        )


def cartpole_with_action_bits() -> gymnasium.Env:
    return ActionBits(gymnasium.make("CartPole-v1"))


@pytest.mark.parametrize("kind", ["gymnasium", "pettingzoo"])
def test_every_backend_hands_the_env_actions_in_its_spaces_dtype(kind) -> None:
    """A policy's int32 actions reach a Discrete(n) env as int64 (the space's dtype) on
    the sync backend as on the process one."""
    import jaxrunner as jr

    if kind == "pettingzoo":
        pytest.importorskip("mpe2")
        from tests.multi_agent_envs import spread_with_action_bits as make
        from tests.test_multi_agent import random_policy, zero_params

        policy, params = random_policy(5), zero_params(5)
    else:
        make, policy = cartpole_with_action_bits, None
    for backend in ("sync", "process"):
        envs = jr.make_vec(
            make,
            2,
            backend,
            config=jr.ProcessConfig(num_workers=2) if backend == "process" else None,
        )
        if policy is None:
            policy = jr.models.mlp_policy(envs.single_action_space)
            params = policy.init(jax.random.key(0), envs.single_observation_space)
        with jr.EnvRunner(envs, policy, params, 3, seed=0, info_keys=["bits"]) as runner:
            traj = runner.sample()
        groups = [traj] if kind == "gymnasium" else list(traj.groups.values())
        for group in groups:
            bits = group.extras["infos"]["bits"][group.valid if kind == "pettingzoo" else ...]
            assert (bits == 64).all(), (backend, bits)


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_finite_batch_test_takes_huge_finite_values_without_a_warning(dtype) -> None:
    # A square that overflows is no reason to warn (or, where warnings are errors, to
    # raise); NaN and infinities of either sign read non-finite, in a leaf or a Dict.
    from jaxrunner._src.space_arrays.checks import finite_batch_test

    box = spaces.Box(-np.inf, np.inf, (3,), dtype)
    huge = np.finfo(dtype).max
    test = finite_batch_test(box)
    assert test is not None
    assert test(np.array([[huge, -huge, 1.0]] * 40, dtype))
    for bad in (np.nan, np.inf, -np.inf):
        batch = np.ones((40, 3), dtype)
        batch[17, 1] = bad
        assert not test(batch), bad
        with np.errstate(all="raise"):  # numpy raising, not warning: the same answers
            assert not test(batch), bad
            assert test(np.array([[huge, -huge, 1.0]] * 40, dtype))
    tree = spaces.Dict({"a": spaces.Discrete(3), "b": box})
    test = finite_batch_test(tree)
    assert test is not None
    assert test({"a": np.zeros(2, np.int64), "b": np.full((2, 3), huge, dtype)})
    assert not test({"a": np.zeros(2, np.int64), "b": np.full((2, 3), -np.inf, dtype)})


class _HugeObs(gymnasium.Env):
    """Finite observations whose squares overflow float32."""

    observation_space = spaces.Box(-np.inf, np.inf, (4,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.full(4, 3e37, np.float32), {}

    def step(self, action):
        return np.full(4, -3e37, np.float32), 0.0, False, False, {}


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_huge_finite_observations_are_sampled_without_a_warning() -> None:
    # The sync backend's finite test of a block (more than 16 values: a dot product)
    # overflowed on finite values: numpy's RuntimeWarning, here an error, failed the sample.
    from jaxrunner._src.space_arrays.checks import all_finite_test

    envs = jr.make_vec(_HugeObs, 8, "sync")
    policy = jr.models.mlp_policy(_HugeObs.action_space)
    params = policy.init(jax.random.key(0), _HugeObs.observation_space)
    with jr.EnvRunner(envs, policy, params, 4, seed=0) as runner:
        traj = runner.sample()
    assert (traj.next_obs == np.float32(-3e37)).all()
    buffer = np.full((8, 4), 3e37, np.float32)
    test = all_finite_test(_HugeObs.observation_space, buffer)
    assert test is not None and test(0, 8) and test(2, 3)
    buffer[5, 1] = -np.inf
    assert not test(0, 8) and test(0, 5) and not test(5, 6)
    with np.errstate(all="raise"):
        assert not test(0, 8) and test(0, 5)
