"""Real workloads for ``jaxrunner bench --workload`` and ``benchmarks/peers.py``
(cartpole, pong, halfcheetah): env factories, policies and widths."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from collections.abc import Callable
from typing import Any

import gymnasium

from jaxrunner import models
from jaxrunner._src.bench.timing import STEPS_PER_ROLLOUT, rollout_length
from jaxrunner._src.core.policy import Policy
from jaxrunner.errors import InvalidArgumentError


def make_pong() -> gymnasium.Env:
    """ALE/Pong-v5 as the Atari baselines see it: ``AtariPreprocessing`` (frame skip 4,
    max-pooled; the emulator's off), 84x84 grey, 4 frames stacked."""
    import ale_py  # type: ignore[import-not-found]  # the atari extra

    gymnasium.register_envs(ale_py)  # here, not at import: each process-backend worker too
    env = gymnasium.make("ALE/Pong-v5", frameskip=1)
    env = gymnasium.wrappers.AtariPreprocessing(env)
    return gymnasium.wrappers.FrameStackObservation(env, 4)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Workload:
    """One real workload: the env every system steps and the policy every one runs."""

    env_id: str  # the gymnasium id, for labels: make builds the env
    make: Callable[[], gymnasium.Env]  # one sub-env, wrappers included
    policy: Callable[[gymnasium.Space, gymnasium.Space], Policy]  # single spaces -> policy
    policy_label: str
    widths: tuple[int, ...]
    # T = max(8, steps_per_rollout // B) for every system (a Pong rollout stays under 1 s)
    steps_per_rollout: int
    envpool_id: str  # EnvPool's port of the same env, configured as close as it goes
    envpool_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    needs: tuple[str, ...] = ()  # the modules pip install 'jaxrunner[<extra>]' brings
    extra: str | None = None
    wrapped: bool = False  # make adds wrappers to gymnasium.make(env_id)

    @property
    def user_env(self) -> str | Callable[[], gymnasium.Env]:
        """What a user passes to ``EnvRunner.from_env``: the id, unless it takes wrappers
        (with the id, ``backend="auto"`` tries EnvPool too where it has the task)."""
        return self.make if self.wrapped else self.env_id

    def rollout_length(self, num_envs: int) -> int:
        return rollout_length(num_envs, self.steps_per_rollout)

    def unavailable(self) -> str | None:
        missing = not_installed(self.needs)
        return missing and f"{missing} (pip install 'jaxrunner[{self.extra}]')"


def not_installed(modules: tuple[str, ...]) -> str | None:
    """``"not installed: <the modules missing>"``, or None."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return f"not installed: {', '.join(missing)}" if missing else None


WORKLOADS: dict[str, Workload] = {
    "cartpole": Workload(
        env_id="CartPole-v1",
        make=functools.partial(gymnasium.make, "CartPole-v1"),
        policy=lambda _, action_space: models.mlp_policy(action_space),
        policy_label="jr.models.mlp_policy: 64-64 tanh MLP, categorical",
        widths=(1, 8, 64, 256),
        steps_per_rollout=STEPS_PER_ROLLOUT,  # the default bench's rollouts
        envpool_id="CartPole-v1",
    ),
    "pong": Workload(
        env_id="ALE/Pong-v5",
        make=make_pong,
        policy=models.nature_cnn_policy,
        policy_label="jr.models.nature_cnn_policy: NatureCNN on uint8 4x84x84, categorical",
        widths=(8, 32),
        steps_per_rollout=256,
        # EnvPool's Atari defaults already match AtariPreprocessing (84x84 grey, skip 4,
        # 30 no-ops, 4 stacked, no episodic life); ALE v5 repeats actions with p=0.25.
        envpool_id="Pong-v5",
        envpool_kwargs={"repeat_action_probability": 0.25},
        needs=("ale_py", "cv2"),
        extra="atari",
        wrapped=True,
    ),
    "halfcheetah": Workload(
        env_id="HalfCheetah-v5",
        make=functools.partial(gymnasium.make, "HalfCheetah-v5"),
        policy=lambda _, action_space: models.gaussian_mlp_policy(action_space),
        policy_label="jr.models.gaussian_mlp_policy: 256-256 tanh MLP, diagonal Gaussian",
        widths=(8, 32),
        steps_per_rollout=512,
        envpool_id="HalfCheetah-v5",
        needs=("mujoco",),
        extra="mujoco",
    ),
}


def get_workload(name: str, where: str | None = None) -> Workload:
    """The workload called ``name`` (``where``: what names it, for the error)."""
    if name not in WORKLOADS:
        where = where or f"workload {name!r}"
        raise InvalidArgumentError(f"{where}: expected one of {list(WORKLOADS)}.")
    return WORKLOADS[name]


def steps_per_rollout(workload: str | None) -> int:
    return STEPS_PER_ROLLOUT if workload is None else get_workload(workload).steps_per_rollout
