"""The worker process of ``backend="process"``: owns a block of sub-envs.

Each worker owns the sub-envs ``[offset, offset + len(envs))`` and one Unix socket
to the main process, on which it answers commands (:mod:`.wire`) in order. Step
data goes through the shared block (:mod:`.shared`), never the socket.

Restarts: with a restart policy (``set_restart_policy``), a sub-env that raises or
returns an invalid step is recreated here from its factory (:mod:`jaxrunner.faults`),
as the sync backend does. A worker that dies or hangs is the main process's to
replace; to tell which steps a dying worker had done, the worker marks each sub-env's
progress in the shared ``status`` array (``NOT_RUN`` -> ``RUNNING`` -> ``DONE``).

A worker ends when told to close, and on its own when the main process goes away
(its socket reaches EOF), so it never outlives the main process. This is the module
the fork server preloads: it must not start JAX.
"""

from __future__ import annotations

import mmap
import os
import pickle
import socket
from collections.abc import Callable
from typing import Any

import gymnasium

from jaxrunner import spaces as jr_spaces
from jaxrunner.envs.process.shared import DONE, RUNNING, Layout, Views, fail_slot
from jaxrunner.envs.process.wire import (
    COMMAND,
    OP_MEMORY,
    OP_STEP,
    REPLY,
    START_REPORT_SEQ,
    STATUS_ERROR,
    STATUS_OK,
    RemoteError,
    recv_exact,
)
from jaxrunner.errors import EnvError, JaxRunnerError
from jaxrunner.faults import RestartPolicy, recreate
from jaxrunner.spaces import check_flag, check_info, check_reward


class _EnvFailed(Exception):
    """Internal: a sub-env raised; carries where."""

    def __init__(self, env_index: int, call: str) -> None:
        self.env_index, self.call = env_index, call


