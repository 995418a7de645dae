"""The step model of every backend: what a step returns (:class:`BatchStep` for a
single-agent env, :class:`MultiAgentStep` for agents in policy groups), which envs a send
steps (:data:`EnvIds`), and the host buffers a block of sub-envs writes a step into."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import gymnasium
import numpy as np

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.allocators import Allocator, Zeros
from jaxrunner._src.core.agent_groups import AgentGroup
from jaxrunner.errors import InvalidArgumentError


class BatchStep(NamedTuple):
    """What one ``step_batch`` call returns. Arrays are views of the env's buffers:
    valid until its next call; copy what you keep."""

    obs: Any
    """[B, ...] observations to act on next (reset ones where an episode ended)."""
    next_obs: Any
    """[B, ...] true next observations (the final one where an episode ended)."""
    reward: np.ndarray
    """[B] float64."""
    terminated: np.ndarray
    """[B] bool."""
    truncated: np.ndarray
    """[B] bool."""
    infos: Sequence[dict[str, Any]]
    """Per-env step infos (the final info where an episode ended)."""
    reset_infos: Mapping[int, dict[str, Any]]
    """Infos of the resets done in this call, by env index."""
    failed: np.ndarray | None = None
    """[B] bool, or None when no sub-env failed: the sub-envs whose step failed and
    were restarted (only with a ``restart_policy``). Their slots hold no transition:
    reward 0, both flags False, and ``obs`` and ``next_obs`` the new sub-env's reset
    observation. Their step infos are ``{}``; ``errors`` holds what went wrong."""
    errors: dict[int, BaseException] | None = None
    """The failures of this call, by env index: step failures (``failed``) and
    reset failures after a good step (that transition stays valid). Each is the error
    raised without a restart policy: an :class:`~jaxrunner.errors.EnvError` naming the
    sub-env, with the env's own exception as its ``__cause__``, or the error of a check
    the env failed (``InvalidStepError``, ``WorkerError``, ...)."""
    env_ids: slice | np.ndarray | None = None
    """Which envs these rows are: a ``slice`` of env indices (a contiguous block) or
    an int array (any set, in row order). ``None`` means every env, in order."""
    reset_rows: np.ndarray | None = None
    """[B] bool, or None when there are none: rows that are the env's own reset step
    (EnvPool's NEXT_STEP autoreset, kept by ``make_vec(..., backend="envpool",
    keep_reset_steps=True)``), the call after an episode ended. The env ignored their
    action: no transition (reward 0, both flags False), ``next_obs`` and ``obs`` the new
    episode's first observation. Not a fault: the runner records them ``valid=False``
    with ``step`` -1 and counts them in no metric (see
    :class:`~jaxrunner._src.samplers.episode_ids.EpisodeBook`)."""


class MultiAgentStep(NamedTuple):
    """What one multi-agent vector step returns (views of the env's buffers: valid until
    its next call). Group dicts are keyed by policy id."""

    groups: dict[str, GroupBuffers]
    env_done: np.ndarray
    """[B] bool: the env's episode ended in this step and the env was reset."""
    env_reward: np.ndarray
    """[B] float64: every reward handed out in the step, summed over agents."""
    unassigned_reward: np.ndarray
    """[B] float64: rewards no transition can carry, counted where the env's episode
    ended (only then): those of agents that never acted in it, and those that reached
    an agent after its final transition. A reward before an agent's first action is
    not here: it is added to that agent's first transition (as RLlib does)."""
    infos: Sequence[dict[str, Any]]
    """Per-env infos of the step (the env's per-agent info dict; ``{}`` where it failed)."""
    failed: np.ndarray | None = None
    """[B] bool, or None when no sub-env failed: the sub-envs whose step failed and were
    recreated (only with a ``restart_policy``). Their rows hold no transition for any
    agent (``completed`` False); their episodes ended as faults, and ``acting``/``obs``
    are the new episode's."""
    errors: dict[int, BaseException] | None = None
    """The failures of this step by env index: failed steps (``failed``), and failed
    resets after a good step (whose transitions stay valid); each as
    ``BatchStep.errors`` holds it."""
    env_ids: slice | np.ndarray | None = None
    """Which envs these rows are: a contiguous block of env indices (a ``send`` of a
    slice, or a ready-first worker's envs), an index array (envs in any order: EnvPool's
    async ``recv``); None means every env, in order. Every array, ``infos`` and
    ``failed`` have these rows only."""
    reset_rows: np.ndarray | None = None
    """[B] bool, or None when there are none: a single-agent env's own reset steps
    (EnvPool's, kept by ``keep_reset_steps=True``): no transition, and no fault."""


