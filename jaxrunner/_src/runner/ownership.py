"""One owner per vector env, and the lifecycle every runner shares.

A vector env is driven by one live runner: two would continue each other's episodes
from states neither produced. :class:`EnvOwner` claims its envs at construction (a
second live runner on them is refused with the fix), lets go at ``stop()`` or when it
is garbage collected, and refuses calls after ``stop()`` or a failed sample. The
checks of the arguments every runner takes live here too.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from jaxrunner._src.runner.runner_state import RunnerState
from jaxrunner.errors import ClosedError, InvalidArgumentError, RunnerFailedError

_OWNERS: weakref.WeakKeyDictionary[Any, weakref.ref] = weakref.WeakKeyDictionary()
"""Each vector env's live runner."""


class EnvOwner:
    """Base of the runners: the claim on ``envs``, ``stop`` (and ``close``), the context
    manager, and the one ``sample`` call, over the runner's :class:`RunnerState`."""

    envs: Any
    state: RunnerState
    _closed: bool = False

    def _claim(self, envs: Any) -> None:
        """Makes this runner ``envs``' owner, or refuses if another live one is."""
        name = type(self).__name__
        owner_ref = _OWNERS.get(envs)
        owner = owner_ref() if owner_ref is not None else None
        if owner is not None and owner is not self and not owner._closed:
            raise InvalidArgumentError(
                f"{name}(envs=...): this {type(envs).__name__} is driven by another live "
                f"{type(owner).__name__}; two runners on one vector env would continue each "
                "other's episodes. Build separate envs (e.g. a second jaxrunner.make_vec(...)) "
                "for evaluation, or call stop() on the first runner."
            )
        _OWNERS[envs] = weakref.ref(self)

    def _release(self, envs: Any) -> None:
        owner_ref = _OWNERS.get(envs)
        if owner_ref is not None and owner_ref() is self:
            del _OWNERS[envs]

    def stop(self, close_envs: bool = True) -> None:
        """Ends the runner: it cannot sample afterwards, and its envs are free for
        another runner. Closes the envs unless ``close_envs`` is False."""
        if not self._closed:
            self._closed = True
            self._release(self.envs)
            if close_envs:
                self.envs.close()

    def close(self) -> None:
        """:meth:`stop`, closing the envs (the name gymnasium and Python use)."""
        self.stop()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _sample_once(self) -> Any:
        """One ``sampler.sample(params)``; a failure marks the runner unusable."""
        self._check_usable("sample")
        try:
            return self.sampler.sample(self._sampler_params())  # type: ignore[attr-defined]
        except BaseException as err:
            self.state.failure = err
            raise

    def _sampler_params(self) -> Any:
        """The params as the sampler takes them: every policy id's (multi-agent)."""
        return self.state.params

    def _check_usable(self, what: str) -> None:
        name = type(self).__name__
        if self._closed:
            raise ClosedError(f"{name}.{what}() called after stop(); create a new {name}.")
        failure = self.state.failure
        if failure is not None:
            raise RunnerFailedError(
                f"{name}.{what}(): an earlier sample() failed ({failure!r}), leaving the "
                "envs in an unknown state; its collected steps are in that error's "
                f"partial_trajectory. Create a new {name} to continue."
            ) from failure


def check_rollout_arguments(runner: str, rollout_length: Any, seed: Any) -> None:
    """Refuses a ``rollout_length`` that is not an int >= 1 or a ``seed`` that is not an
    int >= 0 (numpy ints count as ints), naming ``runner``'s argument."""
    for name, value, low in (("rollout_length", rollout_length, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise InvalidArgumentError(
                f"{runner}({name}=...): expected an int >= {low}, got {value!r}."
            )


def check_num_episodes(num_episodes: Any) -> None:
    """Refuses a ``sample_episodes(num_episodes)`` that is not an int >= 1."""
    if isinstance(num_episodes, bool) or not isinstance(num_episodes, int) or num_episodes < 1:
        raise InvalidArgumentError(
            f"sample_episodes(num_episodes=...): expected an int >= 1, got {num_episodes!r}."
        )


__all__ = ["EnvOwner", "check_num_episodes", "check_rollout_arguments"]
