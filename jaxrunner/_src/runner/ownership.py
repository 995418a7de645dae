"""One live runner per vector env (design invariant 10), and a runner's life: usable
until it is stopped or one of its samples failed."""

from __future__ import annotations

import weakref
from typing import Any

from jaxrunner.errors import ClosedError, InvalidArgumentError, RunnerFailedError

_OWNERS: weakref.WeakKeyDictionary[Any, weakref.ref[Ownership]] = weakref.WeakKeyDictionary()
"""Each vector env's live runner's claim."""


class Ownership:
    """A runner's claim on its vector env: taken at construction, refused while another
    live runner holds the env, given up by :meth:`release`."""

    def __init__(self, runner: str, envs: Any) -> None:
        self.runner, self.envs = runner, envs
        self.closed = False
        """Whether the runner stopped (it cannot sample; the env is free)."""
        self.sampling = False
        """Whether a ``sample()`` runs (a callback calling back into the runner is refused)."""
        self.failure: BaseException | None = None
        """The error of the ``sample()`` that failed, after which the runner refuses to go on."""
        held = _OWNERS.get(envs)
        owner = held() if held is not None else None
        if owner is not None and not owner.closed:
            raise InvalidArgumentError(
                f"{runner}(envs=...): this {type(envs).__name__} is driven by another live "
                f"{owner.runner}; two runners on one vector env would continue each "
                "other's episodes. Build separate envs (e.g. a second jaxrunner.make_vec(...)) "
                "for evaluation, or call stop() on the first runner."
            )
        _OWNERS[envs] = weakref.ref(self)

    def release(self) -> None:
        """Frees the env for another runner; the runner is closed."""
        self.closed = True
        held = _OWNERS.get(self.envs)
        if held is not None and held() is self:
            del _OWNERS[self.envs]

    def check_usable(self, what: str, while_sampling: bool = False) -> None:
        """Refuses ``what`` on a stopped runner, one whose sample failed, or while it
        samples unless ``while_sampling``."""
        name, failure = self.runner, self.failure
        if self.sampling and not while_sampling:
            raise InvalidArgumentError(
                f"{name}.{what}() called while sample() runs (from a callback?): it would "
                "step the envs or read the state the running sample is writing. Call it "
                "after sample() returns."
            )
        if self.closed:
            raise ClosedError(f"{name}.{what}() called after stop(); create a new {name}.")
        if failure is not None:
            raise RunnerFailedError(
                f"{name}.{what}(): an earlier sample() failed ({failure!r}), leaving the "
                "envs in an unknown state; its collected steps are in that error's "
                f"partial_trajectory. Create a new {name} to continue."
            ) from failure
