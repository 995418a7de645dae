"""Dynamic batching of policy requests from concurrent episodes, batch invariant: a row's
action depends on the seed, its episode and its step only."""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces

import jaxrunner._src.samplers.keys as keys
from jaxrunner._src import space_arrays
from jaxrunner._src.core.params import put_params
from jaxrunner._src.core.policy import Params, Policy
from jaxrunner._src.samplers.batch_invariance import chunked_apply, policy_chunk_rows
from jaxrunner._src.samplers.policy_step import apply_output
from jaxrunner._src.samplers.ready_first import default_buckets
from jaxrunner._src.samplers.transfer import Packing, compile_packed
from jaxrunner.errors import ClosedError

logger = logging.getLogger("jaxrunner._src.services.external.batching")


@dataclasses.dataclass
class Row:
    """One policy evaluation; ``action`` None to sample, ``carry`` None if feed-forward."""

    obs: Any
    action: Any
    episode_id: int
    step: int
    carry: Any


RowResult = tuple[Any, dict[str, np.ndarray], Any]  # (action, extras, carry) as numpy


@dataclasses.dataclass
class _Request:
    rows: list[Row]
    on_done: Callable[[list[RowResult]], Any]
    on_abort: Callable[[BaseException | None], Any] | None
    future: concurrent.futures.Future
    results: list[RowResult | None]
    taken: int = 0  # rows handed to a batch so far
    remaining: int = 0  # rows not yet computed
    finished: bool = False  # on_done or on_abort has run


