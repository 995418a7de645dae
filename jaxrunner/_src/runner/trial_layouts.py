"""The layouts ``EnvRunner.from_env``'s trial times, and how it picks one from their
rates. See docs/backends/index.md."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping
from typing import Any

from jaxrunner._src.backends.auto import MIN_WORK_US, LayoutChoice
from jaxrunner._src.backends.process.launch import default_num_workers

TRIAL_ROUNDS = 5
"""Timings per candidate, interleaved, after a warm-up; each one's fastest counts (other
work slows samples, never speeds them up), but EnvPool's median (:func:`trial_rates`;
docs/backends/index.md)."""
CLOSE = 1.10
"""Where the fastest process layout and sync are within this factor after
:data:`TRIAL_ROUNDS`, as many rounds again are timed."""
DROP_AFTER = 2
"""Rounds after which the trial stops timing the layouts far behind (:func:`in_the_running`)."""
DROP_BEHIND = 1.5
"""A layout whose rate (:func:`trial_rates`) is this many times below the fastest one's is
out of the running: its timings so far stand in the pick (on 2 cores a layout's ratio to
another moved by 5-15% from trial to trial)."""
SYNC_TIE = 1.05
"""Workers must beat sync by this factor to be chosen: on a near tie the simpler
layout, with no processes to start, wins (and among workers, the fewer)."""
VARIANT_TIE = CLOSE
"""An EnvPool variant must beat EnvPool at its defaults by this factor to be chosen:
they often differ by less than a trial's noise (HalfCheetah at 8 envs won a trial on
one thread by 5%, then ran 0.90x)."""
ENVPOOL = "envpool"
"""The trial's key of the ``"envpool"`` backend (the others are worker counts, 0 sync)."""
ENVPOOL_VARIANTS = ("envpool_one_thread", "envpool_async", "envpool_pools")
"""The trial's keys of the ``"envpool"`` backend beyond its defaults (:func:`envpool_options`):
cheap envs can step faster on one thread (no step handed between threads); async mode on
a thread fewer than the CPUs, and two pools of one thread each (a split each, in sync
mode's order), overlap the policy with other envs stepping."""
ENVPOOL_KEYS = (ENVPOOL, *ENVPOOL_VARIANTS)
"""Every trial key of the ``"envpool"`` backend."""
WORKERS_TRIED_FROM_US = MIN_WORK_US / 4
"""Env work per vector step from which the trial times a worker where the env-only rule
keeps sync: the policy's cost moves the line, which the rule drew without one (on 2
cores, one worker ran 1.14x sync at 16 CartPoles, 78 us of work, with the benchmark
MLP, and 0.88x at 8: docs/backends/index.md)."""
SHARE = "share"
"""The trial's key of the process layout whose main process steps a share of the sub-envs
as one more worker (:func:`share_layout`): every CPU steps envs, while the policy of one
split computes as the other's step; it must win by :data:`VARIANT_TIE`, since those
sub-envs lose a worker's isolation (as sync's do)."""


def envpool_variants(
    num_envs: int, cpus: int, ready_first: bool = True, pools: bool = True
) -> list[str]:
    """The :data:`ENVPOOL_VARIANTS` a trial times, where there are 2 CPUs and 2 envs or
    more (EnvPool's own count is then more than one thread, and async mode can overlap);
    async mode where its batches divide the envs and the runner takes ``ready_first``,
    two pools where it takes their splits (``pools``)."""
    batch = envpool_options("envpool_async", num_envs, cpus)["batch_size"]
    skip = {"envpool_async"} if not ready_first or num_envs % batch else set()
    skip |= set() if pools else {"envpool_pools"}
    return [k for k in ENVPOOL_VARIANTS if k not in skip] if min(num_envs, cpus) > 1 else []


