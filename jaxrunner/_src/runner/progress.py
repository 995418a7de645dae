"""The optional progress bar of ``sample_episodes`` and ``iterate``: tqdm where it is
installed (an optional dependency), else one line on stderr rewritten in place."""

from __future__ import annotations

import sys
from typing import Any


class Progress:
    """Counts ``unit``s towards ``total`` (None: open-ended); does nothing unless
    ``enabled``. Use as a context manager; :meth:`update` takes the count so far (not an
    increment)."""

    def __init__(
        self,
        total: int | None,
        *,
        enabled: bool,
        desc: str = "sample_episodes",
        unit: str = "episode",
    ) -> None:
        self.total, self.enabled, self.desc, self.unit = total, enabled, desc, unit
        self._count = 0
        self._bar: Any = None
        if enabled:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                self._bar = None
            else:
                self._bar = tqdm(total=total, desc=desc, unit=unit)

    def update(self, count: int) -> None:
        """The episodes done so far (capped at ``total``)."""
        count = count if self.total is None else min(count, self.total)
        if not self.enabled or (count == self._count and count):
            return
        if self._bar is not None:
            self._bar.update(count - self._count)
        else:
            of = "" if self.total is None else f"/{self.total}"
            sys.stderr.write(f"\r{self.desc}: {count}{of} {self.unit}s")
            sys.stderr.flush()
        self._count = count

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            sys.stderr.write("\n")
            sys.stderr.flush()
