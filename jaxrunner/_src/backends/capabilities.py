"""What a backend can do, declared once as a typed value (:class:`Capabilities`), and the
kind of env it steps (:func:`is_multi_agent`): the samplers and runners read them and
never probe."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxrunner.errors import InvalidArgumentError


@dataclasses.dataclass(frozen=True, kw_only=True)
class Capabilities:
    """What a backend can do, declared once on its class (or, where a config picks it,
    on the instance). The samplers read these fields; nothing else is probed."""

    can_restart: bool = False
    """Failed sub-envs can be recreated (a ``restart_policy`` given at construction)."""
    steps_in_background: bool = False
    """``send`` returns while the sub-envs step (other processes or threads): the
    lockstep sampler sends a split's actions as soon as they are computed. Otherwise
    the backend steps at ``recv``, and the sampler sends a split's actions just before
    it receives that split, so the policy overlaps the other splits' envs either way."""
    answers_held: bool = False
    """With ``steps_in_background``: each ``recv`` answers in buffers nothing writes until
    the next ``recv`` of its envs (the backend's own copies, not ones its envs step
    into), so the lockstep sampler records a step after sending the next actions, while
    the envs step (EnvPool)."""
    ready_first: bool = False
    """``recv`` answers whichever sent envs are ready, not the sends in order: the
    runner samples with the ready-first sampler."""
    recv_batch_size: int | None = None
    """With ``ready_first``: ``recv`` waits until this many envs have answered (EnvPool's
    async ``batch_size``), so the sampler keeps at least this many in flight. ``None``:
    ``recv`` returns as soon as any env answers."""
    any_order: bool = False
    """With ``ready_first``: one ``recv`` may answer envs of several sends, in any order
    (``env_ids`` an int array), which the ready-first sampler gathers into its buckets."""
    batch_buckets: tuple[int, ...] | None = None
    """With ``ready_first``: the policy batch sizes the sampler compiles, the ready envs
    padded to the next one (None: powers of two, then all envs)."""
    pipeline_splits: int | None = None
    """Lockstep pipelining splits when the runner is given ``num_splits=None`` (None:
    the sampler's own rule)."""
    whole_batch: bool = False
    """Lockstep: every step steps all the sub-envs at once (a gymnasium vector env,
    EnvPool's sync mode), so the sampler runs one split and the runner refuses more."""
    pipeline_bounds: tuple[int, ...] | None = None
    """Lockstep: the split edges ``(0, ..., num_envs)`` the sampler pipelines (its
    default split count, and its splits whenever it runs that many), where the backend
    steps some envs differently from others (None: splits of equal size)."""
    whole_blocks: bool = False
    """Lockstep: each send steps whole blocks of ``pipeline_bounds`` (EnvPool pools), so
    the sampler runs one split or one per block, and the runner refuses other counts."""
    can_snapshot: bool = False
    """The sub-envs' state can be saved and restored (:meth:`VectorEnv.snapshot_sub_envs`),
    so a checkpointed runner resumes their episodes exactly."""
    reset_steps: bool = False
    """The env's own reset steps come back as rows (``BatchStep.reset_rows``), one call
    after each episode end, instead of being skipped: the sampler records them as
    ``valid=False`` slots that are no faults (EnvPool's ``keep_reset_steps=True``)."""

    def __post_init__(self) -> None:
        edges = self.pipeline_bounds
        if edges is not None and (
            len(edges) < 2 or edges[0] != 0 or list(edges) != sorted(set(edges))
        ):
            raise InvalidArgumentError(
                f"Capabilities(pipeline_bounds={edges!r}): expected increasing split edges "
                "from 0 to num_envs, e.g. (0, 4, 8)."
            )
        if self.recv_batch_size is not None and not self.ready_first:
            raise InvalidArgumentError(
                f"Capabilities(recv_batch_size={self.recv_batch_size}): only a ready_first "
                "backend answers in batches of its own size; set ready_first=True or leave "
                "recv_batch_size=None."
            )


def is_multi_agent(envs: Any) -> bool:
    """The kind ``envs`` declares (its ``multi_agent`` attribute): True for agents in
    policy groups (PettingZoo, JaxMARL); anything that declares nothing is single-agent."""
    return getattr(envs, "multi_agent", False) is True