def envpool_options(key: str, num_envs: int, cpus: int) -> dict[str, Any]:
    """``make_vec``'s options for EnvPool variant ``key`` (:data:`ENVPOOL`: none) on
    ``cpus`` CPUs: async mode answers ``num_envs // 2`` envs per ``recv``."""
    if key == "envpool_one_thread":
        return {"num_threads": 1}
    if key == "envpool_async":
        batch = max(1, num_envs // 2)
        return {"batch_size": batch, "num_threads": max(1, min(batch, cpus - 1))}
    return {"num_pools": 2, "num_threads": 1} if key == "envpool_pools" else {}


def kept_key(choice: LayoutChoice) -> int | str:
    """The trial's key of ``choice``'s layout: its worker count, :data:`SHARE`, or
    EnvPool's key."""
    if choice.backend != ENVPOOL:
        return SHARE if choice.main_process_envs else choice.num_workers
    options = dict(choice.envpool_options)  # the key whose options these are
    num_envs, cpus = choice.num_envs, choice.cpus
    return next(k for k in ENVPOOL_KEYS if envpool_options(k, num_envs, cpus) == options)


def undecided(times: Mapping[int | str, list[float]]) -> bool:
    """Whether sync's rate (:func:`trial_rates`) and the fastest other layout's are
    within :data:`CLOSE` of each other, either way (False where sync is the only one)."""
    rates = trial_rates(times)
    others = [rate for key, rate in rates.items() if key != 0]
    if not others:
        return False
    sync, best = rates[0], max(others)
    return max(sync, best) <= CLOSE * min(sync, best)


def in_the_running(times: Mapping[int | str, list[float]]) -> list[int | str]:
    """The layouts a trial goes on timing after :data:`DROP_AFTER` rounds: those whose
    rate (:func:`trial_rates`) is within :data:`DROP_BEHIND` of the fastest layout's."""
    rates = trial_rates(times)
    best = max(rates.values())
    return [key for key, rate in rates.items() if DROP_BEHIND * rate >= best]


def trial_rates(times: Mapping[int | str, list[float]]) -> dict[int | str, float]:
    """Each layout's transitions per second from its timings (seconds per transition):
    its fastest, as other work slows a sample and speeds up none; but the median of an
    EnvPool layout's, whose threads step faster in a short burst after they idled (the
    trial's timings) than in a run of samples (on 2 cores, 1.2-1.3x at 32 CartPoles,
    where sync and the process backend showed no such gain)."""
    return {
        k: 1 / (statistics.median(t) if k in ENVPOOL_KEYS else min(t)) for k, t in times.items()
    }


def trial_workers(rule: LayoutChoice, multi_agent: bool = False) -> list[int]:
    """The layouts a trial times, as worker counts (0: sync): sync, the rule's workers,
    and the process backend's default count (a multi-agent env's: every CPU, as its
    main process waits while the workers step)."""
    main = "waits" if multi_agent else "computes"
    default = default_num_workers(rule.num_envs, main_process=main, cpus=rule.cpus)
    return sorted({0, rule.num_workers, default})


def worth_timing(rule: LayoutChoice) -> LayoutChoice:
    """The rule, or where it keeps sync for work from :data:`WORKERS_TRIED_FROM_US` on
    (and a CPU is spare), the rule made one worker for the trial to time."""
    work_us = rule.env_step_us * rule.num_envs  # (NaN where the probe failed: sync)
    if rule.backend != "sync" or rule.cpus < 2 or not work_us >= WORKERS_TRIED_FROM_US:
        return rule
    reason = (
        f"{work_us:,.0f} us of env work per step: under the {MIN_WORK_US:,.0f} us from "
        f"which the rule starts a worker, over the {WORKERS_TRIED_FROM_US:,.0f} us from "
        "which the trial times one"
    )
    return dataclasses.replace(rule, backend="process", num_workers=1, reason=reason)


def share_layout(rule: LayoutChoice) -> tuple[int, int] | None:
    """The :data:`SHARE` layout's workers and main process's share: the rule's workers,
    less one where they leave the main process no CPU, and a share of the sub-envs as
    large as a worker's (``num_envs // (workers + 1)``); None where that is none."""
    workers = max(1, min(rule.num_workers, rule.cpus - 1))
    share = rule.num_envs // (workers + 1)
    return (workers, share) if share else None


def layout_of(rule: LayoutChoice, key: int | str) -> LayoutChoice:
    """The rule's choice made the layout of trial key ``key`` (a worker count or
    :data:`SHARE`)."""
    workers, share = (share_layout(rule) or (0, 0)) if key == SHARE else (int(key), 0)
    backend = "process" if workers else "sync"
    return dataclasses.replace(rule, backend=backend, num_workers=workers, main_process_envs=share)


def pick_layout(
    rule: LayoutChoice, rates: Mapping[int | str, float], *, policy_step_us: float
) -> LayoutChoice:
    """The layout with the most env steps/s in the trial (``rates``, by worker count,
    0 being sync, :data:`SHARE`, :data:`ENVPOOL` and :data:`ENVPOOL_VARIANTS`), where it
    beats sync's by :data:`SYNC_TIE`, else sync (on a tie, the fewer processes; an
    EnvPool variant must beat EnvPool at its defaults, and the share every layout of
    sync and workers alone, by :data:`VARIANT_TIE`); the choice records every rate and
    why."""
    # A variant within VARIANT_TIE of EnvPool's defaults is out of the running (the
    # fastest of the rest wins, which may be workers faster than EnvPool's defaults).
    near = VARIANT_TIE * rates.get(ENVPOOL, 0.0)
    running = [k for k in rates if k not in ENVPOOL_VARIANTS or rates[k] > near]
    if SHARE in rates:  # its sub-envs lose their isolation: past a tie with the others
        if rates[SHARE] <= VARIANT_TIE * max(r for k, r in rates.items() if isinstance(k, int)):
            running.remove(SHARE)
    best = max(running, key=lambda key: (rates[key], -_processes(rule, key)))
    if rates[best] <= SYNC_TIE * rates[0]:
        best = 0
    # sync, the workers by count, the share, then EnvPool at its defaults and its variants
    rank = (SHARE, *ENVPOOL_KEYS)
    order = sorted(rates, key=lambda key: (rank.index(key) + 1 if key in rank else 0, key))
    tried = ", ".join(f"{label(key)} {rates[key]:,.0f}" for key in order)
    chosen = envpool_options(str(best), rule.num_envs, rule.cpus)  # {} but for a variant
    layout = layout_of(rule, 0 if best in ENVPOOL_KEYS else best)
    return dataclasses.replace(
        layout,
        backend=ENVPOOL if best in ENVPOOL_KEYS else layout.backend,
        reason=f"{rule.reason}; tried with the policy (env steps/s): {tried}; kept {label(best)}",
        tried=tuple((key, rates[key]) for key in order if isinstance(key, int)),
        tried_share=rates.get(SHARE),
        tried_envpool=rates.get(ENVPOOL),
        policy_step_us=policy_step_us,
        envpool_options=tuple(chosen.items()),
        tried_envpool_variants=tuple(
            (str(key).removeprefix("envpool_"), rates[key])
            for key in order
            if key in ENVPOOL_VARIANTS
        ),
    )


def _processes(rule: LayoutChoice, key: int | str) -> int:
    """Processes a layout adds (EnvPool's are threads)."""
    return 0 if key in ENVPOOL_KEYS else layout_of(rule, key).num_workers


def label(key: int | str) -> str:
    if key == SHARE:
        return "workers with the main process's share"
    if key in ENVPOOL_KEYS:
        names = {"envpool_one_thread": "envpool on 1 thread", "envpool_async": "envpool async"}
        return names.get(str(key), "envpool in 2 pools" if key == "envpool_pools" else ENVPOOL)
    return "sync" if key == 0 else f"{key} worker{'s' if int(key) > 1 else ''}"
