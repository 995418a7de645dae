"""The contract every vector-env backend keeps, for either kind of env (:class:`VectorEnv`,
:class:`MultiAgentVectorEnv`): ``reset_batch``, ``send(actions, env_ids)``
and ``recv()``, SAME_STEP autoreset, declared capabilities. See docs/concepts.md
(the vector-env contract) and ``jaxrunner.testing.VectorEnvContract``."""

from __future__ import annotations

import abc
import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from jaxrunner._src import space_arrays
from jaxrunner._src.arg_checks import check_dict, check_int, is_int
from jaxrunner._src.backends.capabilities import Capabilities
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.backends.steps import BatchStep, EnvIds, MultiAgentStep
from jaxrunner._src.core.agent_groups import AgentGroup, GroupedAgents
from jaxrunner._src.core.seeds import normalize_seeds
from jaxrunner.errors import (
    ClosedError,
    EnvIndexError,
    InvalidArgumentError,
    SpaceMismatchError,
)

if TYPE_CHECKING:
    from jaxrunner._src.backends.auto import LayoutChoice


def env_spaces(envs: Sequence[Any], offset: int = 0) -> list[tuple[Any, Any]]:
    """Each sub-env's ``(observation_space, action_space)``; sub-env ``offset + i`` is
    named where it lacks one."""
    try:
        return [(env.observation_space, env.action_space) for env in envs]
    except AttributeError:
        missing = [  # looked up without running a property (whose own error stays its)
            (i, name)
            for i, env in enumerate(envs)
            for name in ("observation_space", "action_space")
            if inspect.getattr_static(env, name, None) is None
        ]
        if not missing:  # raised inside a space property: the env's own error
            raise
        i, name = missing[0]
        raise SpaceMismatchError(
            f"sub-env {offset + i} ({type(envs[i]).__name__}) has no {name}; a gymnasium.Env "
            "sets self.observation_space and self.action_space (in its __init__, or as class "
            "attributes)."
        ) from None


def check_equal_spaces(
    pairs: Sequence[tuple[gymnasium.Space, gymnasium.Space]], offset: int = 0
) -> None:
    """Raises unless every sub-env's ``(observation_space, action_space)`` equals the
    first's, and those are spaces jaxrunner supports; ``pairs[i]`` is sub-env
    ``offset + i``."""
    for i, pair in enumerate(pairs):
        for name, expected, got in zip(("observation_space", "action_space"), pairs[0], pair):
            if got != expected:
                raise SpaceMismatchError(
                    f"sub-env {offset + i} has {name}={got}, but sub-env {offset} has "
                    f"{expected}; every sub-env of a vector env must have equal spaces. "
                    "Check the factory."
                )
    space_arrays.check_supported(pairs[0][0], "single_observation_space")
    space_arrays.check_supported(pairs[0][1], "single_action_space")


