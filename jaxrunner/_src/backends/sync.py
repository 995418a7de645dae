"""``backend="sync"``: every sub-env in this process, stepped in turn (the shared
step loop of :mod:`jaxrunner._src.backends.gymnasium_block`)."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import gymnasium
from gymnasium.vector.utils import batch_space

from jaxrunner._src import space_arrays
from jaxrunner._src.backends.base import VectorEnv
from jaxrunner._src.backends.batch_step import BatchStep
from jaxrunner._src.backends.capabilities import Capabilities
from jaxrunner._src.backends.env_api import check_env
from jaxrunner._src.backends.gymnasium_block import ActionSplitters, GymnasiumBlock
from jaxrunner._src.backends.in_process import InProcessVectorEnv
from jaxrunner._src.backends.restarts import RestartPolicy, check_restart_policy
from jaxrunner._src.backends.snapshots import (
    SnapshotRefusedError,
    snapshot_dumps,
    valid_restart_state,
)
from jaxrunner._src.backends.step_buffers import StepBuffers
from jaxrunner._src.backends.sub_env_block import EnvFactory
from jaxrunner.errors import InvalidArgumentError, SpaceMismatchError


class SyncVectorEnv(InProcessVectorEnv):
    """Sub-envs in this process, stepped one after another, with validated,
    in-place writes into stacked buffers.

    Step for step equal to ``gymnasium.vector.SyncVectorEnv(env_fns,
    autoreset_mode=SAME_STEP)`` for the same seeds and actions.

    Args:
        env_fns: zero-argument factories, one per sub-env.
        copy: if True, ``reset``/``step`` return copies of the observation buffer
            (as gymnasium's does); the runner's batch methods never copy.
        restart_policy: if given, a sub-env that fails is recreated and reset as this
            policy says, and sampling goes on (see :class:`~jaxrunner.RestartPolicy`); if None
            (default), the failure raises.
    """

    capabilities = Capabilities(can_restart=True, can_snapshot=True)

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        *,
        copy: bool = True,
        restart_policy: RestartPolicy | None = None,
    ) -> None:
        super().__init__(copy=copy)
        check_restart_policy("SyncVectorEnv", restart_policy)
        self.restart_policy = restart_policy
        if len(env_fns) == 0:
            raise InvalidArgumentError("SyncVectorEnv needs at least one env factory, got none.")
        self.env_fns = list(env_fns)
        self.envs: list[gymnasium.Env] = []
        try:
            for i, fn in enumerate(self.env_fns):
                self.envs.append(check_env(fn(), i))
        except BaseException:
            # Do not leak the sub-envs built so far.
            for env in self.envs:
                env.close()
            self._closed_reason = "construction failed"
            raise
        first = self.envs[0]
        self.num_envs = len(self.envs)
        self.metadata = {**first.metadata, "autoreset_mode": VectorEnv.metadata["autoreset_mode"]}
        self.render_mode = first.render_mode
        self.spec = None
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        for i, env in enumerate(self.envs):
            for name in ("observation_space", "action_space"):
                expected, got = getattr(first, name), getattr(env, name)
                if got != expected:
                    self.close()
                    raise SpaceMismatchError(
                        f"sub-env {i} has {name}={got}, but sub-env 0 has {expected}; every "
                        "sub-env of a vector env must have equal spaces. Check the factory."
                    )
        try:
            space_arrays.check_supported(self.single_observation_space, "single_observation_space")
            space_arrays.check_supported(self.single_action_space, "single_action_space")
        except SpaceMismatchError:
            self.close()
            raise
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

        obs_space = self.single_observation_space
        self._buffers = StepBuffers.allocate(obs_space, self.num_envs)
        self._obs = self._buffers.obs
        self._sub_envs = GymnasiumBlock(
            self.envs, self.env_fns, 0, self._buffers, obs_space, restart_policy
        )
        self._actions = ActionSplitters(self.single_action_space)

    @property
    def num_restarts(self) -> int:
        """Sub-envs recreated after a failure (with a ``restart_policy``)."""
        return self._sub_envs.num_restarts

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> tuple[Any, list[dict[str, Any]]]:
        self._check_open("reset")
        return self._obs, self._sub_envs.reset(seeds, options)

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        self._check_open("reset_at")
        self._check_index(index, "reset_at")
        info = self._sub_envs.reset_or_restart(index, seed, options)
        return space_arrays.take(self.single_observation_space, self._obs, index), info

    def _step(self, actions: Any, rows: slice | None) -> BatchStep:
        lo, hi = (0, self.num_envs) if rows is None else (rows.start, rows.stop)
        per_env = self._actions.split(actions, hi - lo)  # validates before any sub-env steps
        out = self._sub_envs.step(lo, hi, per_env)
        return self._buffers.batch_step(
            self.single_observation_space,
            None if rows is None else slice(lo, hi),
            out.infos,
            out.reset_infos,
            out.failed_mask(lo, hi) if out.failed else None,
            out.errors or None,
        )

    def snapshot_sub_envs(self) -> list[bytes]:
        """Pickles of the sub-envs as they are (wrappers, RNG and all; EzPickle envs by
        their state), each with its last reset seed and restarts since (its next
        restart's seed); raises ``pickle``'s error for a sub-env that does not pickle
        (an open window, a socket)."""
        self._check_open("snapshot_sub_envs")
        return [
            snapshot_dumps({"env": env, "restarts": self._sub_envs.restart_state(j)})
            for j, env in enumerate(self.envs)
        ]

    def restore_sub_envs(self, snapshots: Sequence[bytes]) -> None:
        self._check_open("restore_sub_envs")
        if len(snapshots) != self.num_envs:
            raise InvalidArgumentError(
                f"restore_sub_envs(snapshots=...): expected {self.num_envs} snapshots, one per "
                f"sub-env, got {len(snapshots)}."
            )
        # Every snapshot unpickled and checked before any sub-env is replaced: all or none.
        restored = [_unpickle_snapshot(i, blob) for i, blob in enumerate(snapshots)]
        for old in self.envs:
            old.close()
        self.envs[:] = [env for env, _ in restored]  # in place: the step loop holds this list
        for j, (_, restarts) in enumerate(restored):
            if restarts is not None:  # None: a bare env (jaxrunner's first snapshots)
                self._sub_envs.set_restart_state(j, restarts)

    def _obs_buffer(self) -> Any:
        return self._obs

    def render(self) -> tuple[Any, ...]:
        self._check_open("render")
        return tuple(self._sub_envs.render())

    def get_sub_environments(self) -> list[gymnasium.Env]:
        """The sub-envs themselves (the ``gymnasium.Env`` objects, in index order)."""
        self._check_open("get_sub_environments")
        return list(self.envs)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method ``name`` (or reads attribute ``name``) on every sub-env."""
        self._check_open("call")
        return tuple(self._sub_envs.call(name, args, kwargs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        self._check_open("get_attr")
        return tuple(self._sub_envs.get_attr(name))

    def set_attr(self, name: str, values: Any) -> None:
        self._check_open("set_attr")
        self._sub_envs.set_attr(name, self._values_per_env(name, values))

    def _close_backend(self) -> None:
        for env in self.envs:
            env.close()


def _unpickle_snapshot(i: int, blob: bytes) -> tuple[gymnasium.Env, tuple[int | None, int] | None]:
    """Snapshot ``i``: its env and restart state (:meth:`SyncVectorEnv.snapshot_sub_envs`),
    or a bare env and None (the snapshots of checkpoint version 1).

    Raises:
        SnapshotRefusedError: it does not unpickle, or to something else.
    """
    try:
        snapshot = pickle.loads(blob)
    except Exception as err:  # a damaged pickle raises whatever its bytes lead to
        raise SnapshotRefusedError(i, f"does not unpickle ({type(err).__name__}: {err})") from err
    if isinstance(snapshot, gymnasium.Env):
        return snapshot, None
    if not isinstance(snapshot, dict) or set(snapshot) != {"env", "restarts"}:
        problem = f"unpickled to a {type(snapshot).__name__}, not a gymnasium.Env snapshot"
        raise SnapshotRefusedError(i, problem)
    env, restarts = snapshot["env"], snapshot["restarts"]
    if not isinstance(env, gymnasium.Env):
        raise SnapshotRefusedError(i, f"holds a {type(env).__name__}, not a gymnasium.Env")
    if not valid_restart_state(restarts):
        problem = f"holds restarts={restarts!r:.60}; expected (reset seed or None, count >= 0)"
        raise SnapshotRefusedError(i, problem)
    return env, restarts
