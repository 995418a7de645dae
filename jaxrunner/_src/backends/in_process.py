"""Backends whose sub-envs step in the calling thread: ``send`` keeps the actions and
``recv`` steps them; the sync backends forward to their :class:`SubEnvBlock`."""

from __future__ import annotations

import abc
import collections
import pickle
from collections.abc import Sequence
from typing import Any

from jaxrunner._src.arg_checks import check_env_fns, check_seed_count
from jaxrunner._src.backends.checked_sends import ChecksOnSend
from jaxrunner._src.backends.remote_sub_envs import RemoteSubEnvs
from jaxrunner._src.backends.restarts import RestartPolicy, check_restart_policy, close_quietly
from jaxrunner._src.backends.snapshots import (
    SnapshotRefusedError,
    snapshot_dumps,
    valid_restart_state,
)
from jaxrunner._src.backends.steps import EnvIds, block_rows
from jaxrunner._src.backends.sub_env_block import EnvFactory, SubEnvBlock, build_envs
from jaxrunner.errors import InvalidArgumentError


class InProcessSends(ChecksOnSend):
    """``send``/``recv`` of a backend whose sub-envs step in the calling thread: :meth:`send`
    checks the actions and keeps them (not copied: keep them unchanged until the matching
    :meth:`recv`), and :meth:`recv` steps the oldest send with :meth:`_step`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sent: collections.deque[tuple[Any, slice | None]] = collections.deque()

    @abc.abstractmethod
    def _checked(self, actions: Any, rows: slice | None) -> Any:
        """``actions`` for envs ``rows`` as :meth:`_step` takes them, or
        ``InvalidActionError`` before anything is queued or stepped."""

    @abc.abstractmethod
    def _step(self, actions: Any, rows: slice | None) -> Any:
        """Steps envs ``rows`` (None: all; else a slice with step 1 inside the envs)
        now with :meth:`_checked` actions; ``step_batch``'s contract."""

    def _begin_reset(self, seeds: Sequence[Any], call: str = "reset") -> None:
        """``reset_batch``'s checks, then the sends not yet received are dropped (as on
        every backend)."""
        self._check_open(call)  # type: ignore[attr-defined]
        check_seed_count(seeds, self.num_envs, type(self).__name__)  # type: ignore[attr-defined]
        self._sent.clear()

    def _passed(self, actions: Any, rows: slice | None) -> Any:
        """:meth:`_checked` of actions known to pass its checks (where a backend can
        skip them)."""
        return self._checked(actions, rows)

    def _send_actions(self, actions: Any, env_ids: EnvIds, checked: bool) -> None:
        self._check_open("step")  # type: ignore[attr-defined]
        rows = None if env_ids is None else self._rows(env_ids)
        self._sent.append(((self._passed if checked else self._checked)(actions, rows), rows))

    def _rows(self, env_ids: EnvIds) -> slice:
        """``env_ids`` (not None) as the block ``_step`` steps: a slice with step 1 inside
        the envs, as every backend and kind reads it (else an error)."""
        lo, hi = block_rows(env_ids, self.num_envs, type(self).__name__)  # type: ignore[attr-defined]
        return slice(lo, hi)

    def recv(self) -> Any:
        self._check_open("step")  # type: ignore[attr-defined]
        if not self._sent:
            raise InvalidArgumentError(
                f"{type(self).__name__}.recv(): no send() is waiting for its results. Call "
                "send(actions, env_ids) first, once per recv()."
            )
        actions, rows = self._sent.popleft()
        return self._step(actions, rows)

    def step_batch(self, actions: Any, rows: slice | None = None) -> Any:
        if self._sent:  # send then recv, as the base defines it: the oldest send answers
            self.send(actions, rows)
            return self.recv()
        self._check_open("step")  # type: ignore[attr-defined]
        rows = None if rows is None else self._rows(rows)  # None: no call
        return self._step(self._checked(actions, rows), rows)


