"""The training runner's connector state as evaluation uses it: checked, and frozen, so
that evaluating never changes the statistics (single- and multi-agent evaluation)."""

from __future__ import annotations

from typing import Any

import jax

from jaxrunner._src.connectors.moments import RunningMoments, freeze
from jaxrunner._src.connectors.pipeline import Connectors, ConnectorsState
from jaxrunner.errors import InvalidArgumentError


def check_state_has_connectors(connectors: Any, state: Any) -> None:
    """A ``connector_state`` needs the ``connectors`` it belongs to."""
    if connectors is None and state is not None:
        raise InvalidArgumentError(
            "evaluate(connector_state=...): no connectors to take it; pass "
            "connectors=<the training runner's Connectors> as well."
        )


def frozen_state(fresh: ConnectorsState, connectors: Connectors, given: Any) -> ConnectorsState:
    """The evaluation runner's connector state (``fresh``, as it starts) with ``given``
    (the training runner's, checked) loaded, frozen.

    Raises:
        InvalidArgumentError: ``given`` does not fit, or is None while the observation
            connectors keep statistics (fresh ones would evaluate on unnormalized
            observations).
    """
    if given is not None:
        return freeze(connectors.load_state(fresh, given, shared_only=True))
    if any(_is_running(x) for x in jax.tree.leaves(fresh.obs, is_leaf=_is_running)):
        raise InvalidArgumentError(
            "evaluate(connectors=...): these observation connectors keep statistics, and "
            "fresh ones (mean 0, variance 1) would evaluate on unnormalized observations; "
            "pass connector_state=runner.get_connector_state() of the training runner."
        )
    return freeze(fresh)


def _is_running(x: Any) -> bool:
    return isinstance(x, RunningMoments)
