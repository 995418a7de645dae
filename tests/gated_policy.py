"""A test helper: stage timeouts, hang-ups and policy failures of an ExternalEnv exactly."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import jaxrunner as jr


class GatedPolicy:
    """Holds an ExternalEnv's batcher at ``gate`` before each policy call (set it to
    let calls through), and makes the next ``fail`` calls raise."""

    def __init__(self, env: jr.ExternalEnv) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.fail = 0
        self.entered = threading.Event()
        (batcher,) = env._batchers.values()
        compute = batcher._compute

        def gated(rows: Any) -> Any:
            self.entered.set()
            self.gate.wait(20)  # never hangs a failing test for good
            if self.fail:
                self.fail -= 1
                raise FloatingPointError("the policy broke on purpose")
            return compute(rows)

        batcher._compute = gated


def when_idle(call: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    """Retries ``call()`` while its episode is busy (409); returns its result."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except jr.errors.EpisodeConflictError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
