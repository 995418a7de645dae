"""The metrics of an :class:`~jaxrunner.ExternalEnv` (``get_metrics``)."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

from jaxrunner._src.core.metrics import EpisodeStats
from jaxrunner._src.services.external.batching import PolicyBatcher


def external_metrics(
    counts: collections.Counter[str],
    env_steps: int,
    stats: EpisodeStats,
    num_live_episodes: int,
    memory_bytes: int,
    batchers: Sequence[PolicyBatcher],
    elapsed_s: float,
) -> dict[str, Any]:
    """The dict :meth:`ExternalEnv.get_metrics <jaxrunner.ExternalEnv.get_metrics>`
    returns (its keys are documented there), from the env's counters (``env_steps`` is
    ``num_env_steps``), its recent-episode statistics and its batchers (one per policy;
    their counts add up), ``elapsed_s`` after construction. ``params_version`` is the
    caller's to add."""
    batches = sum(b.num_batches for b in batchers)
    rows = sum(b.num_rows for b in batchers)
    inference_s = sum(b.inference_s for b in batchers)
    return {
        "num_env_steps": env_steps,
        **stats.summary(),
        "num_training_episodes": counts["num_training_episodes"],
        "num_live_episodes": num_live_episodes,
        "num_started_episodes": counts["num_started_episodes"],
        "num_abandoned_episodes": counts["num_abandoned_episodes"],
        "num_dropped_steps": counts["num_dropped_steps"],
        "num_undelivered_actions": counts["num_undelivered_actions"],
        "memory_bytes": memory_bytes,
        "num_faulty_episodes": 0,
        "num_batches": batches,
        "num_policy_rows": rows,
        "mean_batch_size": rows / batches if batches else 0.0,
        "num_traces": sum(b.num_traces for b in batchers),
        "env_steps_per_s": env_steps / elapsed_s if elapsed_s else 0.0,
        "perf": {"inference_ms": 1000.0 * inference_s / batches if batches else 0.0},
    }
