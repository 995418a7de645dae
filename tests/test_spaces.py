"""jaxrunner._src.space_arrays: Box clipping (numpy and JAX alike) and the checks' one wording."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium import spaces

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
