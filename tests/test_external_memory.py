"""ExternalEnv's memory budget under concurrency, and the cost of ending episodes
(issue 30, items 8, 11 and 12)."""

from __future__ import annotations

import threading
import time
import tracemalloc
import weakref

import numpy as np
import pytest
from external_helpers import ACTION_SPACE, OBS_SPACE, make_external
from gated_policy import GatedPolicy

import jaxrunner.errors as errors
from jaxrunner._src import space_arrays
from jaxrunner._src.services.external.episodes import AgentRecord
from jaxrunner._src.services.external.memory import AGENT_RECORD_BYTES, episode_nbytes

OBS = np.zeros(4, np.float32)


# -- item 11: concurrent calls reserve before anything is computed ---------------------------


def test_concurrent_calls_never_overshoot_the_budget():
    budget = 20_000 + 64 * AGENT_RECORD_BYTES  # about 25 CartPole steps, 64 live episodes
    with make_external(max_memory_bytes=budget, max_concurrent=64) as env:
        gated = GatedPolicy(env)
        ids = [env.start_episode() for _ in range(64)]
        gated.gate.clear()  # every call is admitted before any step is recorded
        futures, refused = [], 0
        for eid in ids:
            try:
                futures.append(env.submit_action(eid, OBS))
            except errors.MemoryLimitError:
                refused += 1
        gated.gate.set()
        for future in futures:
            future.result(timeout=30)
        metrics = env.get_metrics()
        assert futures and refused > 0
        assert metrics["memory_bytes"] <= budget
        for eid in ids:
            env.end_episode(eid, OBS)
        assert env.get_metrics()["num_env_steps"] == len(futures)  # each admitted call recorded
        env.poll_episodes()
        assert env.get_metrics()["memory_bytes"] == 0  # every reservation settled


def test_refused_and_failed_calls_give_their_reservation_back():
    with make_external() as env:
        gated = GatedPolicy(env)
        eid = env.start_episode()
        gated.fail = 1
        with pytest.raises(FloatingPointError):
            env.get_action(eid, OBS)
        assert env.get_metrics()["memory_bytes"] == AGENT_RECORD_BYTES  # the live record only
        env.get_action(eid, OBS)
        used = env.get_metrics()["memory_bytes"]
        assert env._memory.reserved == 0 and used == env._memory.live > 0


# -- item 12: a finished episode is charged what it really holds -----------------------------


def _closed_record(episode_id: int, steps: int) -> AgentRecord:
    live = AgentRecord(episode_id, 0, True, None)
    for t in range(steps):
        extras = {"log_prob": np.array(0.0, np.float32), "value": np.array(0.0, np.float32)}
        live.record(np.zeros(4, np.float32), np.array(1, np.int64), extras, None, t)
        live.pending_reward += 1.0
    live.close_at(np.zeros(4, np.float32))
    return live


@pytest.mark.parametrize("steps", [1, 3, 20])
def test_short_finished_episodes_are_charged_at_least_what_they_hold(steps):
    records = [_closed_record(i, steps) for i in range(2000)]
    tracemalloc.start()
    try:
        episodes = [
            r.to_episode(OBS_SPACE, ACTION_SPACE, terminated=True, truncated=False) for r in records
        ]
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    charged = sum(episode_nbytes(e) for e in episodes)
    # Within a quarter of what tracemalloc sees (numpy's small-block cache blurs it).
    assert 0.8 * held <= charged <= 1.25 * held


# -- item 8: ending an episode stacks it off the lock and releases rows as it goes ----------


def test_end_episode_stacks_without_the_lock(monkeypatch):
    with make_external() as env:
        eid = env.start_episode()
        for _ in range(5):
            env.get_action(eid, OBS)
        lock_free_while_stacking = []
        to_episode = AgentRecord.to_episode

        def probing(self, *args, **kwargs):
            free = env._lock.acquire(blocking=False)
            if free:
                env._lock.release()
            lock_free_while_stacking.append(free)
            return to_episode(self, *args, **kwargs)

        monkeypatch.setattr(AgentRecord, "to_episode", probing)
        env.end_episode(eid, OBS)
        assert lock_free_while_stacking == [True]
        (episode,) = env.poll_episodes()
        assert episode.length == 5 and episode.obs.shape == (6, 4)


def test_stacking_an_episode_releases_each_row_once_copied():
    record = _closed_record(0, 50)
    alive = []
    original = list(record.obs)
    probes = [weakref.ref(row) for row in original]
    del original
    copy_into = space_arrays.copy_into
    calls = [0]

    def watching(space, dst, src, index=slice(None)):
        if space is OBS_SPACE:  # rows before this one were copied: none may be alive
            alive.append(sum(probe() is not None for probe in probes[: calls[0]]))
            calls[0] += 1
        copy_into(space, dst, src, index)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(space_arrays, "copy_into", watching)
        episode = record.to_episode(OBS_SPACE, ACTION_SPACE, terminated=True, truncated=False)
    assert calls[0] == 51 and alive == [0] * 51
    assert episode.obs.shape == (51, 4) and episode.action.shape == (50,)
    assert record.obs == [] and record.actions == []


def test_stacking_hands_freed_rows_back_to_the_os_as_it_goes(monkeypatch):
    # Freed rows stay resident in the C heap unless trimmed: without the trims the
    # stacked copy doubled an ending episode's memory (benchmarks/serve_episode_end.py).
    from jaxrunner._src.services.external import episodes

    trims = []
    monkeypatch.setattr(episodes, "TRIM_EVERY_BYTES", 10 * OBS.nbytes)
    monkeypatch.setattr(episodes, "release_freed_memory", lambda: trims.append(1))
    record = _closed_record(0, 50)
    record.to_episode(OBS_SPACE, ACTION_SPACE, terminated=True, truncated=False)
    rows_per_trim = 10 * OBS.nbytes // (OBS.nbytes + 112)  # a row's bytes with its object
    assert len(trims) >= 51 // (rows_per_trim + 1)  # the 51 observations, in runs


def test_concurrent_ends_and_reaping_count_every_step_once():
    with make_external(max_concurrent=64) as env:
        ids = [env.start_episode() for _ in range(32)]
        for eid in ids:  # the first 16 go idle first: only they are reaped below
            for _ in range(3):
                env.get_action(eid, OBS)
            if eid == ids[15]:
                time.sleep(0.01)
                cut = time.monotonic()
        threads = [threading.Thread(target=env.end_episode, args=(e, OBS)) for e in ids[16:]]
        for thread in threads:
            thread.start()
        assert env.reap(cut) == 16
        for thread in threads:
            thread.join()
        metrics = env.get_metrics()
        assert metrics["num_env_steps"] == 16 * 3 + 16 * 2  # reaping drops the pending step
        assert metrics["num_dropped_steps"] == 16 and metrics["num_live_episodes"] == 0
        assert sum(e.length for e in env.poll_episodes()) == 16 * 3 + 16 * 2