class PolicyBatcher:
    """Runs a policy for rows submitted from any thread in one thread: up to ``max_batch``
    rows padded to a ``buckets`` size (None: powers of four), after waiting up to
    ``max_wait_s`` for more, or less once ``ready_hint()`` (the most that could come) are
    queued."""

    def __init__(
        self,
        policy: Policy,
        params: Params,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        seed: int,
        *,
        max_batch: int,
        max_wait_s: float,
        buckets: Sequence[int] | None,
        ready_hint: Callable[[], int] | None = None,
        owner: str = "PolicyBatcher",
    ) -> None:
        self._params = put_params(params, f"{owner}(params)")
        # small_calls: a batch may hold one row, so a costly policy keeps small chunks.
        self._chunk_rows = policy_chunk_rows(
            policy, params, observation_space, max_batch, small_calls=True
        )
        self._policy = policy
        self._obs_space = observation_space
        self._action_space = action_space
        self._seed = seed
        self._max_batch = max_batch
        self._max_wait_s = max_wait_s
        self._buckets = tuple(sorted(buckets or default_buckets(max_batch, 1, factor=4)))
        self._ready_hint = ready_hint
        self._params_version = 0
        self._compiled: dict[int, tuple[Callable, Packing, Packing, np.ndarray]] = {}
        self._cond = threading.Condition()
        self._queue: collections.deque[_Request] = collections.deque()
        self._queued_rows = 0
        self._closed = False
        self.num_traces = 0  # one per stage size used
        self.num_batches = 0
        self.num_rows = 0
        self.inference_s = 0.0
        # Compile the largest bucket now: a bad policy fails here, not in a request.
        self._get_compiled(self._buckets[-1])
        self._thread = threading.Thread(target=self._loop, name="jaxrunner-batcher", daemon=True)
        self._thread.start()

    def submit(
        self,
        rows: list[Row],
        on_done: Callable[[list[RowResult]], Any],
        on_abort: Callable[[BaseException | None], Any] | None = None,
    ) -> concurrent.futures.Future:
        """Queues ``rows``; in the batcher's thread either the future resolves to
        ``on_done(results)``, or ``on_abort`` runs: with None if the waiter cancelled
        it, else with the error."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        request = _Request(rows, on_done, on_abort, future, [None] * len(rows), 0, len(rows))
        with self._cond:
            if self._closed:
                raise ClosedError("the policy batcher is closed; no more actions can be computed.")
            self._queue.append(request)
            self._queued_rows += len(rows)
            self._cond.notify()
        return future

    def set_params(self, params: Params, what: str) -> int:
        """Swaps the params for the next batch (never recompiles); returns their version."""
        device = put_params(params, what, like=self._params)
        with self._cond:
            self._params = device
            self._params_version += 1
            return self._params_version

    def get_params(self) -> tuple[Params, int]:
        """The current params and their version (0 for the initial ones)."""
        with self._cond:
            return self._params, self._params_version

    def close(self) -> None:
        """Stops the thread; queued requests fail with ``ClosedError`` (without the lock:
        on_abort takes the env's lock)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()  # the queue is this thread's now: submit refuses
        error = ClosedError("the external env was closed before this action was computed.")
        while self._queue:
            self._finish(self._queue.popleft(), error)

    def _loop(self) -> None:
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            self._run_batch(batch)

    def _take_batch(self) -> list[tuple[_Request, int]] | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if self._closed:
                return None  # close() fails the queued requests
            deadline = time.monotonic() + self._max_wait_s
            while self._queued_rows < self._max_batch and not self._closed:
                if self._ready_hint is not None and self._queued_rows >= self._ready_hint():
                    break  # every row that could come is here: waiting gains nothing
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            batch: list[tuple[_Request, int]] = []
            while self._queue and len(batch) < self._max_batch:
                request = self._queue[0]
                count = min(len(request.rows) - request.taken, self._max_batch - len(batch))
                batch.extend((request, request.taken + j) for j in range(count))
                request.taken += count
                if request.taken == len(request.rows):
                    self._queue.popleft()
            self._queued_rows -= len(batch)
            return batch

    def _run_batch(self, batch: list[tuple[_Request, int]]) -> None:
        try:
            results = self._compute([request.rows[i] for request, i in batch])
        except Exception as err:  # a policy failure fails its requests, not the server
            for request in {id(r): r for r, _ in batch}.values():
                self._finish(request, err)
            return
        for (request, i), result in zip(batch, results):
            request.results[i] = result
            request.remaining -= 1
            if request.remaining == 0:
                self._finish(request, None)

    def _finish(self, request: _Request, error: BaseException | None) -> None:
        """Ends ``request`` with ``error``, or with its on_done's value."""
        if request.finished:
            return
        request.finished = True
        # Running only now: until here its waiter could cancel it.
        if not request.future.set_running_or_notify_cancel():
            self._abort(request, None)
        elif error is not None:
            self._abort(request, error)
            request.future.set_exception(error)
        else:
            try:
                value = request.on_done(request.results)  # type: ignore[arg-type]
            except Exception as err:
                request.future.set_exception(err)
            else:
                request.future.set_result(value)

    @staticmethod
    def _abort(request: _Request, error: BaseException | None) -> None:
        if request.on_abort is None:
            return
        try:
            request.on_abort(error)
        except Exception:  # the batcher thread must live on
            logger.exception("on_abort of a policy request raised")

    def _compute(self, rows: list[Row]) -> list[RowResult]:
        started = time.perf_counter()
        size = next(b for b in self._buckets if b >= len(rows))
        step, in_packing, out_packing, stage = self._get_compiled(size)
        obs, given, logged, id_hi, id_lo, steps, carry, count = in_packing.host_views(stage)
        logged[:] = False
        count[...] = len(rows)  # the rows after them (stale host data) are padding
        for i, row in enumerate(rows):
            space_arrays.copy_into(self._obs_space, obs, row.obs, i)
            if row.action is not None:
                space_arrays.copy_into(self._action_space, given, row.action, i)
                logged[i] = True
            id_hi[i], id_lo[i] = row.episode_id >> 32, row.episode_id & 0xFFFFFFFF
            steps[i] = row.step
            for dst, src in zip(jax.tree.leaves(carry), jax.tree.leaves(row.carry)):
                dst[i] = src
        with self._cond:
            params = self._params
        host = np.asarray(jax.device_get(step(params, jax.device_put(stage))))
        action, extras, new_carry = out_packing.host_views(host)
        action = space_arrays.as_space_dtypes(self._action_space, action)
        results: list[RowResult] = [
            (
                space_arrays.take(self._action_space, action, i),
                {k: np.array(v[i]) for k, v in extras.items()},
                None
                if new_carry is None
                else jax.tree.map(lambda c, i=i: np.array(c[i]), new_carry),
            )
            for i in range(len(rows))
        ]
        self.num_batches += 1
        self.num_rows += len(rows)
        self.inference_s += time.perf_counter() - started
        return results

    def _get_compiled(self, bucket: int) -> tuple[Callable, Packing, Packing, np.ndarray]:
        """The compiled step for ``bucket`` rows, on a stage of whole chunks."""
        size = -(-bucket // self._chunk_rows) * self._chunk_rows
        if size in self._compiled:
            return self._compiled[size]
        policy, action_space = self._policy, self._action_space
        carry = policy.batched_carry(size)
        in_example = (
            space_arrays.allocate(self._obs_space, (size,)),
            space_arrays.allocate(action_space, (size,)),
            np.zeros(size, np.bool_),
            np.zeros(size, np.uint32),
            np.zeros(size, np.uint32),
            np.zeros(size, np.uint32),
            None if carry is None else jax.tree.map(np.asarray, carry),
            np.zeros((), np.int32),
        )
        seed = self._seed
        apply = chunked_apply(policy.apply_fn, self._chunk_rows, self._max_batch)
        log_prob = None
        if policy.log_prob_fn is not None:  # same signature: (params, obs, carry, rows)
            log_prob = chunked_apply(policy.log_prob_fn, self._chunk_rows, self._max_batch)

        def step(params: Params, inputs: Any) -> tuple[Any]:
            self.num_traces += 1  # runs only while tracing: counts compiles
            obs, given, logged, id_hi, id_lo, steps, carry, count = inputs

            def key_of(hi: jax.Array, lo: jax.Array, t: jax.Array) -> jax.Array:
                key = jax.random.fold_in(keys.key(seed), hi)
                return jax.random.fold_in(jax.random.fold_in(key, lo), t)

            row_keys = jax.vmap(key_of)(id_hi, id_lo, steps)
            out = apply(params, obs, carry, row_keys, count)
            action, extras, new_carry = apply_output(out, carry, size)

            def choose(sampled: jax.Array, taken: jax.Array) -> jax.Array:
                mask = logged.reshape(-1, *([1] * (sampled.ndim - 1)))
                return jnp.where(mask, taken.astype(sampled.dtype), sampled)

            action = jax.tree.map(choose, action, given)
            extras = dict(extras)
            if "log_prob" in extras:
                if log_prob is not None:
                    taken_lp = log_prob(params, obs, carry, action, count)
                else:  # no way to score a given action: mark it, never invent one
                    taken_lp = jnp.full_like(extras["log_prob"], jnp.nan)
                extras["log_prob"] = jnp.where(logged, taken_lp, extras["log_prob"])
            return ((action, extras, new_carry),)

        program = compile_packed(step, (self._params,), in_example)
        space_arrays.check_policy_actions(self._action_space, program.output_spec[0], size)
        compiled = lambda params, stage: program.run(params, stage)[0]  # noqa: E731
        entry = (compiled, program.inputs, program.outputs, program.inputs.allocate())
        self._compiled[size] = entry
        return entry
