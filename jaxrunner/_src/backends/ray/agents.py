"""``backend="ray"`` for multi-agent (PettingZoo) envs, on the single-agent backend's
actor pool. See docs/multi-agent.md and docs/backends/ray.md."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrunner._src.backends.batch_step import EnvIds, block_rows
from jaxrunner._src.backends.capabilities import Capabilities
from jaxrunner._src.backends.multi_agent.action_check import ActionCheck
from jaxrunner._src.backends.multi_agent.buffers import (
    AgentStepBuffers,
    MultiAgentStep,
    StepViews,
)
from jaxrunner._src.backends.multi_agent.vector_env import MultiAgentVectorEnv
from jaxrunner._src.backends.ray.actor_manager import ActorForwarding, ActorPool
from jaxrunner._src.backends.ray.agent_env_actor import AgentEnvWorker, BlockReply, put_reply
from jaxrunner._src.backends.ray.config import RayConfig, import_ray
from jaxrunner._src.backends.ray.deadlines import InFlightSteps
from jaxrunner._src.backends.restarts import RestartPolicy
from jaxrunner._src.backends.sub_env_block import EnvFactory
from jaxrunner._src.core.agent_groups import PolicyMappingFn
from jaxrunner.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    SpaceMismatchError,
    WorkerError,
)


class RayMultiAgentVectorEnv(ActorForwarding, MultiAgentVectorEnv):
    """Multi-agent sub-envs in Ray actors (see docs/multi-agent.md). Uses the running
    Ray instance, or starts a local one.

    Args:
        env_fns: zero-argument factories of PettingZoo envs (picklable).
        policy_mapping_fn: as for the sync backend (picklable).
        config: placement, timeouts and stepping (:class:`~jaxrunner.RayConfig`; its
            ``batch_buckets`` and ``remote_env_batch_wait_ms`` do not apply): lockstep by
            default, ready-first with ``ready_first=True`` (``recv`` answers whichever
            actor is ready; ``send`` then covers whole actors).
        restart_policy: failed sub-envs are recreated inside their actor, dead or hung
            actors replaced; None: failures raise.
    """

    capabilities = Capabilities(can_restart=True, steps_in_background=True)

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        policy_mapping_fn: PolicyMappingFn | None = None,
        *,
        config: RayConfig | None = None,
        restart_policy: RestartPolicy | None = None,
    ) -> None:
        super().__init__()
        self.config = config or RayConfig()
        if not isinstance(self.config, RayConfig):
            raise InvalidArgumentTypeError(
                f"make_vec(<PettingZoo env>, backend='ray', config=...): expected a "
                f"jaxrunner.RayConfig, got {type(config).__name__}."
            )
        self.restart_policy = restart_policy
        self.num_envs = len(env_fns)
        self._actors = ActorPool(
            import_ray(),
            env_fns,
            self.config,
            restart_policy,
            worker=AgentEnvWorker,
            worker_args=(policy_mapping_fn,),
        )
        if self.config.ready_first:
            self.capabilities = Capabilities(
                can_restart=True, steps_in_background=True, ready_first=True
            )
        self._closed_reason = "construction failed"  # until the actors are up
        described = self._actors.start()
        self.groups, self.turn_based = described[0]
        for u, other in enumerate(described):
            if other != described[0]:
                self._actors.kill_all()
                raise SpaceMismatchError(
                    f"the sub-envs of Ray env actor {u} have agent groups {other[0]}, actor "
                    f"0's have {self.groups}; every sub-env must have the same agents and "
                    "spaces. Check the factory."
                )
        self._closed_reason = None
        self.unit_rows = self._actors.unit_rows
        self._buffers = AgentStepBuffers.allocate(self.groups, self.num_envs)
        self._views = StepViews(self._buffers, self.policy_ids)
        self._failed = np.zeros(self.num_envs, np.bool_)
        self._checks: dict[int, ActionCheck] = {}
        self._in_flight = InFlightSteps(self._actors.ray, self.config.step_timeout_s)
        self._sends: list[_Send] = []
        """Sends not yet received, in send order (ready-first: one per actor)."""
        self._owner: dict[Any, _Send] = {}  # actor step ref -> its send

    @property
    def num_actor_restarts(self) -> int:
        """Actors replaced after dying or timing out."""
        return self._actors.num_actor_restarts

    @property
    def actors(self) -> list[Any]:
        """The Ray actor handles, one per block of :attr:`unit_rows` (current ones)."""
        return list(self._actors.actors)

    def reset_batch(
        self, seeds: Sequence[int | None], options: dict[str, Any] | None = None
    ) -> MultiAgentStep:
        self._check_open("reset_batch")
        refs = [
            actor.reset.remote(list(seeds[rows]), options)
            for actor, rows in zip(self._actors.actors, self.unit_rows)
        ]
        replies = []
        for u, ref in enumerate(refs):
            try:
                reply = self._actors.ray.get(ref, timeout=self.config.step_timeout_s)
            except Exception as err:
                reply = self._actors.replace(u, self._actors.remote_error(err, u, "reset"))
            replies.append((self.unit_rows[u], reply))
        sent = _Send(0, self.num_envs)
        sent.replies = replies
        return self._gather(sent)

    def send(self, actions: Sequence[Any], env_ids: EnvIds = None) -> None:
        """Validates ``actions`` and starts the step of block ``env_ids`` on the actors
        that hold its envs; returns without waiting. Ready-first: ``env_ids`` covers
        whole actors, none of them in flight, and each actor answers on its own."""
        self._check_open("step")
        self._send(actions, env_ids, per_actor=self.capabilities.ready_first)

    def _send(self, actions: Sequence[Any], env_ids: EnvIds, per_actor: bool) -> _Send:
        """Starts the step of ``env_ids``: one send, or one per actor; returns the last."""
        lo, hi = block_rows(env_ids, self.num_envs, type(self).__name__)
        check = self._checks.get(hi - lo)
        if check is None:
            check = self._checks[hi - lo] = ActionCheck(self.groups, hi - lo)
        check(actions)  # before any actor steps
        units = [(u, r) for u, r in enumerate(self.unit_rows) if r.start < hi and lo < r.stop]
        if per_actor and (
            {u for u, _ in units} & self._in_flight.units()
            or units[0][1].start != lo
            or units[-1][1].stop != hi
        ):
            raise InvalidArgumentError(
                f"{type(self).__name__}.send(env_ids=slice({lo}, {hi})): with ready_first, "
                f"env_ids must cover whole actors (their sub-envs are {self.unit_rows}), none "
                "of them in flight; recv() those first."
            )
        sends = [] if per_actor else [_Send(lo, hi)]
        for u, rows in units:
            start, stop = max(lo, rows.start), min(hi, rows.stop)
            part = [np.asarray(a)[start - lo : stop - lo] for a in actions]
            ref = self._actors.actors[u].step.remote(start - rows.start, stop - rows.start, part)
            self._in_flight.add(ref, u, slice(start, stop))
            if per_actor:
                sends.append(_Send(start, stop))
            sends[-1].refs[ref] = u
            sends[-1].actors[ref] = self._actors.actors[u]
            self._owner[ref] = sends[-1]
        self._sends.extend(sends)
        return sends[-1]

    def recv(self) -> MultiAgentStep:
        """Lockstep: the oldest send's step, once every actor of it has answered.
        Ready-first: the first actor's step to answer. A dead or hung actor is replaced
        (with a restart policy; without one, it raises
        ``WorkerError`` or ``RemoteTimeoutError``)."""
        self._check_open("step")
        if not self._sends:
            raise InvalidArgumentError(
                f"{type(self).__name__}.recv(): no send() is waiting for its results. Call "
                "send(actions, env_ids) first, once per recv()."
            )
        return self._finish(None if self.capabilities.ready_first else self._sends[0])

    def step_batch(self, actions: Sequence[Any]) -> MultiAgentStep:
        """Every env's step, once every actor has answered (in ready-first mode too)."""
        self._check_open("step")
        if self._sends and not self.capabilities.ready_first:  # the oldest send answers
            return super().step_batch(actions)
        return self._finish(self._send(actions, None, per_actor=False))

    def _finish(self, sent: _Send | None) -> MultiAgentStep:
        """Waits for send ``sent`` (None: the first send to complete); its step."""
        try:
            while True:
                for done in self._sends if sent is None else [sent]:
                    if not done.refs:
                        self._sends.remove(done)
                        return self._gather(done)
                self._wait_one()
        except BaseException:
            self._discard()
            raise

    def _wait_one(self) -> None:
        """Takes the first actor step to answer (or replaces the actors past their
        deadline) into the send it belongs to."""
        ref = self._in_flight.first_ready()
        if ref is None:
            by_rows = {(u, self._in_flight.rows(r).start): r for r, u in self._refs_in_flight()}
            for u, rows, cause in list(self._in_flight.pop_expired()):
                self._lose(by_rows[u, rows.start], u, rows, cause)
            return
        u, rows = self._in_flight.pop(ref)
        try:
            reply = self._actors.ray.get(ref)
        except Exception as err:
            cause = self._actors.remote_error(err, u, "step")
            if not isinstance(cause, WorkerError):  # raised by a sub-env
                raise cause  # noqa: B904  (remote_error chained the cause)
            self._lose(ref, u, rows, cause)
            return
        sent = self._owner.pop(ref)
        del sent.refs[ref], sent.actors[ref]
        sent.replies.append((rows, reply))

    def _lose(self, ref: Any, u: int, rows: slice, cause: BaseException) -> None:
        """Actor ``u``'s step ``ref`` (envs ``rows``) died with its actor: the actor is
        replaced, unless a step of another block already replaced it; the envs' slots
        fail with ``cause``."""
        sent = self._owner.pop(ref)
        del sent.refs[ref]
        if sent.actors.pop(ref) is self._actors.actors[u]:
            self._replace(u, cause, sent.lost)
        else:  # replaced since this step was sent: its new episodes are in the buffers
            sent.lost.update(dict.fromkeys(range(rows.start, rows.stop), cause))

    def _refs_in_flight(self) -> list[tuple[Any, int]]:
        return [(ref, u) for sent in self._sends for ref, u in sent.refs.items()]

    def _discard(self) -> None:
        """After a failure: nothing in flight is waited for again."""
        self._in_flight.discard()
        self._sends.clear()
        self._owner.clear()

    def _replace(self, u: int, cause: BaseException, lost: dict[int, BaseException]) -> None:
        """A new actor ``u`` in place of a lost one (or the failure raised): its reset
        sub-envs' rows are written now (all of them: whatever block they are in), and
        their slots fail with ``cause``."""
        if self.restart_policy is None:
            self._actors.kill(self._actors.actors[u])
            raise cause
        reply = self._actors.replace(u, cause)
        rows = self.unit_rows[u]
        put_reply(self._buffers, reply, rows)
        lost.update(dict.fromkeys(range(rows.start, rows.stop), cause))

    def _gather(self, sent: _Send) -> MultiAgentStep:
        """Copies the replies of ``sent``'s actors into the buffers; its block's step."""
        b = self._buffers
        lo, hi = sent.lo, sent.hi
        infos: list[dict[str, Any]] = [{} for _ in range(hi - lo)]
        lost = {i: err for i, err in sent.lost.items() if lo <= i < hi}
        errors: dict[int, BaseException] = dict(lost)
        failed = self._failed[lo:hi]
        failed[:] = False
        for rows, reply in sent.replies:
            put_reply(b, reply, rows)
            start, stop = max(rows.start, lo), min(rows.stop, hi)  # the block's part of them
            own = slice(start - rows.start, stop - rows.start)
            if reply.failed is not None:
                failed[start - lo : stop - lo] = reply.failed[own]
            errors.update(reply.errors or {})
            infos[start - lo : stop - lo] = reply.infos[own]
        for i in lost:  # a replaced actor's sub-envs: no transition, new episodes
            failed[i - lo] = True
            b.env_done[i], b.env_reward[i], b.unassigned_reward[i] = False, 0.0, 0.0
            for buf in b.groups:
                buf.completed[i] = False
        return self._views.step(lo, hi, infos, failed, errors)

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        self._check_open("reset_at")
        self._check_index(index)
        u = index // self.config.envs_per_actor
        rows = self.unit_rows[u]
        try:
            ref = self._actors.actors[u].reset_at.remote(index - rows.start, seed, options)
            reply = self._actors.ray.get(ref, timeout=self.config.step_timeout_s)
        except Exception as err:
            raise self._actors.remote_error(err, u, "reset_at")  # noqa: B904  (chained)
        put_reply(self._buffers, reply, rows)
        return reply.infos[index - rows.start]

    @property
    def num_restarts(self) -> int:
        """Sub-envs recreated inside their actors after a failure."""
        return self._actors.num_restarts()

    def _close_backend(self) -> None:
        self._actors.close()
        self._in_flight.clear()
        self._sends.clear()
        self._owner.clear()


class _Send:
    """A send in flight: its block, its actor steps (ref -> actor) and what came back."""

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi
        self.refs: dict[Any, int] = {}
        self.actors: dict[Any, Any] = {}
        """The actor handle each step was sent to (a replaced one is lost with it)."""
        self.replies: list[tuple[slice, BlockReply]] = []
        self.lost: dict[int, BaseException] = {}