class Worker:
    """Owns sub-envs ``[offset, offset + len(envs))`` and answers the main process."""

    def __init__(
        self,
        sock: socket.socket,
        offset: int,
        envs: list[gymnasium.Env],
        fns: list[Callable[[], gymnasium.Env]] | None = None,
    ) -> None:
        self.sock, self.offset, self.envs = sock, offset, envs
        self.fns = fns or []
        self.policy: RestartPolicy | None = None
        self.views: Views | None = None
        self._memory: mmap.mmap | None = None

    # -- setup

    def attach(self, fd: int, layout: Layout) -> None:
        self._memory = mmap.mmap(fd, layout.nbytes)
        os.close(fd)
        self.views = v = layout.views(self._memory)
        self.obs_space = layout.observation_space
        self.write_obs = jr_spaces.make_writer(self.obs_space, v.obs)
        self.write_next_obs = jr_spaces.make_writer(self.obs_space, v.next_obs)
        self.get_action = _action_getter(layout.action_space, v.action)
        self.status = memoryview(v.status)  # faster item writes than numpy's

    def set_restart_policy(self, policy: RestartPolicy | None) -> None:
        self.policy = policy

    # -- commands

    def step(self, lo: int, hi: int) -> tuple[Any, ...]:
        """Steps envs ``[lo, hi)`` (SAME_STEP autoreset), exactly as the sync backend
        does; returns the non-empty step and reset infos by env index and, when some
        sub-env failed and was restarted (restart policy set), the failed step indices
        and every failure (step or autoreset) as :class:`RemoteError`."""
        v: Views = self.views  # type: ignore[assignment]  # attached before any step
        reward, terminated, truncated = v.reward, v.terminated, v.truncated
        write_next_obs, get_action, envs, offset = (
            self.write_next_obs,
            self.get_action,
            self.envs,
            self.offset,
        )
        status, policy = self.status, self.policy
        infos: dict[int, dict] = {}
        ended: list[int] = []
        errors: dict[int, BaseException] = {}
        for i in range(lo, hi):
            status[i] = RUNNING
            try:
                obs, r, term, trunc, info = envs[i - offset].step(get_action(i))
            except Exception as err:
                if policy is None:
                    raise _EnvFailed(i, "step") from err
                errors[i] = err
                continue
            try:
                write_next_obs(i, obs)
                # r - r == 0 is False for NaN and inf: checked before the step is DONE.
                reward[i] = r if type(r) is float and r - r == 0.0 else check_reward(r, i)
                terminated[i] = term if type(term) is bool else check_flag(term, i, "terminated")
                truncated[i] = trunc if type(trunc) is bool else check_flag(trunc, i, "truncated")
                if type(info) is not dict:
                    check_info(info, i, "step")
            except JaxRunnerError as err:
                if policy is None:
                    raise
                errors[i] = err
                continue
            if info:
                infos[i] = info
            if term or trunc:
                ended.append(i)
            status[i] = DONE
        failed = list(errors)
        for i in failed:
            self._restart(i, errors[i], failed_step=True)
        part = slice(lo, hi)
        space = self.obs_space
        jr_spaces.copy_into(space, v.obs, jr_spaces.rows(space, v.next_obs, part), part)
        reset_infos = {}
        for i in ended:
            try:
                info = self._reset_one(i, None, None)
            except (_EnvFailed, JaxRunnerError) as err:
                if policy is None:
                    raise
                errors[i] = cause = _env_cause(err)
                info = self._restart(i, cause, failed_step=False)
            if info:
                reset_infos[i] = info
        if errors:
            remote = {
                i: RemoteError.capture(err, "env", i, "step" if i in failed else "reset")
                for i, err in errors.items()
            }
            return infos, reset_infos, failed, remote
        return infos, reset_infos

    def _restart(self, i: int, cause: BaseException, failed_step: bool) -> dict:
        """Replaces sub-env ``i`` by a new, reset one (as the sync backend does); for a
        failed step, its slot then holds the new env's first obs, reward 0, no flags."""
        assert self.policy is not None  # internal: only called with a policy
        j = i - self.offset
        self.envs[j], info = recreate(
            self.envs[j], self.fns[j], i, self.policy, cause, self.write_obs
        )
        if failed_step:
            fail_slot(self.views, self.obs_space, i)  # type: ignore[arg-type]
        return info

    def _reset_one(self, i: int, seed: int | None, options: dict[str, Any] | None) -> dict:
        try:
            obs, info = self.envs[i - self.offset].reset(seed=seed, options=options)
        except Exception as err:
            raise _EnvFailed(i, "reset") from err
        self.write_obs(i, obs)
        return check_info(info, i, "reset")

    def reset(self, seeds: list[int | None], options: dict[str, Any] | None) -> list[dict]:
        infos = []
        for j, seed in enumerate(seeds):
            i = self.offset + j
            try:
                infos.append(self._reset_one(i, seed, options))
            except (_EnvFailed, JaxRunnerError) as err:
                if self.policy is None:
                    raise
                infos.append(self._restart(i, _env_cause(err), failed_step=False))
        return infos

    def reset_at(self, index: int, seed: int | None, options: dict[str, Any] | None) -> dict:
        return self._reset_one(index, seed, options)

    def call(self, name: str, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        results = []
        for env in self.envs:
            attr = env.get_wrapper_attr(name)
            results.append(attr(*args, **kwargs) if callable(attr) else attr)
        return results

    def get_attr(self, name: str) -> list[Any]:
        return [env.get_wrapper_attr(name) for env in self.envs]

    def set_attr(self, name: str, values: list[Any]) -> None:
        for env, value in zip(self.envs, values):
            env.set_wrapper_attr(name, value)

    def render(self) -> list[Any]:
        return [env.render() for env in self.envs]

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []

    # -- the loop

    def reply(self, seq: int, status: int, payload: bytes = b"") -> None:
        self.sock.sendall(REPLY.pack(seq, status, len(payload)) + payload)

    def error(self, seq: int, err: BaseException) -> None:
        if isinstance(err, EnvError) and hasattr(err, "recreation_error"):
            remote = RemoteError.capture_recreation(err)
        elif isinstance(err, _EnvFailed):
            remote = RemoteError.capture(err.__cause__, "env", err.env_index, err.call)  # type: ignore[arg-type]
        elif isinstance(err, JaxRunnerError):
            remote = RemoteError.capture(err, "check", getattr(err, "env_index", -1), "")
        else:
            remote = RemoteError.capture(err, "worker", -1, "")
        self.reply(seq, STATUS_ERROR, pickle.dumps(remote))

    def serve(self) -> None:
        """Answers commands until told to close or the main process goes away."""
        sock, step, reply = self.sock, self.step, self.reply
        header_size = COMMAND.size
        dumps = pickle.dumps
        while True:
            try:
                header = recv_exact(sock, header_size)
            except (EOFError, OSError):
                return  # the main process is gone
            op, seq, lo, hi, length = COMMAND.unpack(header)
            try:
                if op == OP_STEP:
                    result = step(lo, hi)
                    if result[0] or result[1] or len(result) > 2:
                        reply(seq, STATUS_OK, dumps(result, protocol=5))
                    else:
                        reply(seq, STATUS_OK)
                    continue
                payload = recv_exact(sock, length) if length else b""
                if op == OP_MEMORY:
                    layout = pickle.loads(payload)
                    _, fds, _, _ = socket.recv_fds(sock, 1, 1)
                    self.attach(fds[0], layout)
                    reply(seq, STATUS_OK)
                    continue
                method, args = pickle.loads(payload)
                result = getattr(self, method)(*args)
                reply(seq, STATUS_OK, dumps(result, protocol=5))
                if method == "close":
                    return
            except (EOFError, BrokenPipeError, ConnectionResetError):
                return
            except Exception as err:
                self.error(seq, err)


def _action_getter(space: gymnasium.Space, buffer: Any) -> Callable[[int], Any]:
    """``get(i)``: sub-env ``i``'s action, copied out of the shared buffer (an env may
    keep it), as a numpy scalar or array of the action space's dtype."""
    if isinstance(space, (gymnasium.spaces.Dict, gymnasium.spaces.Tuple)):
        return lambda i: jr_spaces.take(space, buffer, i)
    if buffer.ndim == 1:
        return buffer.__getitem__  # numpy scalars are copies
    return lambda i: buffer[i].copy()


def _env_cause(err: BaseException) -> BaseException:
    """The sub-env's own exception behind an internal :class:`_EnvFailed`."""
    return err.__cause__ if isinstance(err, _EnvFailed) and err.__cause__ else err


def build_envs(fns: list[Callable[[], gymnasium.Env]], offset: int) -> list[gymnasium.Env]:
    """Calls the factories; on failure closes what it built."""
    envs: list[gymnasium.Env] = []
    try:
        for j, fn in enumerate(fns):
            try:
                envs.append(fn())
            except Exception as err:
                raise _EnvFailed(offset + j, "factory") from err
    except BaseException:
        for env in envs:
            env.close()
        raise
    return envs


def worker_main(sock: socket.socket, offset: int, payload: bytes) -> None:
    """The worker process's entry point: builds the envs, reports their spaces and
    metadata, then serves commands."""
    worker = Worker(sock, offset, [])
    try:
        worker.fns = pickle.loads(payload)
        worker.envs = build_envs(worker.fns, offset)
        first = worker.envs[0]
        info = {
            "spaces": [(env.observation_space, env.action_space) for env in worker.envs],
            "metadata": first.metadata,
            "render_mode": first.render_mode,
        }
        worker.reply(START_REPORT_SEQ, STATUS_OK, pickle.dumps(info))
    except BaseException as err:
        worker.error(START_REPORT_SEQ, err)
        sock.close()
        return
    try:
        worker.serve()
    finally:
        worker.close()
        sock.close()