class BaseVectorEnv(abc.ABC):
    """What every jaxrunner vector env shares, single-agent (:class:`VectorEnv`) or
    multi-agent (:class:`~jaxrunner.MultiAgentVectorEnv`): capabilities, the closed
    state, sub-env utilities, snapshot refusals. The two differ in what a step carries."""

    capabilities: Capabilities = Capabilities()
    """What this backend can do (see :class:`Capabilities`)."""
    multi_agent: ClassVar[bool] = False
    """The kind of env: agents in policy groups (True) or one agent (False)."""
    restart_policy: RestartPolicy | None = None
    """How failed sub-envs are recreated (None: failures raise); given at construction,
    only where ``capabilities.can_restart``."""
    num_envs: int
    closed: bool = False
    layout_choice: LayoutChoice | None = None
    """What ``make_vec(..., backend="auto")`` chose and why (None: not built by it)."""
    reset_seed: int | None = None
    """The int seed the envs were last reset with as a whole (``make_vec(..., seed=...)``,
    or ``reset(seed=...)``; None: none): a runner warns when its own seed overrides it."""

    def __init__(self) -> None:
        self._closed_reason: str | None = None

    @property
    def can_snapshot(self) -> bool:
        """``capabilities.can_snapshot``: the sub-envs' state can be saved and restored."""
        return self.capabilities.can_snapshot

    @property
    def num_restarts(self) -> int:
        """Sub-envs recreated after a failure so far (0 where none can be)."""
        return 0

    def get_num_restarts(self) -> int:
        """:attr:`num_restarts`, refused once closed."""
        self._check_open("get_num_restarts")
        return self.num_restarts

    def send_checked(self, actions: Any, env_ids: EnvIds = None) -> None:
        """``send`` of actions that pass its checks (a sampler's policy step checked their
        values): a backend whose check costs skips it."""
        self.send(actions, env_ids)  # type: ignore[attr-defined]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "send" in cls.__dict__ and "send_checked" not in cls.__dict__:
            cls.send_checked = BaseVectorEnv.send_checked  # (a send redefined: it sends all)

    @abc.abstractmethod
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method ``name`` (or reads attribute ``name``) on every sub-env."""

    @abc.abstractmethod
    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of every sub-env."""

    @abc.abstractmethod
    def set_attr(self, name: str, values: Any) -> None:
        """Sets attribute ``name`` of every sub-env (one value each, or one for all)."""

    @abc.abstractmethod
    def render(self) -> Any:
        """Every sub-env's ``render()``."""

    def get_sub_environments(self) -> list[Any]:
        """One entry per sub-env, in index order: the env object where it lives in this
        process, else a :class:`~jaxrunner._src.backends.sub_env_handle.SubEnvHandle`
        (that sub-env alone, even after a restart). Refused where not overridden."""
        self._check_open("get_sub_environments")
        raise InvalidArgumentError(
            f"{type(self).__name__}.get_sub_environments(): this backend cannot reach its "
            "sub-envs one by one; use call/get_attr/set_attr where it has them, or "
            "backend='sync' or 'process' for per-sub-env access."
        )

    def snapshot_sub_envs(self) -> list[bytes]:
        """Every sub-env's state, as a pickle (only where ``capabilities.can_snapshot``).
        Unpickling runs code: restore only snapshots you made yourself."""
        raise InvalidArgumentError(
            f"{type(self).__name__} cannot snapshot its sub-envs (capabilities.can_snapshot "
            "is False); use backend='sync' for checkpoints that resume episodes exactly."
        )

    def restore_sub_envs(self, snapshots: Sequence[bytes]) -> None:
        """Replaces every sub-env by its snapshot (:meth:`snapshot_sub_envs`)."""
        raise InvalidArgumentError(
            f"{type(self).__name__} cannot restore sub-env snapshots (can_snapshot is False)."
        )

    @abc.abstractmethod
    def _close_backend(self) -> None:
        """Releases the sub-envs (called once)."""

    def close_extras(self, **kwargs: Any) -> None:
        if self._closed_reason is None:
            self._closed_reason = "close() was called"
            self._close_backend()

    def close(self, **kwargs: Any) -> None:
        """Releases the sub-envs; every later call raises
        :class:`~jaxrunner.errors.ClosedError`."""
        self.close_extras(**kwargs)
        self.closed = True

    def __enter__(self) -> Any:
        return self

    def __repr__(self) -> str:
        # gymnasium's VectorEnv repr, for either kind (it comes before gymnasium's in the MRO).
        spec = getattr(self, "spec", None)
        head = f"{spec.id}, " if spec is not None else ""
        return f"{type(self).__name__}({head}num_envs={getattr(self, 'num_envs', None)})"

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # A finalizer for backends holding processes (no contextlib: module globals may
        # be gone at interpreter exit).
        try:  # noqa: SIM105
            self.close()
        except Exception:
            pass

    def _check_open(self, what: str) -> None:
        if self._closed_reason is not None:
            raise ClosedError(
                f"{type(self).__name__}.{what}() called after the vector env was closed "
                f"({self._closed_reason}). Create a new one with jaxrunner.make_vec()."
            )

    def _check_reset_at(self, index: Any, seed: Any, options: Any) -> None:
        """``reset_at``'s arguments: ``index`` in range, ``seed`` an int >= 0 or None,
        ``options`` a dict or None."""
        if not is_int(index, 0, self.num_envs - 1):
            raise EnvIndexError(
                f"reset_at(index={index!r}): index must be in [0, {self.num_envs})."
            )
        check_int("reset_at", "seed", seed, low=0, none="for no new seed")
        check_dict("reset_at", "options", options)

    def _values_per_env(self, name: str, values: Any) -> list[Any]:
        """``set_attr``'s values: one per sub-env, or one value for all."""
        if not isinstance(values, (list, tuple)):
            return [values] * self.num_envs
        if len(values) != self.num_envs:
            raise InvalidArgumentError(
                f"set_attr({name!r}, values): need one value per sub-env ({self.num_envs}), "
                f"got {len(values)}."
            )
        return list(values)


