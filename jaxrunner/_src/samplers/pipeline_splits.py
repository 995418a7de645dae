"""Pipelining splits: the parts of the envs the lockstep host loop steps in turn, so one
part's policy step computes while the others' envs step."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import numpy as np

from jaxrunner._src.backends.capabilities import Capabilities
from jaxrunner._src.core.agent_groups import AgentGroup
from jaxrunner._src.cpu_dispatch import inline_cpu_dispatch
from jaxrunner._src.samplers.batch_invariance import (
    CHUNK_FLOPS,
    compute_platform,
    default_chunk_rows,
    policy_flops_per_row,
)
from jaxrunner._src.samplers.sampler import SamplerSetup

PIPELINE_MIN_ENVS = 256
"""From this many envs up, two splits by default on a CPU host with asynchronous dispatch,
where a policy call can overlap the envs (docs/gpu.md)."""


class Stepped(Protocol):
    """What the splits are made for: a backend's width and what it declares."""

    num_envs: int
    capabilities: Capabilities


class GroupCost(NamedTuple):
    """What a policy group's calls cost a split: its rows per env (its agents), the
    runner's policy chunk for it and XLA's estimate of its work per row (None: unknown)."""

    rows_per_env: int
    chunk_rows: int
    flops_per_row: float | None


def group_cost(group: AgentGroup, setup: SamplerSetup, num_envs: int) -> GroupCost:
    """A group's policy chunk for its rows (``setup.chunk_rows``, else the default: the
    same in every host sampler, so their trajectories are the same bits) and XLA's
    estimate of its work per row, on the observations the policy sees."""
    pid, space = group.policy_id, group.observation_space
    connectors = setup.connectors.get(pid)
    if connectors is not None:
        space = connectors.observation_space(space)  # what the policy sees
    flops = policy_flops_per_row(setup.policies[pid], setup.params[pid], space)
    chunk = setup.chunk_rows
    if chunk is None:
        chunk = default_chunk_rows(num_envs * group.num_agents, flops)
    return GroupCost(group.num_agents, chunk, flops)


def default_num_splits(envs: Stepped, costs: Sequence[GroupCost] = ()) -> int:
    """The backend's own split where it declares one; else one on an accelerator (one
    split beat two in every row measured on an H200, sync and process, 8 to 256 envs:
    benchmarks/results/splits_*_gpu.json). On a CPU host: the backend's declared number,
    else one where calls block, else 2 from :data:`PIPELINE_MIN_ENVS`; fewer where the
    splits' padding to whole policy chunks would cost the groups (``costs``) more than
    :data:`CHUNK_FLOPS` (an unknown cost counting as more): then only whole chunks (a
    NatureCNN's two splits of 4 envs computed 16 rows, 0.72x). A backend of whole blocks
    (EnvPool pools) takes one split of all where its blocks would pad so (two pools of 4
    Pong envs: 0.62x)."""
    num_envs, capabilities = envs.num_envs, envs.capabilities
    if capabilities.whole_batch:
        return 1
    bounds = capabilities.pipeline_bounds
    if bounds is not None:  # whole blocks (EnvPool pools): one split of all where they pad
        sizes = [hi - lo for lo, hi in itertools.pairwise(bounds)]
        padded = capabilities.whole_blocks and _padding_flops(sizes, costs) > CHUNK_FLOPS
        return 1 if padded else len(bounds) - 1
    if compute_platform() != "cpu":
        return 1
    if capabilities.pipeline_splits is not None:
        wanted = min(capabilities.pipeline_splits, num_envs)
    elif inline_cpu_dispatch():  # calls block
        wanted = 1
    else:
        wanted = 2 if num_envs >= PIPELINE_MIN_ENVS else 1
    if _padding_flops([num_envs // wanted] * wanted, costs, num_envs) > CHUNK_FLOPS:
        whole = min(num_envs * c.rows_per_env // c.chunk_rows for c in costs)
        return min(wanted, max(1, whole))
    return wanted


def _padding_flops(sizes: Sequence[int], costs: Sequence[GroupCost], num_envs: int = 0) -> float:
    """The groups' work on padding rows when splits of ``sizes`` envs each compute whole
    policy chunks, beyond ``num_envs`` envs' rows (default: their sum); an unknown cost
    counts as infinite."""
    total = 0.0
    for c in costs:
        rows = sum(-(-n * c.rows_per_env // c.chunk_rows) * c.chunk_rows for n in sizes)
        padding = rows - (num_envs or sum(sizes)) * c.rows_per_env
        if padding > 0:
            total += float("inf") if c.flops_per_row is None else padding * c.flops_per_row
    return total


def pipeline_splits(
    envs: Stepped, num_splits: int | None, costs: Sequence[GroupCost] = ()
) -> list[slice]:
    """``num_splits`` (None: :func:`default_num_splits`) contiguous parts of the envs,
    at the backend's ``capabilities.pipeline_bounds`` where it declares that many, else
    equal (a given ``num_splits`` is checked by the runner)."""
    num_envs = envs.num_envs
    if num_splits is None:
        num_splits = default_num_splits(envs, costs)
    bounds = envs.capabilities.pipeline_bounds  # the backend's own split, if it has one
    if bounds is None or len(bounds) != num_splits + 1 or bounds[-1] != num_envs:
        bounds = np.linspace(0, num_envs, num_splits + 1).round().astype(int).tolist()
    return [slice(lo, hi) for lo, hi in itertools.pairwise(bounds)]
