"""EpisodeBook: episode ids, steps, returns and counts against a step-by-step reference."""

from __future__ import annotations

import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrunner._src.samplers.episode_ids import EpisodeBook


class StepByStep:
    """The numbering rule, one step and one env at a time: an episode ends where the
    env ended it or a step failed; the next one takes the next id, in (step, env)
    order; failed steps end their episode without counting it. A reset slot (``resets``:
    the env's own reset step after an end) belongs to the next episode as its step -1
    and ends nothing."""

    def __init__(self, num_envs: int) -> None:
        self.ids = list(range(num_envs))
        self.next_id = num_envs
        self.length = [0] * num_envs
        self.ret = [0.0] * num_envs

    def close(self, flags: types.SimpleNamespace, t: int, resets: np.ndarray | None = None):
        ids, steps, returns, lengths = [], [], [], []
        for k in range(t):
            ids.append(list(self.ids))
            steps.append(list(self.length))
            for b in range(len(self.ids)):
                if resets is not None and resets[k, b]:
                    steps[-1][b] = -1
                    continue
                self.ret[b] += float(flags.reward[k, b])
                self.length[b] += 1
                valid = flags.valid[k, b]
                if flags.terminated[k, b] or flags.truncated[k, b] or not valid:
                    if valid:
                        returns.append(self.ret[b])
                        lengths.append(self.length[b])
                    self.ids[b], self.next_id = self.next_id, self.next_id + 1
                    self.length[b], self.ret[b] = 0, 0.0
        return np.array(ids), np.array(steps), returns, lengths


def _buffers(rng: np.random.Generator, t: int, num_envs: int, fault_rate: float):
    shape = (t, num_envs)
    return types.SimpleNamespace(
        terminated=rng.random(shape) < 0.2,
        truncated=rng.random(shape) < 0.05,
        valid=rng.random(shape) >= fault_rate,
        reward=rng.integers(-3, 4, shape).astype(np.float32),
        episode_id=np.full(shape, -1, np.int64),
        step=np.full(shape, -1, np.int64),
    )


@settings(max_examples=40, deadline=None)
@given(
    num_envs=st.integers(1, 6),
    lengths=st.lists(st.integers(1, 7), min_size=1, max_size=4),
    fault_rate=st.sampled_from([0.0, 0.1]),
    seed=st.integers(0, 2**16),
)
def test_close_matches_the_step_by_step_rule(num_envs, lengths, fault_rate, seed):
    rng = np.random.default_rng(seed)
    book, reference = EpisodeBook(num_envs), StepByStep(num_envs)
    for t in lengths:  # several samples: episodes carry over from one to the next
        buf = _buffers(rng, t + 1, num_envs, fault_rate)  # a row past t stays unclosed
        counts = book.close(buf, t)
        ids, steps, returns, ended_lengths = reference.close(buf, t)
        np.testing.assert_array_equal(buf.episode_id[:t], ids)
        np.testing.assert_array_equal(buf.step[:t], steps)
        assert (buf.episode_id[t] == -1).all() and (buf.step[t] == -1).all()
        np.testing.assert_array_equal(counts.returns, returns)  # integer rewards: exact
        np.testing.assert_array_equal(counts.lengths, ended_lengths)
        failed = t * num_envs - int(buf.valid[:t].sum())
        assert counts.num_env_steps == t * num_envs - failed
        assert counts.num_faulty_episodes == failed
    np.testing.assert_array_equal(book.episode_id, reference.ids)
    assert book.next_episode_id == reference.next_id


@pytest.mark.parametrize("ends", ["none", "last step only"])
def test_close_where_episodes_end_only_at_the_last_step_matches_the_rule(ends):
    """Samples whose episodes run on, or end only at their last step (every sample of
    rollout length 1), take close()'s shortcut and still follow the rule."""
    rng = np.random.default_rng(7)
    book, reference = EpisodeBook(5), StepByStep(5)
    for t in (1, 3, 1, 4, 2):
        buf = _buffers(rng, t, 5, 0.0)
        buf.terminated[: t - 1] = buf.truncated[: t - 1] = False
        if ends == "none":
            buf.terminated[-1] = buf.truncated[-1] = False
        buf.reward = rng.normal(size=(t, 5)) * 1e3  # float rewards (the others: integers)
        counts = book.close(buf, t)
        ids, steps, returns, ended_lengths = reference.close(buf, t)
        np.testing.assert_array_equal(buf.episode_id, ids)
        np.testing.assert_array_equal(buf.step, steps)
        np.testing.assert_allclose(counts.returns, returns, rtol=1e-12)
        np.testing.assert_array_equal(counts.lengths, ended_lengths)
        assert counts.num_env_steps == t * 5
    np.testing.assert_array_equal(book.episode_id, reference.ids)
    assert book.next_episode_id == reference.next_id


def _buffers_with_resets(
    rng: np.random.Generator, t: int, num_envs: int, fault_rate: float, ended: np.ndarray
):
    """Like :func:`_buffers`, where each env's step after an end (``ended``: the envs
    that ended at the last step before these) is a reset slot: valid False, reward 0,
    both flags False. Returns the buffers and the reset mask."""
    buf = _buffers(rng, t, num_envs, fault_rate)
    resets = np.zeros((t, num_envs), np.bool_)
    for k in range(t):
        resets[k] = ended
        for name in ("terminated", "truncated", "valid"):
            getattr(buf, name)[k][ended] = False
        buf.reward[k][ended] = 0
        ended = (buf.terminated[k] | buf.truncated[k]) & buf.valid[k]
    return buf, resets, ended


@settings(max_examples=40, deadline=None)
@given(
    num_envs=st.integers(1, 6),
    lengths=st.lists(st.integers(1, 7), min_size=1, max_size=4),
    fault_rate=st.sampled_from([0.0, 0.1]),
    seed=st.integers(0, 2**16),
)
def test_close_with_reset_slots_matches_the_step_by_step_rule(num_envs, lengths, fault_rate, seed):
    """Reset slots (EnvPool's keep_reset_steps): no fault, no transition, step -1 of the
    next episode, across samples and through get_state/set_state."""
    rng = np.random.default_rng(seed)
    book, reference = EpisodeBook(num_envs), StepByStep(num_envs)
    ended = np.zeros(num_envs, np.bool_)
    for t in lengths:
        buf, resets, ended = _buffers_with_resets(rng, t, num_envs, fault_rate, ended)
        counts = book.close(buf, t, resets)
        ids, steps, returns, ended_lengths = reference.close(buf, t, resets)
        np.testing.assert_array_equal(buf.episode_id[:t], ids)
        np.testing.assert_array_equal(buf.step[:t], steps)
        np.testing.assert_array_equal(counts.returns, returns)
        np.testing.assert_array_equal(counts.lengths, ended_lengths)
        invalid = t * num_envs - int(buf.valid[:t].sum())
        failed = invalid - int(resets.sum())
        assert counts.num_env_steps == t * num_envs - invalid
        assert counts.num_faulty_episodes == failed
        state, book = book.get_state(), EpisodeBook(num_envs)
        book.set_state(state)
    np.testing.assert_array_equal(book.episode_id, reference.ids)
    assert book.next_episode_id == reference.next_id