class VectorEnv(GroupedAgents, BaseVectorEnv, gymnasium.vector.VectorEnv):
    """Base of jaxrunner's single-agent vector envs (the contract: docs/concepts.md, the
    vector-env contract)."""

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP}  # noqa: RUF012
    """Per instance, as gymnasium declares it (backends set their own)."""
    # Set by subclasses in __init__.
    single_observation_space: gymnasium.Space
    single_action_space: gymnasium.Space

    def __init__(self, *, copy: bool = True) -> None:
        super().__init__()
        self.copy = copy

    @property
    def groups(self) -> tuple[AgentGroup, ...]:
        """One group of one agent (``"agent_0"`` of ``"default_policy"``): a single-agent
        env in the model of every env, agents in policy groups."""
        return (AgentGroup.one_agent(self.single_observation_space, self.single_action_space),)

    @abc.abstractmethod
    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> tuple[Any, list[dict[str, Any]]]:
        """Resets every sub-env (``seeds[i]`` for sub-env ``i``); returns the obs buffer
        view and per-env infos. The results of sends not yet received are dropped."""

    @abc.abstractmethod
    def send(self, actions: Any, env_ids: EnvIds = None) -> None:
        """Starts one step of envs ``env_ids`` (None: all) with ``actions`` (one row
        per env, in ``env_ids`` order); validates the whole batch before any sub-env
        steps. Sends of disjoint envs may be in flight together; a lockstep backend
        needs ``env_ids`` to be None or a slice."""

    @abc.abstractmethod
    def recv(self) -> BatchStep:
        """The results of one earlier :meth:`send` (the oldest unless ``ready_first``),
        with ``BatchStep.env_ids`` saying which envs they are."""

    def step_batch(self, actions: Any, rows: slice | None = None) -> BatchStep:
        """One lockstep step of envs ``rows`` (None: all): :meth:`send` then
        :meth:`recv`. See :class:`BatchStep`; arrays are ``rows``' rows only."""
        self.send(actions, rows)
        return self.recv()

    @abc.abstractmethod
    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Resets sub-env ``index`` only; returns its observation and info."""

    def _obs_buffer(self) -> Any:
        """The current observations, ``[B, ...]``: a view of the backend's ``_obs``."""
        return self._obs  # type: ignore[attr-defined]

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """gymnasium ``reset``: sub-env ``i`` is seeded with ``seed + i``. As in
        gymnasium, ``options["reset_mask"]`` (a bool array) resets only those envs."""
        seeds = normalize_seeds(seed, self.num_envs)
        check_dict("reset", "options", options)
        if seed is not None:
            self.reset_seed = int(seed) if isinstance(seed, (int, np.integer)) else None
        options = dict(options) if options else None
        mask = options.pop("reset_mask", None) if options else None
        if mask is None:
            obs, infos = self.reset_batch(seeds, options)
            indices = list(range(self.num_envs))
        else:
            if not (
                isinstance(mask, np.ndarray)
                and mask.dtype == np.bool_
                and mask.shape == (self.num_envs,)
                and mask.any()
            ):
                raise InvalidArgumentError(
                    f"reset(options={{'reset_mask': ...}}): expected a numpy bool array of "
                    f"shape ({self.num_envs},) with at least one True, got {mask!r:.80}."
                )
            indices = np.flatnonzero(mask).tolist()
            infos = [self.reset_at(i, seed=seeds[i], options=options)[1] for i in indices]
            obs = self._obs_buffer()
        merged: dict[str, Any] = {}
        for i, info in zip(indices, infos):
            merged = self._add_info(merged, info, i)
        return self._maybe_copy(obs), merged

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        """gymnasium ``step`` with SAME_STEP autoreset: where an episode ended, ``obs``
        is the reset observation and ``info["final_obs"]``/``info["final_info"]`` hold
        the final ones, exactly as ``gymnasium.vector.SyncVectorEnv`` reports them."""
        out = self.step_batch(actions)
        merged: dict[str, Any] = {}
        for i, info in enumerate(out.infos):
            if i in out.reset_infos:
                final_obs = space_arrays.take(self.single_observation_space, out.next_obs, i)
                merged = self._add_info(merged, {"final_obs": final_obs, "final_info": info}, i)
                info = out.reset_infos[i]
            merged = self._add_info(merged, info, i)
        return (
            self._maybe_copy(out.obs),
            out.reward.copy(),
            out.terminated.copy(),
            out.truncated.copy(),
            merged,
        )

    def _take_spaces(
        self,
        observation_space: gymnasium.Space,
        action_space: gymnasium.Space,
        metadata: dict[str, Any],
        render_mode: str | None,
    ) -> None:
        """Sets the spaces, metadata and render mode from sub-env 0's, once the caller has
        checked every sub-env's spaces equal and supported."""
        self.single_observation_space = observation_space
        self.single_action_space = action_space
        self.observation_space = batch_space(observation_space, self.num_envs)
        self.action_space = batch_space(action_space, self.num_envs)
        self.metadata = {**metadata, "autoreset_mode": VectorEnv.metadata["autoreset_mode"]}
        self.render_mode, self.spec = render_mode, None

    def _maybe_copy(self, obs: Any) -> Any:
        if not self.copy:
            return obs
        return space_arrays.map_structure(self.single_observation_space, np.copy, obs)