EnvIds = slice | np.ndarray | None
"""The envs a :meth:`VectorEnv.send` steps: a slice, an int array, or None for all."""


def block_rows(env_ids: EnvIds, num_envs: int, where: str) -> tuple[int, int]:
    """The rows ``[lo, hi)`` of a lockstep send's ``env_ids``: None (every env) or a
    non-empty slice with step 1 (else an error naming the caller, ``where``)."""
    if env_ids is None:
        return 0, num_envs
    if isinstance(env_ids, slice):
        lo, hi, step = env_ids.indices(num_envs)
        if step == 1 and lo < hi:
            return lo, hi
    raise InvalidArgumentError(
        f"{where}.send(env_ids={env_ids!r}): expected None (every env) or a non-empty "
        f"slice of env indices with step 1 within [0, {num_envs}) (lockstep sends)."
    )


class StepBuffers:
    """The stacked buffers a step writes for ``num_envs`` sub-envs (all ``[num_envs, ...]``,
    by global index) from ``alloc`` (default: new zeroed ones), and their views per block
    of rows (made once: a consumer can tell a step of the same buffers by identity)."""

    __slots__ = ("_blocks", "next_obs", "obs", "reward", "terminated", "truncated")

    def __init__(
        self, obs_space: gymnasium.Space, num_envs: int, alloc: Allocator | None = None
    ) -> None:
        alloc = alloc or Zeros(num_envs)
        self.obs, self.next_obs = alloc.space(obs_space), alloc.space(obs_space)
        self.reward = alloc.take((num_envs,), np.float64)
        self.terminated = alloc.take((num_envs,), np.bool_)
        self.truncated = alloc.take((num_envs,), np.bool_)
        self._blocks: dict[tuple[int, int], tuple[Any, ...]] = {}

    def batch_step(
        self,
        obs_space: gymnasium.Space,
        rows: slice | None,
        infos: list[dict[str, Any]],
        reset_infos: dict[int, dict[str, Any]],
        failed: np.ndarray | None = None,
        errors: dict[int, BaseException] | None = None,
    ) -> BatchStep:
        """Rows ``rows``' results as a :class:`BatchStep` of views (``env_ids`` is
        ``rows``); None: the buffers themselves, every env."""
        if rows is None:  # the buffers themselves: the same arrays every step
            views: tuple[Any, ...] = (
                self.obs, self.next_obs, self.reward, self.terminated, self.truncated
            )  # fmt: skip
        else:
            views = self._blocks.get((rows.start, rows.stop))  # type: ignore[assignment]
            if views is None:
                views = self._blocks[rows.start, rows.stop] = (
                    space_arrays.rows(obs_space, self.obs, rows),
                    space_arrays.rows(obs_space, self.next_obs, rows),
                    self.reward[rows], self.terminated[rows], self.truncated[rows],
                )  # fmt: skip
        obs, next_obs, reward, terminated, truncated = views
        return BatchStep(
            obs, next_obs, reward, terminated, truncated, infos, reset_infos, failed, errors, rows
        )

    def merge(self, obs_space: gymnasium.Space, results: Sequence[BatchStep]) -> BatchStep:
        """Results of contiguous blocks (``env_ids`` slices, in order) as one BatchStep
        whose ``env_ids`` is an int array; its arrays are copies from these buffers."""
        ids = np.concatenate([np.arange(block.start, block.stop) for block in map(span, results)])
        failed = [
            np.zeros(len(r.reward), np.bool_) if r.failed is None else r.failed for r in results
        ]
        errors = {i: e for r in results for i, e in (r.errors or {}).items()}
        return BatchStep(
            space_arrays.take(obs_space, self.obs, ids),
            space_arrays.take(obs_space, self.next_obs, ids),
            self.reward[ids],
            self.terminated[ids],
            self.truncated[ids],
            [info for r in results for info in r.infos],
            {i: info for r in results for i, info in r.reset_infos.items()},
            np.concatenate(failed) if any(r.failed is not None for r in results) else None,
            errors or None,
            ids,
        )


