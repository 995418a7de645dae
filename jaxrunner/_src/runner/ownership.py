"""One owner per vector env, and the lifecycle and argument checks every runner shares."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax

from jaxrunner._src.arg_checks import check_bool, check_int
from jaxrunner._src.core.policy import Params, check_params_like
from jaxrunner._src.core.runner_state import RunnerState
from jaxrunner._src.core.seeds import MAX_SEED
from jaxrunner._src.runner.progress import Progress
from jaxrunner.errors import ClosedError, InvalidArgumentError, RunnerFailedError

_OWNERS: weakref.WeakKeyDictionary[Any, weakref.ref] = weakref.WeakKeyDictionary()
"""Each vector env's live runner."""


class EnvOwner:
    """Base of the runners: the claim on ``envs``, ``stop``/``close``, the context
    manager, the params by policy id and the one ``sample`` call, over the runner's
    :class:`RunnerState`."""

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
        """:meth:`stop`, closing the envs (the name gymnasium and Python users reach for)."""
        self.stop()

    def set_params(self, params: Params, policy_id: str | None = None) -> None:
        """Replaces the params of policy ``policy_id`` (``None``: the runner's one policy);
        takes effect at the next step and never recompiles. The new params must have the
        structure, shapes and dtypes of the old ones."""
        self._check_usable("set_params")
        if isinstance(params, str) and params in self.state.params and policy_id is not None:
            warnings.warn(
                f"{type(self).__name__}.set_params(policy_id, params) is the old order; call "
                "set_params(params, policy_id), as every runner takes it.",
                DeprecationWarning,
                stacklevel=2,
            )
            params, policy_id = policy_id, params
        pid = self._policy_id("set_params", policy_id)
        check_params_like(self.state.params[pid], params, "runner")
        self.state.params[pid] = jax.device_put(params)

    def get_params(self, policy_id: str | None = None) -> Params:
        """The params of policy ``policy_id`` (``None``: the runner's one policy), as the
        runner holds them, on device."""
        return self.state.params[self._policy_id("get_params", policy_id)]

    @property
    def policy_ids(self) -> tuple[str, ...]:
        """The runner's policy ids (an ``EnvRunner``'s one: ``"default_policy"``)."""
        return tuple(self.state.params)

    def to_policy_dict(self, value: Any, where: str) -> dict[str, Any]:
        """``value`` (params, connector state, statistics), given as this runner's
        methods take and return it, as a dict by policy id: a single-agent env's runner
        takes its one policy's value, a multi-agent env's a dict by policy id (some of the ids;
        checked, ``where`` named in the error). The services treat both kinds alike
        through it and :meth:`from_policy_dict`."""
        return {self.policy_ids[0]: value}

    def from_policy_dict(self, values: Mapping[str, Any]) -> Any:
        """The inverse of :meth:`to_policy_dict`: values by policy id, as this runner's
        methods take and return them."""
        return values[self.policy_ids[0]]

    def _policy_id(self, what: str, policy_id: Any) -> str:
        ids = list(self.state.params)
        if policy_id is None and len(ids) == 1:
            return ids[0]
        if policy_id not in self.state.params:
            raise InvalidArgumentError(
                f"{type(self).__name__}.{what}(policy_id={policy_id!r}): no such policy; the "
                f"policy ids are {ids}."
                + (" Name one: this runner has several." if policy_id is None else "")
            )
        return policy_id

    def iterate(
        self, num_samples: int | None = None, *, progress: bool = False, reuse_buffers: bool = False
    ) -> Iterator[Any]:
        """Yields ``num_samples`` results of :meth:`sample` (``None``: until the loop
        stops), as TorchRL and Sample Factory users iterate a collector.

        Args:
            num_samples: how many samples; ``None`` for an endless iterator.
            progress: a progress bar counting env steps (tqdm where it is installed,
                else a line on stderr).
            reuse_buffers: hand each trajectory back (``release``) when the next is
                asked for, so the loop writes into one set of buffers instead of
                allocating a sample's memory each time; a yielded trajectory is then
                valid until the next iteration only (copy what you keep). Host envs only
                (a pure-JAX env's trajectories live on device).
        """
        name = f"{type(self).__name__}.iterate"
        num_samples = check_int(name, "num_samples", num_samples, low=0, none="for no end")
        check_bool(name, "progress", progress)
        check_bool(name, "reuse_buffers", reuse_buffers)
        if reuse_buffers and not callable(getattr(self.sampler, "release", None)):  # type: ignore[attr-defined]
            raise InvalidArgumentError(
                f"{type(self).__name__}.iterate(reuse_buffers=True): this runner's "
                "trajectories cannot be handed back (a pure-JAX env's live on device); leave "
                "reuse_buffers=False."
            )
        return self._iterate(num_samples, progress, reuse_buffers)

    def _iterate(
        self, num_samples: int | None, progress: bool, reuse_buffers: bool
    ) -> Iterator[Any]:
        per_sample = self.rollout_length * self.envs.num_envs  # type: ignore[attr-defined]
        total = None if num_samples is None else num_samples * per_sample
        done = 0
        name = f"{type(self).__name__}.iterate"
        with Progress(total, enabled=progress, desc=name, unit="env step") as bar:
            while num_samples is None or done < num_samples:
                traj = self.sample()  # type: ignore[attr-defined]
                done += 1
                bar.update(done * per_sample)
                yield traj
                if reuse_buffers:
                    self.release(traj)  # type: ignore[attr-defined]

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _sample_once(self, progress: bool = False) -> Any:
        """One ``sampler.sample(params)``; a failure marks the runner unusable. With
        ``progress``, a bar counts the sample's env steps as they are recorded."""
        self._check_usable("sample")
        total = self.rollout_length * self.envs.num_envs  # type: ignore[attr-defined]
        name = f"{type(self).__name__}.sample"
        with Progress(total, enabled=progress, desc=name, unit="env step") as bar:
            try:
                traj = self.sampler.sample(  # type: ignore[attr-defined]
                    self._sampler_params(), progress=bar.update if progress else None
                )
            except BaseException as err:
                self.state.failure = err
                raise
            bar.update(total)  # a pure-JAX env's scan reports only when it returns
        return traj

    def _sample_episodes(
        self, num_episodes: Any, progress: Any, sample: Callable[[], Any], keep: Callable
    ) -> list[Any]:
        """``sample_episodes``: samples with ``sample()`` until ``num_episodes`` complete
        episodes that ``keep`` accepts are in ``state.finished``; with ``progress``, a
        bar counts them."""
        name = f"{type(self).__name__}.sample_episodes"
        check_int(name, "num_episodes", num_episodes)
        check_bool(name, "progress", progress)
        state = self.state
        with Progress(num_episodes, enabled=progress, desc=name, unit="episode") as bar:
            bar.update(len(state.finished))
            while len(state.finished) < num_episodes:
                done = state.episodes.complete(sample().split_episodes())
                state.finished.extend(e for e in done if keep(e))
                bar.update(len(state.finished))
        return state.take_finished(num_episodes)

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


def check_rollout_arguments(
    runner: str, rollout_length: Any, seed: Any, num_splits: Any, num_envs: int
) -> None:
    """Refuses the arguments every runner takes (``rollout_length``, ``seed`` and
    ``num_splits`` of ``num_envs`` sub-envs) where they are out of range, naming
    ``runner``'s argument."""
    check_int(runner, "rollout_length", rollout_length)
    check_int(runner, "seed", seed, low=0, high=MAX_SEED)
    at_most = f"at most num_envs={num_envs}"
    check_int(runner, "num_splits", num_splits, high=num_envs, hint=at_most, none="for automatic")
