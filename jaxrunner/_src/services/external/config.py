"""ExternalEnvConfig: the limits and batching of the external envs."""

from __future__ import annotations

import dataclasses

from jaxrunner._src.arg_checks import check_int, check_number, is_int
from jaxrunner.errors import InvalidArgumentError


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExternalEnvConfig:
    """Limits and batching of an :class:`ExternalEnv`."""

    max_concurrent: int = 1024
    """The most episodes live at once; one more ``start_episode`` raises
    ``TooManyEpisodesError`` (HTTP 429 when served)."""
    max_memory_bytes: int = 1 << 30
    """The most bytes live episodes and finished, unpolled ones may hold together (1 GiB:
    about 1.4 million CartPole steps). A step or episode that would pass it raises
    ``MemoryLimitError`` (HTTP 429) before anything is stored: poll or end episodes."""
    max_episodes_per_client: int | None = None
    """The most live episodes per client name; None: only ``max_concurrent``. Advisory:
    over HTTP a client names itself (see docs/serving.md)."""
    max_batch: int = 64
    """The most rows per policy call."""
    max_wait_ms: float = 2.0
    """After the first request of a batch, how long to wait for more (unless every
    live episode has already asked)."""
    buckets: tuple[int, ...] | None = None
    """Batch sizes the policy is compiled for (each once); batches are padded to the
    smallest that fits. None: powers of four up to ``max_batch``."""
    episode_timeout_s: float | None = 300.0
    """An episode with no call for this long is ended by the reaper (truncated)."""
    action_timeout_s: float = 60.0
    """``get_action``/``log_action`` raise ``TimeoutError`` after this long."""
    max_episode_steps: int = 100_000
    """Longer episodes are refused further steps: end them."""
    max_output_episodes: int = 10_000
    """Finished episodes kept for ``poll_episodes``; beyond, the oldest are dropped
    (counted in ``num_dropped_steps``)."""
    episode_window: int = 100
    """Episode return/length means are over this many most recent episodes."""

    def __post_init__(self) -> None:
        where = "ExternalEnvConfig"
        for name in (
            "max_concurrent",
            "max_memory_bytes",
            "max_batch",
            "max_episode_steps",
            "max_output_episodes",
            "episode_window",
        ):
            check_int(where, name, getattr(self, name))
        per_client = self.max_episodes_per_client
        check_int(where, "max_episodes_per_client", per_client, none="for max_concurrent only")
        for name in ("episode_timeout_s", "action_timeout_s"):
            none = "for no timeout" if name == "episode_timeout_s" else None
            check_number(where, name, getattr(self, name), low_open=True, hint="seconds", none=none)
        check_number(where, "max_wait_ms", self.max_wait_ms, hint="milliseconds")
        if self.buckets is not None:
            sizes = list(self.buckets)
            if (
                not sizes
                or not all(is_int(b) for b in sizes)
                or sizes != sorted(set(sizes))
                or sizes[-1] != self.max_batch
            ):
                example = (*(b for b in (1, 8) if b < self.max_batch), self.max_batch)
                raise InvalidArgumentError(
                    f"ExternalEnvConfig(buckets={self.buckets!r}): expected increasing ints >= 1 "
                    f"ending with max_batch={self.max_batch}, e.g. {example}."
                )