class BlockForwarding(RemoteSubEnvs):
    """What a sync backend forwards to its :class:`SubEnvBlock` (``_block``): the sub-envs'
    attributes and calls, restarts, closing, and snapshots of each sub-env with its
    restart state and what :meth:`_state_of` adds (a multi-agent driver's state)."""

    _block: SubEnvBlock

    def _build_envs(
        self, env_fns: Sequence[EnvFactory], restart_policy: RestartPolicy | None
    ) -> list[Any]:
        """Checks the arguments and builds the sub-envs (a factory's error: ``SubEnvRaised``);
        the vector env counts as closed ("construction failed") until the caller, its block
        built, sets ``_closed_reason`` back to None."""
        where = type(self).__name__
        check_env_fns(where, env_fns)
        check_restart_policy(where, restart_policy)
        self.restart_policy = restart_policy
        self._closed_reason = "construction failed"
        return build_envs(env_fns, 0)

    @property
    def num_restarts(self) -> int:
        return self._block.num_restarts

    def _ask_one(self, index: int, method: str, args: tuple) -> Any:
        return self._block.on_sub_env(index, method, args)

    def _ask_each(self, method: str, *args: Any) -> tuple[Any, ...]:
        return tuple(getattr(self._block, method)(*args))

    def _set_each(self, name: str, values: list[Any]) -> None:
        self._block.set_attr(name, values)

    def get_sub_environments(self) -> list[Any]:
        """The sub-envs themselves (this process holds them), in index order."""
        self._check_open("get_sub_environments")
        return list(self._block.envs)

    def _close_backend(self) -> None:
        self._block.close()

    _state_keys: frozenset[str] = frozenset()
    """What a snapshot holds besides ``"env"`` and ``"restarts"`` (:meth:`_state_of`)."""
    _snapshot_of: str = "sub-env"
    """What a snapshot is of (its refusals say it)."""

    def _state_of(self, j: int) -> dict[str, Any]:
        """What sub-env ``j``'s snapshot holds besides the env and its restart state."""
        return {}

    def _bare(self, snapshot: Any) -> bool:
        """``snapshot`` is a bare env, as version 1 checkpoints hold them."""
        return False

    @abc.abstractmethod
    def _restored(self, j: int, snapshot: dict[str, Any]) -> Any:
        """Sub-env ``j``'s unpickled ``snapshot`` checked, as what :meth:`_install` takes;
        raises :class:`SnapshotRefusedError` where it is refused."""

    @abc.abstractmethod
    def _install(self, restored: list[Any]) -> None:
        """Takes every :meth:`_restored` sub-env in place of the current ones."""

    def snapshot_sub_envs(self) -> list[bytes]:
        """Pickles of the sub-envs as they are (wrappers, RNG and all; EzPickle envs by
        their state), each with its restart state and a multi-agent driver's step state;
        raises ``pickle``'s error for a sub-env that does not pickle (an open window)."""
        self._check_open("snapshot_sub_envs")
        block = self._block
        return [
            snapshot_dumps({"env": env, **self._state_of(j), "restarts": block.restart_state(j)})
            for j, env in enumerate(block.envs)
        ]

    def restore_sub_envs(self, snapshots: Sequence[bytes]) -> None:
        """Replaces every sub-env by its snapshot (:meth:`snapshot_sub_envs`); all or
        none: every snapshot is unpickled and checked before any sub-env is replaced.
        The buffers are not touched: the sampler restores what its next step reads.

        Raises:
            InvalidArgumentError: the wrong number of snapshots, or one that does not
                unpickle or is not a snapshot of such a sub-env; the sub-envs are left
                as they were.
        """
        self._check_open("restore_sub_envs")
        if len(snapshots) != self.num_envs:
            raise InvalidArgumentError(
                f"restore_sub_envs(snapshots=...): expected {self.num_envs} snapshots, one per "
                f"sub-env, got {len(snapshots)}."
            )
        restored, restarts = [], []
        for j, blob in enumerate(snapshots):
            snapshot = self._unpickle(j, blob)
            restored.append(self._restored(j, snapshot))
            restarts.append(snapshot.get("restarts"))
        for old in self._block.envs:
            close_quietly(old)
        self._install(restored)
        for j, state in enumerate(restarts):
            if state is not None:  # None: an older snapshot, without it
                self._block.set_restart_state(j, state)

    def _unpickle(self, j: int, blob: bytes) -> dict[str, Any]:
        """Snapshot ``j`` as a dict of an ``"env"``, the :attr:`_state_keys` and a valid
        ``"restarts"`` if it has one (a bare env becomes ``{"env": env}``)."""
        try:
            snapshot = pickle.loads(blob)
        except Exception as err:  # a damaged pickle raises whatever its bytes lead to
            problem = f"does not unpickle ({type(err).__name__}: {err})"
            raise SnapshotRefusedError(j, problem) from err
        if self._bare(snapshot):
            return {"env": snapshot}
        keys = {"env", *self._state_keys}
        if not (isinstance(snapshot, dict) and keys <= set(snapshot) <= {*keys, "restarts"}):
            problem = (
                f"unpickled to a {type(snapshot).__name__}, not a {self._snapshot_of} snapshot"
            )
            raise SnapshotRefusedError(j, problem)
        restarts = snapshot.get("restarts")
        if restarts is not None and not valid_restart_state(restarts):
            problem = f"holds restarts={restarts!r:.60}; expected (reset seed or None, count >= 0)"
            raise SnapshotRefusedError(j, problem)
        return snapshot