class MultiAgentVectorEnv(GroupedAgents, BaseVectorEnv):
    """Base of the multi-agent backends (the contract: docs/multi-agent.md): the core's
    :class:`~jaxrunner._src.backends.base.BaseVectorEnv` with multi-agent steps."""

    multi_agent = True
    turn_based: bool
    """AEC sub-envs: one agent acts per step."""

    @abc.abstractmethod
    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> MultiAgentStep:
        """Resets sub-env ``i`` with ``seeds[i]``; the step says who acts first on what.
        The results of sends not yet received are dropped."""

    @abc.abstractmethod
    def send(self, actions: Sequence[Any], env_ids: EnvIds = None) -> None:
        """Starts one step of the contiguous block ``env_ids`` (None: every env; else a
        slice with step 1): ``actions[g]`` is group ``g``'s ``[hi - lo, A_g, ...]``
        batch, validated whole before any sub-env steps. Sends of disjoint blocks may
        be in flight together."""

    @abc.abstractmethod
    def recv(self) -> MultiAgentStep:
        """The results of one earlier :meth:`send` (the oldest, unless
        ``capabilities.ready_first``: then a block whose envs are ready);
        ``MultiAgentStep.env_ids`` says which envs they are."""

    def step_batch(self, actions: Sequence[Any]) -> MultiAgentStep:
        """Steps every sub-env once (:meth:`send` of every env, then :meth:`recv`)."""
        self.send(actions, None)
        return self.recv()

    @abc.abstractmethod
    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Resets sub-env ``index`` alone (the others are untouched); returns its reset
        infos. Its row of the buffers then holds the new episode's first agents."""
