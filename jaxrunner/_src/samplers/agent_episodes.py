"""Agent episodes of the multi-agent samplers: running returns and lengths, the agent
episodes that ended, each transition's index within its agent episode."""

from __future__ import annotations

import numpy as np

from jaxrunner._src.samplers.episode_ids import accumulate_rows


def agent_episode_ends(
    running_return: np.ndarray,
    running_length: np.ndarray,
    reward: np.ndarray,
    valid: np.ndarray,
    done: np.ndarray,
    t: int,
    aborted: np.ndarray | None = None,
    steps: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Moves each agent's running return and length (``[B, A_g]``, updated in place)
    over steps ``[0, t)`` of ``[T, B, A_g]`` arrays; returns the agent episodes that
    ended there as arrays ``(slot, return, length)``, in (step, env, slot) order. Where
    ``aborted`` (``[T, B]``; None: never) the env's step failed: its agents' episodes
    end there without being returned. ``steps`` (``[T, B, A_g]``; None: not written):
    ``steps[:t]`` gets each valid transition's index within its agent episode (invalid
    slots 0), vectorised over the steps."""
    empty = np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)
    if t == 0:
        return empty
    shape, per_row = running_return.shape, running_return.size
    kept = valid[:t].reshape(t, per_row)
    total = accumulate_rows(np.add, np.where(kept, reward[:t].reshape(t, per_row), 0.0))
    count = accumulate_rows(np.add, kept.astype(np.int64))  # valid transitions up to and at s
    before_r, before_l = running_return.reshape(-1), running_length.reshape(-1)
    ends = kept & done[:t].reshape(t, per_row)
    if aborted is not None:  # a failed env step holds no transition: disjoint from ends
        ends = ends | np.repeat(aborted[:t], shape[1], axis=1)  # env-major agent rows
    if steps is not None:
        # The count where each row's current episode began: -length before the sample,
        # then the count at its latest end before s (counts only grow: a running maximum).
        began = np.where(ends, count, np.iinfo(np.int64).min)
        began = accumulate_rows(np.maximum, np.concatenate([-before_l[None], began[:-1]]))
        steps[:t] = np.where(kept, count - kept - began, 0).reshape(steps[:t].shape)
    step, row = np.nonzero(ends)  # (step, env, slot) order
    new_r, new_l = before_r + total[-1], before_l + count[-1]
    if len(step) == 0:
        running_return[...], running_length[...] = new_r.reshape(shape), new_l.reshape(shape)
        return empty
    at_r, at_l = total[step, row], count[step, row]
    # Each end's previous end in the same row (or the running value before the sample).
    order = np.lexsort((step, row))
    by_row = row[order]
    first = np.ones(len(order), np.bool_)
    first[1:] = by_row[1:] != by_row[:-1]
    prev_r, prev_l = np.empty_like(at_r), np.empty_like(at_l)
    prev_r[order] = np.where(first, -before_r[by_row], np.roll(at_r[order], 1))
    prev_l[order] = np.where(first, -before_l[by_row], np.roll(at_l[order], 1))
    last = order[np.append(by_row[1:] != by_row[:-1], True)]  # each row's last end
    new_r[row[last]] = total[-1, row[last]] - at_r[last]
    new_l[row[last]] = count[-1, row[last]] - at_l[last]
    running_return[...], running_length[...] = new_r.reshape(shape), new_l.reshape(shape)
    good = kept[step, row]  # the aborted ends are faults: not reported
    return row[good] % shape[1], (at_r - prev_r)[good], (at_l - prev_l)[good]