def span(result: BatchStep) -> slice:
    """The contiguous envs of a block's result (blocks report theirs as a slice)."""
    if not isinstance(result.env_ids, slice):
        raise TypeError(
            f"expected a block's result, whose env_ids is a slice; got {result.env_ids!r}"
        )
    return result.env_ids


def fail_slot(buffers: StepBuffers, space: gymnasium.Space, index: int | slice) -> None:
    """Sub-envs ``index``' slots of the step under way hold no transition: reward 0,
    no flags, ``next_obs = obs`` (by then the reset observation of the new sub-env).
    The one failed-slot helper of every backend."""
    buffers.reward[index], buffers.terminated[index], buffers.truncated[index] = 0.0, False, False
    space_arrays.copy_into(
        space, buffers.next_obs, space_arrays.rows(space, buffers.obs, index), index
    )


@dataclasses.dataclass
class GroupBuffers:
    """One group's step buffers, ``[B, A_g, ...]``."""

    obs: Any
    """The observation each acting agent acts on next."""
    acting: np.ndarray
    """bool: the agent acts at the next step."""
    agent_start: np.ndarray
    """bool: the agent's next action is the first of its episode (its carry restarts)."""
    completed: np.ndarray
    """bool: a transition of the agent completed in the last step."""
    reward: np.ndarray
    """float64: the completed transition's reward."""
    terminated: np.ndarray
    truncated: np.ndarray
    next_obs: Any
    """The completed transition's next observation (the final one where it ended)."""
    obs_rows: Any = None
    """``obs`` viewed as ``[B * A_g, ...]`` (for the row writers)."""
    next_obs_rows: Any = None

    @classmethod
    def allocate(cls, group: AgentGroup, num_envs: int, alloc: Allocator) -> GroupBuffers:
        """Buffers for ``num_envs`` sub-envs from ``alloc``."""
        lead, shape = (group.num_agents,), (num_envs, group.num_agents)
        return cls.of(
            obs=alloc.space(group.observation_space, lead),
            acting=alloc.take(shape, np.bool_),
            agent_start=alloc.take(shape, np.bool_),
            completed=alloc.take(shape, np.bool_),
            reward=alloc.take(shape, np.float64),
            terminated=alloc.take(shape, np.bool_),
            truncated=alloc.take(shape, np.bool_),
            next_obs=alloc.space(group.observation_space, lead),
        )

    @classmethod
    def of(cls, **arrays: Any) -> GroupBuffers:
        """Buffers over the given ``[B, A_g, ...]`` arrays (owned or views of shared
        memory), with their flat row views."""
        shape = arrays["acting"].shape
        flat = shape[0] * shape[1]

        def rows(tree: Any) -> Any:
            return space_arrays.tree_map(lambda x: x.reshape(flat, *x.shape[2:]), tree)

        return cls(**arrays, obs_rows=rows(arrays["obs"]), next_obs_rows=rows(arrays["next_obs"]))

    def rows(self, part: slice) -> GroupBuffers:
        """Envs ``part``'s rows, as views."""
        views = {n: space_arrays.tree_map(lambda x: x[part], getattr(self, n)) for n in FIELDS}
        return GroupBuffers.of(**views)

    def clear_step(self, same_step: bool = False, rows: slice = slice(None)) -> None:
        """Clears the masks and completed transitions of envs ``rows`` before a step.
        ``same_step`` (parallel envs: every acting agent's transition completes in this
        step) sets ``completed`` to ``acting`` and keeps ``acting`` (the drivers clear
        the agents that stop acting)."""
        if same_step:
            self.completed[rows] = self.acting[rows]  # setitem: cheaper than copyto
        else:
            self.acting[rows] = False
            self.completed[rows] = False
        self.agent_start[rows] = False
        self.reward[rows] = 0.0
        self.terminated[rows] = False
        self.truncated[rows] = False


FIELDS = tuple(f.name for f in dataclasses.fields(GroupBuffers) if not f.name.endswith("_rows"))
"""The arrays of :class:`GroupBuffers` (its flat row views aside)."""


