"""Connectors: pure, stateful, jitted transforms between the env and the policy.

Observation connectors (normalization, frame stacking) run inside the runner's compiled
policy step, action connectors (rescaling) right after the policy, a reward connector
(scaling) once per sample; see :mod:`jaxrunner._src.connectors.pipeline` for where the
Trajectory keeps what the policy saw, and :mod:`jaxrunner._src.connectors.base` to write one.
With agent groups (``MultiAgentRunner(..., connectors=...)``) see
:mod:`jaxrunner._src.connectors.per_group`.
"""

from jaxrunner._src.connectors.base import (
    ActionConnector,
    ConnectorState,
    ObsConnector,
    RewardConnector,
)
from jaxrunner._src.connectors.frame_stack import FrameStack
from jaxrunner._src.connectors.moments import (
    COUNT_DTYPES,
    Moments,
    RunningMoments,
    freeze,
    merge_all,
    set_statistics,
    take_deltas,
    unfreeze,
)
from jaxrunner._src.connectors.normalize_observation import NormalizeObservation
from jaxrunner._src.connectors.pipeline import (
    POLICY_NEXT_OBS,
    POLICY_OBS,
    SCALED_REWARD,
    Connectors,
    ConnectorsState,
)
from jaxrunner._src.connectors.rescale_actions import RescaleActions
from jaxrunner._src.connectors.sample_end import SampleEnd
from jaxrunner._src.connectors.scale_reward import ScaleReward

__all__ = [
    "COUNT_DTYPES",
    "POLICY_NEXT_OBS",
    "POLICY_OBS",
    "SCALED_REWARD",
    "ActionConnector",
    "ConnectorState",
    "Connectors",
    "ConnectorsState",
    "FrameStack",
    "Moments",
    "NormalizeObservation",
    "ObsConnector",
    "RescaleActions",
    "RewardConnector",
    "RunningMoments",
    "SampleEnd",
    "ScaleReward",
    "freeze",
    "merge_all",
    "set_statistics",
    "take_deltas",
    "unfreeze",
]
