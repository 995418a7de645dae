"""Gymnasium spaces as stacked numpy buffers: allocation, validated writes, splitting.

* :mod:`~jaxrunner._src.space_arrays.buffers`: allocate, copy, map, row views and copies;
* :mod:`~jaxrunner._src.space_arrays.checks`: every validation, in one wording;
* :mod:`~jaxrunner._src.space_arrays.writers`: validated writes and action splits (the step loops);
* :mod:`~jaxrunner._src.space_arrays.clip`: Box action clipping (numpy and JAX).

Writes are validated (never cast silently): a value whose shape or dtype differs from its
space raises :class:`~jaxrunner.errors.SpaceMismatchError`, it is never cast.
"""

from jaxrunner._src.space_arrays.buffers import (
    LEAF_TYPES,
    allocate,
    copy_into,
    leaf_spec,
    map_structure,
    rows,
    take,
)
from jaxrunner._src.space_arrays.checks import (
    NEVER_CAST,
    SUPPORTED_SPACES,
    check_action_batch,
    check_flag,
    check_info,
    check_policy_actions,
    check_reward,
    check_supported,
    check_value,
    mismatch,
    observation_mismatch,
)
from jaxrunner._src.space_arrays.clip import clip_box_actions, clip_box_actions_jax
from jaxrunner._src.space_arrays.writers import Writer, make_action_splitter, make_writer

__all__ = [
    "LEAF_TYPES",
    "NEVER_CAST",
    "SUPPORTED_SPACES",
    "Writer",
    "allocate",
    "check_action_batch",
    "check_flag",
    "check_info",
    "check_policy_actions",
    "check_reward",
    "check_supported",
    "check_value",
    "clip_box_actions",
    "clip_box_actions_jax",
    "copy_into",
    "leaf_spec",
    "make_action_splitter",
    "make_writer",
    "map_structure",
    "mismatch",
    "observation_mismatch",
    "rows",
    "take",
]
