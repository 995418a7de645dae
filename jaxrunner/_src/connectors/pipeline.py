"""Connectors composed, as a runner is given them, and the two places they run: every
policy step (observation connectors, the policy, action connectors) and once per sample
(:meth:`Connectors.finish_sample`: ``policy_next_obs``, ``scaled_reward``, statistics)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import flax.struct
import jax
import jax.numpy as jnp
from gymnasium import spaces

from jaxrunner._src.connectors.base import (
    ActionConnector,
    ConnectorState,
    ObsConnector,
    RewardConnector,
)
from jaxrunner._src.connectors.checks import check_state
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError

POLICY_OBS = "policy_obs"
"""``extras`` key of what the policy saw at each step."""
POLICY_NEXT_OBS = "policy_next_obs"
"""``extras`` key of what the policy would see of each step's ``next_obs``."""
SCALED_REWARD = "scaled_reward"
"""``extras`` key of the rewards as the reward connector scaled them."""


class ConnectorsState(flax.struct.PyTreeNode):
    """The state of a runner's connectors (device arrays).

    Attributes:
        obs: one :class:`ConnectorState` per observation connector, in order.
        reward: the reward connector's state, or None.
    """

    obs: tuple[ConnectorState, ...] = ()
    reward: ConnectorState | None = None


