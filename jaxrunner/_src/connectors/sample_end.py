"""The end of a host sampler's sample: :meth:`Connectors.finish_sample` compiled once."""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

from jaxrunner._src.connectors.pipeline import POLICY_OBS, Connectors, finish_group_sample
from jaxrunner._src.connectors.state_packing import StatePacking


class SampleEnd:
    """:meth:`Connectors.finish_sample` for a host sampler's numpy ``[T, B]`` buffers
    (with ``agent_axis``: an agent group's ``[T, B, A_g]`` buffers, by
    :func:`finish_group_sample`) and packed state: compiled once, one transfer each way
    per sample."""

    def __init__(
        self, connectors: Connectors, packing: StatePacking, *, agent_axis: bool = False
    ) -> None:
        finish_arrays = (
            functools.partial(finish_group_sample, connectors)
            if agent_axis
            else connectors.finish_sample
        )

        def finish(flat: Any, *inputs: Any) -> tuple[dict[str, Any], Any]:
            extras, state = finish_arrays(packing.unpack(flat), *inputs)
            return extras, packing.pack(state)

        self._connectors = connectors
        self._fn = jax.jit(finish, donate_argnums=0)

    def __call__(self, flat: Any, traj: Any, cut: np.ndarray | None = None) -> tuple[Any, Any]:
        """Returns ``traj`` with the connectors' extras added and the new packed state;
        ``cut`` as :func:`finish_inputs` takes it."""
        inputs = jax.device_put(finish_inputs(traj, bool(self._connectors.obs), cut))
        extras, flat = self._fn(flat, *inputs)
        extras = jax.tree.map(np.asarray, jax.device_get(extras))
        return traj.replace(extras={**traj.extras, **extras}), flat


def finish_inputs(traj: Any, with_obs: bool = True, cut: Any = None) -> tuple[Any, ...]:
    """What :meth:`Connectors.finish_sample` takes after the state, read from a
    ``Trajectory`` or ``GroupTrajectory`` (``obs`` None unless ``with_obs``). ``cut``
    (``[T, B]`` bool: a group's env steps that failed) cuts every agent's episode there:
    its slots are seen truncated."""
    truncated = traj.truncated if cut is None else traj.truncated | cut[:, :, None]
    return (
        traj.obs if with_obs else None,
        traj.extras.get(POLICY_OBS),
        traj.next_obs,
        traj.reward,
        traj.terminated,
        truncated,
        traj.valid,
    )
