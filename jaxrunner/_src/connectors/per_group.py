"""Connectors per agent group (``EnvRunner(..., connectors=...)``): which
:class:`~jaxrunner.connectors.Connectors` each policy id's group runs, with the group's
agent slots as rows (``B * A_g``, row ``b * A_g + a``), and each group's own state."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from jaxrunner._src.connectors.pipeline import Connectors
from jaxrunner._src.core.agent_groups import AgentGroup
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError

GroupConnectors = Connectors | Mapping[str, Connectors | None]
"""What ``EnvRunner(connectors=...)`` takes: one :class:`Connectors` for every
group (each group gets its own state), or a dict ``policy_id -> Connectors`` (policy
ids left out, or mapped to None, run without connectors)."""


def per_policy_connectors(
    value: GroupConnectors | None, groups: Sequence[AgentGroup]
) -> dict[str, Connectors]:
    """``policy_id -> Connectors`` of the groups that have connectors, checked against
    each group's observation space."""
    ids = [g.policy_id for g in groups]
    if value is None:
        return {}
    if isinstance(value, Connectors):
        chosen: dict[str, Connectors] = dict.fromkeys(ids, value)
    elif isinstance(value, Mapping):
        unknown = sorted(set(value) - set(ids), key=str)
        if unknown:
            raise InvalidArgumentError(
                f"EnvRunner(connectors=...): no policy ids {unknown}; the policy ids are "
                f"{ids}. Key the dict by policy id (envs.policy_ids)."
            )
        chosen = {pid: conn for pid in ids if (conn := value.get(pid)) is not None}
        for pid, conn in chosen.items():
            if not isinstance(conn, Connectors):
                raise InvalidArgumentTypeError(
                    f"EnvRunner(connectors={{{pid!r}: ...}}): expected a "
                    f"jaxrunner.connectors.Connectors (or None), got {type(conn).__name__}. "
                    "Wrap them: Connectors(obs=[...], action=[...], reward=...)."
                )
    else:
        raise InvalidArgumentTypeError(
            f"EnvRunner(connectors=...): expected a jaxrunner.connectors.Connectors "
            f"(for every group) or a dict policy_id -> Connectors, got {type(value).__name__}. "
            "Wrap a list of connectors: Connectors(obs=[...], action=[...], reward=...)."
        )
    spaces = {g.policy_id: g.observation_space for g in groups}
    for pid, conn in chosen.items():
        try:
            conn.observation_space(spaces[pid])
            conn.init(1, spaces[pid])
        except InvalidArgumentError as err:
            err.add_note(
                f"jaxrunner: in EnvRunner(connectors=...) for policy {pid!r}, whose "
                f"agents observe {spaces[pid]!r}."
            )
            raise
    return chosen