@dataclasses.dataclass(frozen=True)
class Connectors:
    """The connectors of a runner (``EnvRunner(..., connectors=...)``).

    Each connector has a name: the key where ``obs`` is a dict, else its class name in
    snake case (``"normalize_observation"``, ``"frame_stack"``; a second of one class
    gets ``"_1"``, ...). State is saved and set by name (:meth:`state_dict`,
    ``runner.set_connector_state({name: state})``), so saved state survives adding a
    connector.

    Args:
        obs: observation connectors, applied in order before the policy: a sequence, or
            a dict ``name -> connector`` (in order).
        action: action connectors, applied in order to the policy's action before the
            env gets it (the Trajectory keeps the policy's action).
        reward: a reward connector, applied once per sample.
    """

    obs: Sequence[ObsConnector] | Mapping[str, ObsConnector] = ()
    action: Sequence[ActionConnector] = ()
    reward: RewardConnector | None = None
    obs_names: tuple[str, ...] = ()
    """The observation connectors' names (filled in from ``obs``; give them here, or
    pass ``obs`` as a dict)."""

    def __post_init__(self) -> None:
        for field in ("obs", "action", "obs_names"):
            value = getattr(self, field)
            if isinstance(value, str) or not isinstance(value, Iterable):
                raise InvalidArgumentTypeError(
                    f"Connectors({field}={value!r:.80}): expected a list"
                    f"{' (or a dict by name)' if field == 'obs' else ''}, got "
                    f"{type(value).__name__}; wrap one in a list: {field}=[...]."
                )
        names = list(self.obs) if isinstance(self.obs, Mapping) else list(self.obs_names)
        if isinstance(self.obs, Mapping) and self.obs_names:
            raise InvalidArgumentError(
                "Connectors(obs={...}, obs_names=...): the dict's keys already name the "
                "observation connectors; drop obs_names."
            )
        obs = tuple(self.obs.values() if isinstance(self.obs, Mapping) else self.obs)
        object.__setattr__(self, "obs", obs)
        object.__setattr__(self, "action", tuple(self.action))
        for name, kind, items in (
            ("obs", ObsConnector, obs),
            ("action", ActionConnector, self.action),
            ("reward", RewardConnector, () if self.reward is None else (self.reward,)),
        ):
            for i, item in enumerate(items):
                if name == "obs" and i > 0 and getattr(item, "first_only", False):
                    raise InvalidArgumentError(
                        f"Connectors(obs=[...]): {type(item).__name__} must be the first "
                        f"observation connector (it is at position {i}); its statistics are "
                        "those of the env's observations. Move it first."
                    )
                if not isinstance(item, kind):
                    raise InvalidArgumentTypeError(
                        f"Connectors({name}=...): expected {kind.__name__} instances, got "
                        f"{item!r}. Subclass jaxrunner.connectors.{kind.__name__}."
                    )
        if not names:  # the defaults: class names in snake case, numbered from the second
            seen: dict[str, int] = {}
            for connector in obs:
                base = _snake(connector)
                names.append(base if base not in seen else f"{base}_{seen[base]}")
                seen[base] = seen.get(base, 0) + 1
        every = names + ([] if self.reward is None else [_snake(self.reward)])
        if len(names) != len(obs) or any(
            not isinstance(n, str) or not n or every.count(n) > 1 for n in every
        ):
            raise InvalidArgumentError(
                f"Connectors(obs=..., obs_names=...): expected one unique non-empty name per "
                f"observation connector ({len(obs)}), got {names} (the reward connector is "
                f"named after its class: {every[len(names) :]}). Rename them."
            )
        object.__setattr__(self, "obs_names", tuple(names))

    @property
    def _obs_connectors(self) -> tuple[ObsConnector, ...]:
        return cast(tuple[ObsConnector, ...], self.obs)

    @property
    def names(self) -> tuple[str, ...]:
        """Every connector's name with state: the observation connectors', then the
        reward connector's (its class name in snake case, e.g. ``"scale_reward"``)."""
        return self.obs_names + (() if self.reward is None else (_snake(self.reward),))

    @classmethod
    def cleanrl(cls, gamma: float = 0.99) -> Connectors:
        """CleanRL's continuous-control recipe in one line: observations normalized and
        clipped to +-10, rewards scaled by the std of the discounted return and clipped
        to +-10 (``ScaleReward.cleanrl``). Add ``action=[RescaleActions.for_space(...)]``
        with ``dataclasses.replace`` where the policy acts in ``[-1, 1]``."""
        from jaxrunner._src.connectors.normalize_observation import NormalizeObservation
        from jaxrunner._src.connectors.scale_reward import ScaleReward

        return cls(obs=[NormalizeObservation(clip=10.0)], reward=ScaleReward.cleanrl(gamma))

    @property
    def per_sample(self) -> bool:
        """Whether :meth:`finish_sample` has anything to do."""
        return bool(self.obs) or self.reward is not None

    def observation_space(self, space: spaces.Space) -> spaces.Space:
        """What the policy sees, given the env's single observation space: initialise
        the policy on it (``policy.init(key, connectors.observation_space(space))``)."""
        for connector in self._obs_connectors:
            space = connector.observation_space(space)
        return space

    def init(self, num_envs: int, obs_space: spaces.Space) -> ConnectorsState:
        states = []
        for connector in self._obs_connectors:
            states.append(connector.init(num_envs, obs_space))
            obs_space = connector.observation_space(obs_space)
        reward = None if self.reward is None else self.reward.init(num_envs)
        return ConnectorsState(tuple(states), reward)

    def observe(
        self, state: ConnectorsState, obs: Any, episode_start: jax.Array, active: jax.Array
    ) -> tuple[Any, ConnectorsState]:
        """The observation connectors on ``N`` rows (``state``'s per-env rows theirs)."""
        new = []
        for connector, s in zip(self._obs_connectors, state.obs):
            obs, s = connector(s, obs, episode_start, active)
            new.append(s)
        return obs, state.replace(obs=tuple(new))

    def env_action(self, action: Any) -> Any:
        for connector in self.action:
            action = connector(action)
        return action

    def finish_sample(
        self,
        state: ConnectorsState,
        obs: Any,
        policy_obs: Any,
        next_obs: Any,
        reward: jax.Array,
        terminated: jax.Array,
        truncated: jax.Array,
        valid: jax.Array,
        *,
        gaps: bool = False,
    ) -> tuple[dict[str, Any], ConnectorsState]:
        """The per-sample part (pure; ``[T, B]`` inputs): the extras to add to the
        Trajectory and the state for the next sample. An invalid slot is, without
        ``gaps``, a failed step that cut its episode (seen truncated); with ``gaps``
        (agent slots, :func:`finish_group_sample`), an agent that completed no transition
        there: its episode goes on across it, and statistics skip it. The extras are zero
        at invalid slots: no transition, so nothing to bootstrap from or learn."""
        extras: dict[str, Any] = {}
        if self.obs:
            x = next_obs
            last = len(self._obs_connectors) - 1
            for i, (connector, s) in enumerate(zip(self._obs_connectors, state.obs)):
                x = connector.follow(s, policy_obs if i == last else None, x)
            extras[POLICY_NEXT_OBS] = x
        reward_state = state.reward
        if self.reward is not None:
            cut = truncated if gaps else truncated | ~valid
            scaled, reward_state = self.reward(
                self._reward_state(state), reward, terminated, cut, valid
            )
            extras[SCALED_REWARD] = scaled
        # Without gaps, the call a connector written for single-agent runners knows.
        extra = {"valid": valid} if gaps else {}
        obs_states = tuple(
            c.end_sample(s, obs if i == 0 else None, **extra)
            for i, (c, s) in enumerate(zip(self._obs_connectors, state.obs))
        )
        return jax.tree.map(lambda x: _zero_where_invalid(x, valid), extras), ConnectorsState(
            obs_states, reward_state
        )

    # -- state by name ---------------------------------------------------------------------------

    def state_dict(self, state: ConnectorsState) -> dict[str, ConnectorState]:
        """``state`` (``runner.get_connector_state()``) keyed by connector name: what to
        save, and what ``runner.set_connector_state`` takes back, also after connectors
        were added (the new ones keep their state)."""
        parts = [*state.obs, *(() if self.reward is None else (state.reward,))]
        return dict(zip(self.names, parts))

    def load_state(
        self,
        current: ConnectorsState,
        new: ConnectorsState | Mapping[str, ConnectorState],
        *,
        shared_only: bool = False,
    ) -> ConnectorsState:
        """``new`` (a :class:`ConnectorsState` of the same connectors, or a dict by name
        whose missing connectors keep ``current``'s state) checked against ``current``
        (structure, shapes, dtypes, finite floats) and returned as host arrays.
        ``shared_only``: take only the shared parts (statistics), the per-env rows staying
        ``current``'s (e.g. evaluation's envs)."""
        who = "set_connector_state(state)"
        named = self.state_dict(current)
        if isinstance(new, ConnectorsState):
            if len(new.obs) != len(current.obs) or (new.reward is None) != (current.reward is None):
                raise InvalidArgumentError(
                    f"{who}: expected the state of {len(self.names)} connectors "
                    f"{list(self.names)}, got a ConnectorsState of {len(new.obs)} observation "
                    f"connector(s) and {'no' if new.reward is None else 'a'} reward connector "
                    "(saved by other connectors?). Save state by name "
                    "(connectors.state_dict(state)) so it survives adding a connector."
                )
            given = self.state_dict(new)
        elif isinstance(new, Mapping):
            unknown = sorted(set(new) - set(named), key=str)
            if unknown:
                raise InvalidArgumentError(
                    f"{who}: no connector is named {unknown}; the connectors are "
                    f"{list(self.names)}. Rename the entries, or drop those of removed "
                    "connectors."
                )
            given = dict(new)
        else:
            raise InvalidArgumentTypeError(
                f"{who}: expected a ConnectorsState (runner.get_connector_state()) or a dict "
                f"by connector name (connectors.state_dict(...)), got {type(new).__name__}."
            )
        for name, value in given.items():
            if shared_only and isinstance(value, ConnectorState):
                value = named[name].replace(shared=value.shared)
            named[name] = check_state(who, name, named[name], value)
        obs = tuple(named[name] for name in self.obs_names)
        return ConnectorsState(obs, None if self.reward is None else named[self.names[-1]])

    # -- outside samples -------------------------------------------------------------------------

    def prime(self, state: ConnectorsState, obs: Any) -> ConnectorsState:
        """``state`` with ``obs`` (``[N, ...]`` env observations, e.g. from a few random
        steps) merged into the first observation connector's statistics, so that the first
        sample is normalized too. Refused unless the first connector has statistics."""
        first = self._obs_connectors[0] if self._obs_connectors else None
        prime = getattr(first, "prime", None)
        if not callable(prime):
            raise InvalidArgumentError(
                f"Connectors.prime: expected a first observation connector with statistics "
                f"(e.g. NormalizeObservation), got {type(first).__name__}. Nothing to prime."
            )
        primed = jax.device_get(prime(state.obs[0], obs))
        return state.replace(obs=(primed, *state.obs[1:]))

    def restart_episodes(self, state: ConnectorsState) -> ConnectorsState:
        """``state`` as every env starts a new episode outside a sample (a restore that
        cannot resume them): the reward connector's running returns restart."""
        if self.reward is None:
            return state
        return state.replace(reward=jax.device_get(self.reward.restart(self._reward_state(state))))

    def _reward_state(self, state: ConnectorsState) -> ConnectorState:
        if state.reward is None:
            raise InvalidArgumentError(
                f"Connectors: the reward connector {type(self.reward).__name__} has no state "
                "in this ConnectorsState (made by connectors without one?). Use the state of "
                "these connectors (connectors.init or runner.get_connector_state())."
            )
        return state.reward


def _zero_where_invalid(x: jax.Array, valid: jax.Array) -> jax.Array:
    mask = jnp.reshape(valid, valid.shape + (1,) * (jnp.ndim(x) - valid.ndim))
    return jnp.where(mask, x, jnp.zeros((), x.dtype))


def _snake(connector: object) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(connector).__name__).lower()


def finish_group_sample(
    connectors: Connectors, state: ConnectorsState, *inputs: Any
) -> tuple[dict[str, Any], ConnectorsState]:
    """:meth:`Connectors.finish_sample` for one agent group's ``[T, B, A_g, ...]`` arrays
    (``valid`` last), its agent slots as rows and invalid slots as gaps; the extras come
    back ``[T, B, A_g, ...]``."""
    t, b, a = inputs[-1].shape

    def rows(x: Any) -> jax.Array:
        return jnp.reshape(x, (t, b * a, *jnp.shape(x)[3:]))

    extras, state = connectors.finish_sample(state, *jax.tree.map(rows, inputs), gaps=True)
    return jax.tree.map(lambda x: x.reshape(t, b, a, *x.shape[2:]), extras), state
