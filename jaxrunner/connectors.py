"""Connectors: pure, stateful, jitted transforms between the env and the policy.

Observation connectors (normalization, frame stacking) run inside the runner's compiled
policy step, action connectors (rescaling) right after the policy, a reward connector
(scaling) once per sample. :class:`Connectors` composes them; the Trajectory keeps
what the policy saw in its ``extras`` (``policy_obs``, ``policy_next_obs``,
``scaled_reward``). To write one, subclass :class:`ObsConnector`,
:class:`ActionConnector` or :class:`RewardConnector`. With agent groups
(``EnvRunner(..., connectors=...)``) each group keeps a state of its own.
"""

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