class AgentStepBuffers(NamedTuple):
    """Everything a block of ``n`` multi-agent sub-envs writes in a step, ``[n, ...]``:
    its own arrays (sync, Ray) or views of a process worker's rows of shared memory."""

    groups: list[GroupBuffers]
    """One per agent group, in group order."""
    env_done: np.ndarray
    env_reward: np.ndarray
    unassigned_reward: np.ndarray

    @classmethod
    def allocate(
        cls, groups: Any, num_envs: int, alloc: Allocator | None = None
    ) -> AgentStepBuffers:
        """Buffers for ``num_envs`` sub-envs from ``alloc`` (default: new zeroed ones)."""
        alloc = alloc or Zeros(num_envs)
        return cls(
            [GroupBuffers.allocate(group, num_envs, alloc) for group in groups],
            alloc.take((num_envs,), np.bool_),
            alloc.take((num_envs,), np.float64),
            alloc.take((num_envs,), np.float64),
        )

    def rows(self, part: slice) -> AgentStepBuffers:
        """Envs ``part``'s rows, as views."""
        return AgentStepBuffers(
            [g.rows(part) for g in self.groups],
            self.env_done[part],
            self.env_reward[part],
            self.unassigned_reward[part],
        )

    def clear_row(self, name: str, b: int) -> None:
        """Zeroes env ``b``'s row of every group's ``name`` (``"obs"`` or ``"next_obs"``)."""
        for buf in self.groups:
            for leaf in space_arrays.leaves(getattr(buf, name)):
                leaf[b] = 0

    def fail_row(self, b: int) -> None:
        """Env ``b``'s step holds no transition for any agent: its outcomes are zero
        (``acting``/``obs`` stay: the new sub-env's)."""
        self.env_done[b], self.env_reward[b], self.unassigned_reward[b] = False, 0.0, 0.0
        self.clear_row("next_obs", b)
        for buf in self.groups:
            buf.completed[b] = False
            buf.reward[b] = 0.0
            buf.terminated[b] = False
            buf.truncated[b] = False


class StepViews:
    """A backend's full step buffers and their row blocks' views (built once per
    block), from which every :class:`MultiAgentStep` it returns is made."""

    def __init__(self, buffers: AgentStepBuffers, policy_ids: tuple[str, ...]) -> None:
        self.buffers, self.policy_ids = buffers, policy_ids
        self.num_envs = len(buffers.env_done)
        self._blocks: dict[tuple[int, int], tuple[AgentStepBuffers, dict[str, GroupBuffers]]] = {}

    def block(self, lo: int, hi: int) -> tuple[AgentStepBuffers, dict[str, GroupBuffers]]:
        """Envs ``[lo, hi)``'s buffers, as views, and their groups by policy id."""
        views = self._blocks.get((lo, hi))
        if views is None:
            whole = (lo, hi) == (0, self.num_envs)
            b = self.buffers if whole else self.buffers.rows(slice(lo, hi))
            views = self._blocks[lo, hi] = (b, dict(zip(self.policy_ids, b.groups)))
        return views

    def step(
        self,
        lo: int,
        hi: int,
        infos: list[dict[str, Any]],
        failed: Any = None,
        errors: dict[int, BaseException] | None = None,
    ) -> MultiAgentStep:
        """Envs ``[lo, hi)``'s step: ``infos`` one per env of the block, ``failed`` its
        failed envs (a ``[hi - lo]`` bool mask or global indices; None or empty: none)."""
        b, groups = self.block(lo, hi)
        mask = None
        if failed is not None and len(failed):
            if isinstance(failed, np.ndarray) and failed.dtype == np.bool_:
                mask = failed if failed.any() else None
            else:  # global indices, a list or an int array
                mask = np.zeros(hi - lo, np.bool_)
                mask[np.asarray(failed, np.int64) - lo] = True
        return MultiAgentStep(
            groups=groups,
            env_done=b.env_done,
            env_reward=b.env_reward,
            unassigned_reward=b.unassigned_reward,
            infos=infos,
            failed=mask,
            errors=errors or None,
            env_ids=None if (lo, hi) == (0, self.num_envs) else slice(lo, hi),
        )
