"""Gymnasium spaces as stacked numpy buffers: allocation, validated writes (a value unlike its
space raises :class:`~jaxrunner.errors.SpaceMismatchError`, never cast), splitting, clipping."""

from jaxrunner._src.space_arrays.actions import action_batch_check as action_batch_check
from jaxrunner._src.space_arrays.actions import bad_action_rows as bad_action_rows
from jaxrunner._src.space_arrays.actions import batch_passes as batch_passes
from jaxrunner._src.space_arrays.actions import check_action_batch as check_action_batch
from jaxrunner._src.space_arrays.actions import check_policy_actions as check_policy_actions
from jaxrunner._src.space_arrays.actions import idle_action_filler as idle_action_filler
from jaxrunner._src.space_arrays.actions import passing_batch_test as passing_batch_test
from jaxrunner._src.space_arrays.buffers import LEAF_TYPES as LEAF_TYPES
from jaxrunner._src.space_arrays.buffers import allocate as allocate
from jaxrunner._src.space_arrays.buffers import as_space_dtypes as as_space_dtypes
from jaxrunner._src.space_arrays.buffers import copy_into as copy_into
from jaxrunner._src.space_arrays.buffers import leaf_spaces as leaf_spaces
from jaxrunner._src.space_arrays.buffers import leaf_spec as leaf_spec
from jaxrunner._src.space_arrays.buffers import leaves as leaves
from jaxrunner._src.space_arrays.buffers import map_structure as map_structure
from jaxrunner._src.space_arrays.buffers import rows as rows
from jaxrunner._src.space_arrays.buffers import take as take
from jaxrunner._src.space_arrays.buffers import tree_map as tree_map
from jaxrunner._src.space_arrays.checks import NEVER_CAST as NEVER_CAST
from jaxrunner._src.space_arrays.checks import check_flag as check_flag
from jaxrunner._src.space_arrays.checks import check_info as check_info
from jaxrunner._src.space_arrays.checks import check_reward as check_reward
from jaxrunner._src.space_arrays.checks import check_supported as check_supported
from jaxrunner._src.space_arrays.checks import check_value as check_value
from jaxrunner._src.space_arrays.checks import mismatch as mismatch
from jaxrunner._src.space_arrays.checks import rows_in_space as rows_in_space
from jaxrunner._src.space_arrays.clip import clip_box_actions as clip_box_actions
from jaxrunner._src.space_arrays.clip import clip_box_actions_jax as clip_box_actions_jax
from jaxrunner._src.space_arrays.writers import make_action_splitter as make_action_splitter
from jaxrunner._src.space_arrays.writers import make_writer as make_writer
from jaxrunner._src.space_arrays.writers import passed_action_splitter as passed_action_splitter
