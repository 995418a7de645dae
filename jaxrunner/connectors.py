"""Connectors: pure, stateful, jitted transforms between the env and the policy (of
observations and actions in the compiled policy step, of rewards once per sample),
composed by :class:`Connectors`. See docs/connectors.md."""

from jaxrunner._src.connectors.base import (
    ActionConnector,
    ConnectorState,
    ObsConnector,
    RewardConnector,
)
from jaxrunner._src.connectors.frame_stack import FrameStack
from jaxrunner._src.connectors.moments import (
    Moments,
    RunningMoments,
    freeze,
    set_statistics,
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
    "set_statistics",
    "unfreeze",
]
