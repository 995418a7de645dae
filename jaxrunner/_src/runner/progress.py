"""The optional progress bar of ``sample``, ``sample_episodes`` and ``iterate``: tqdm
where it is installed, else one line on stderr rewritten in place."""

from __future__ import annotations

import sys
import time
from typing import Any

_LINE_INTERVAL_S = 0.1
"""The stderr line is rewritten at most this often (and at the end)."""


class Progress:
    """Counts ``unit``s towards ``total`` (None: open-ended) if ``enabled``; a context
    manager. :meth:`update` takes the count so far (not an increment)."""

    def __init__(self, total: int | None, *, enabled: bool, desc: str, unit: str) -> None:
        self.total, self.enabled, self.desc, self.unit = total, enabled, desc, unit
        self._count = 0
        self._written = -1  # the count the stderr line shows (-1: none yet)
        self._last_write = 0.0
        self._bar: Any = None
        if enabled:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=total, desc=desc, unit=unit)

    def update(self, count: int) -> None:
        """The units done so far (capped at ``total``)."""
        if not self.enabled:
            return
        count = count if self.total is None else min(count, self.total)
        if count == self._count and count:
            return
        if self._bar is not None:
            self._bar.update(count - self._count)
        self._count = count
        now = time.monotonic()
        if self._bar is None and (
            now - self._last_write >= _LINE_INTERVAL_S or count == self.total
        ):
            self._write_line(now)

    def _write_line(self, now: float) -> None:
        of = "" if self.total is None else f"/{self.total}"
        sys.stderr.write(f"\r{self.desc}: {self._count}{of} {self.unit}s")
        sys.stderr.flush()
        self._written, self._last_write = self._count, now

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
            return
        if self._written != self._count:
            self._write_line(time.monotonic())
        sys.stderr.write("\n")
        sys.stderr.flush()
