"""What every sampler is built from (a backend besides), and how it reports progress and
the steps collected before an error."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from jaxrunner._src.connectors.pipeline import Connectors
from jaxrunner._src.core.metrics import RunnerMetrics
from jaxrunner._src.core.multi_agent_trajectory import MultiAgentTrajectory
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.samplers.info_arrays import InfoKeys

StepProgress = Callable[[int], None]
"""What a sampler reports a sample's progress to: called with the env steps it has
recorded so far (``Progress.update`` of the runner's bar)."""


@dataclasses.dataclass(frozen=True)
class SamplerSetup:
    """What every sampler is built from, besides its envs."""

    policies: dict[str, Policy]
    """Policy id -> Policy (a single-agent env's one policy under its default id)."""
    params: dict[str, Params]
    """Policy id -> device params: their shapes and dtypes fix the compile."""
    rollout_length: int
    """T, the steps per env of each ``sample()``."""
    seed: int
    """The runner's seed: each env's action key derives from it, the env's id and its
    step count."""
    metrics: RunnerMetrics
    """The runner's metrics, which every sample adds to."""
    connectors: Mapping[str, Connectors] = dataclasses.field(default_factory=dict)
    """Policy id -> the transforms between the envs and its policy
    (:mod:`jaxrunner.connectors`; policies without connectors absent)."""
    info_keys: InfoKeys = ()
    """Info entries recorded as arrays (``[T, B]``, or ``[T, B, A_g]`` per group), or
    ``"all"`` (:mod:`.info_arrays`; host samplers)."""
    compact_next_obs: bool = False
    """Store ``next_obs`` only where it is not the obs its slot acts on next (host
    samplers; :mod:`jaxrunner._src.core.next_obs_store`)."""
    by_group: bool = False
    """Sample into a ``MultiAgentTrajectory`` of agent groups (else a ``[T, B]``
    :class:`Trajectory` of the one policy's env)."""
    chunk_rows: int | None = None
    """Rows per policy chunk (None: :func:`.group_cost`'s default; host samplers)."""


def attach_episodes(err: BaseException, episodes: list) -> None:
    """Puts the complete episodes sampled before ``err`` (if any) in
    ``err.partial_episodes``, with a note saying so."""
    if episodes:
        held = f"the {len(episodes)} complete episodes sampled before this error are in"
        _attach(err, "partial_episodes", episodes, f"{held} err.partial_episodes")


def attach_partial(err: BaseException, partial: MultiAgentTrajectory | None) -> None:
    """Puts the steps collected before ``err`` in ``err.partial_trajectory``, with a
    note saying so (exceptions that refuse new attributes are left as they are)."""
    if partial is None:
        note = "no step had completed before this error: err.partial_trajectory is None"
    else:
        held = f"the {partial.num_steps} steps completed before this error are in"
        note = f"{held} err.partial_trajectory"
    _attach(err, "partial_trajectory", partial, note)


def _attach(err: BaseException, name: str, value: Any, note: str) -> None:
    with contextlib.suppress(AttributeError):
        setattr(err, name, value)
        err.add_note(f"jaxrunner: {note}.")
