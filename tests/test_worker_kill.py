"""A worker is killed by its pid, whatever its multiprocessing handle says (issue 16, defect 5)."""

from __future__ import annotations

import multiprocessing.forkserver
import os
import signal
import time

import gymnasium
import pytest

import jaxrunner as jr
from jaxrunner._src.backends import factories
from jaxrunner._src.backends.factories import close_kind_probe


class HangsInClose(gymnasium.Wrapper):
    """A sub-env whose ``close()`` never returns: its worker hangs when told to close."""

    def close(self) -> None:
        while True:
            time.sleep(0.05)


def hangs_in_close() -> gymnasium.Env:
    return HangsInClose(gymnasium.make("CartPole-v1"))


def _running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_hung_workers_die_on_close_after_the_fork_server_died(monkeypatch):
    config = jr.ProcessConfig(num_workers=2)
    # A kind probe built here (ray, or a main-process share) whose close hangs is left
    # on its thread; backend="process" builds none here: the workers report the kind.
    # Its wait shortened from 2 s: the probe's close never returns, however long.
    monkeypatch.setattr(factories, "KIND_PROBE_CLOSE_S", 0.2)
    with pytest.warns(RuntimeWarning, match="did not close within"):
        close_kind_probe(hangs_in_close())
    envs = jr.make_vec(hangs_in_close, 2, backend="process", config=config)
    envs.reset(seed=0)
    pids = envs.worker_pids
    assert all(_running(pid) for pid in pids)
    fork_server = multiprocessing.forkserver._forkserver
    os.kill(fork_server._forkserver_pid, signal.SIGKILL)
    # Reaps it and forgets it (the stdlib's own test hook), so that later tests start a
    # new one instead of failing on a pid already reaped.
    fork_server._stop()
    # Popen.poll now answers 255 for the live workers: the old code believed them dead.
    envs.close()
    deadline = time.monotonic() + 2.0
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.01)  # init reaps the orphans
    alive = [pid for pid in pids if _running(pid)]
    for pid in alive:  # never leave them behind, even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"workers {alive} outlived close()"
