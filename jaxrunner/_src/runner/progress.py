"""The optional progress bar of long ``sample_episodes`` calls: tqdm where it is
installed (an optional dependency), else one line on stderr rewritten in place."""

from __future__ import annotations

import sys
from typing import Any


class EpisodeProgress:
    """Counts complete episodes towards ``total``; does nothing unless ``enabled``.

    Use as a context manager; :meth:`update` takes the count so far (not an increment).
    """

    def __init__(self, total: int, *, enabled: bool) -> None:
        self.total, self.enabled = total, enabled
        self._count = 0
        self._bar: Any = None
        if enabled:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                self._bar = None
            else:
                self._bar = tqdm(total=total, desc="sample_episodes", unit="episode")

    def update(self, count: int) -> None:
        """The episodes done so far (capped at ``total``)."""
        count = min(count, self.total)
        if not self.enabled or (count == self._count and count):
            return
        if self._bar is not None:
            self._bar.update(count - self._count)
        else:
            sys.stderr.write(f"\rsample_episodes: {count}/{self.total} episodes")
            sys.stderr.flush()
        self._count = count

    def __enter__(self) -> EpisodeProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            sys.stderr.write("\n")
            sys.stderr.flush()


__all__ = ["EpisodeProgress"]
