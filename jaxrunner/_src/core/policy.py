"""Policies as pure functions: ``apply_fn(params, obs, carry, keys) -> (action, extras, carry)``,
batched over envs."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces

from jaxrunner._src import space_arrays
from jaxrunner._src.arg_checks import check_int, check_space
from jaxrunner._src.core import distributions
from jaxrunner._src.core.module_policy import (
    ApplyFn,
    Carry,
    DistributionFn,
    EvaluateFn,
    InitFn,
    LogProbFn,
    Params,
    acting_fn,
    module_policy_fns,
)
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError


def one_row_args(policy: Policy, params: Any, observation_space: spaces.Space) -> tuple:
    """``policy.apply_fn``'s arguments for one zero row of ``observation_space`` (to
    trace it abstractly: ``jax.eval_shape(policy.apply_fn, *one_row_args(...))``)."""
    keys = jax.random.split(jax.random.key(0), 1)
    return params, space_arrays.allocate(observation_space, (1,)), policy.batched_carry(1), keys


@dataclasses.dataclass(frozen=True)
class Policy:
    """A pure policy.

    Attributes:
        apply_fn: ``(params, obs, carry, keys) -> (action, extras, carry)``, batched
            over envs: ``obs`` a pytree of ``[B, ...]`` arrays, ``keys`` one PRNG key per
            env (``[B]``), ``carry`` the recurrent state (a pytree of ``[B, ...]``
            arrays; ``None`` for a feed-forward policy), ``extras`` a dict of ``[B, ...]``
            arrays stored with each transition (``log_prob``, and ``value`` when the
            module gives one). Must be jittable; the runner jits it once and passes
            params as an argument, so new params never retrace.
        init_fn: ``(key, obs, carry) -> params`` given a batch of one dummy obs (and
            one carry); used by :meth:`init`. Optional if you build params yourself.
        initial_carry: one env's recurrent state (no batch axis), or ``None`` for a
            feed-forward policy. Each env's carry is reset to it at episode start.
        log_prob_fn: ``(params, obs, carry, action) -> log_prob [B]``: the
            log-probability of given actions (chosen elsewhere, e.g. logged by an
            external env). Optional; ``from_linen``/``from_nnx`` set it.
        evaluate_fn: ``(params, obs, carry, action) -> {"log_prob", "entropy",
            ["value"]}``, each ``[B]``: what a policy-gradient learner needs of stored
            actions under new params. Optional; ``from_linen``/``from_nnx`` set it.
        distribution_fn: ``(params, obs, carry) -> (distribution, value, carry)``: the
            action distribution (``Categorical``, ``DiagGaussian``, ...: a class whose fields
            are its parameters), the value ``[B]`` (``None`` without a value head) and
            the next carry. Powers :meth:`distribution`, :meth:`value` and
            :meth:`deterministic`. Optional; ``from_linen``/``from_nnx`` set it.
        action_ndim: see the attribute.
    """

    apply_fn: ApplyFn
    init_fn: InitFn | None = None
    initial_carry: Carry = None
    log_prob_fn: LogProbFn | None = None
    evaluate_fn: EvaluateFn | None = None
    distribution_fn: DistributionFn | None = None
    action_ndim: int | None = None
    """The number of axes of one env's action (``len(action_space.shape)``), which lets
    :meth:`evaluate` take any leading batch shape; ``from_linen``/``from_nnx`` set it."""

    def __post_init__(self) -> None:
        for name in ("apply_fn", "init_fn", "log_prob_fn", "evaluate_fn"):
            value = getattr(self, name)
            if not callable(value) and (name == "apply_fn" or value is not None):
                none = "" if name == "apply_fn" else " or None"
                raise InvalidArgumentTypeError(
                    f"Policy({name}=...): expected a function{none}, got {value!r}. Build a "
                    "Policy with Policy.from_linen/from_nnx, or pass apply_fn=(params, obs, "
                    "carry, keys) -> (action, extras, carry)."
                )

    def evaluate(
        self, params: Params, obs: Any, action: Any, carry: Carry = None
    ) -> dict[str, jax.Array]:
        """Log-probability and entropy of ``action`` given ``obs`` (and the value, when
        the module gives one) under ``params``: ``{"log_prob", "entropy", ["value"]}``.
        Jittable and differentiable in ``params`` (a PPO loss uses it).

        Any leading batch shape (e.g. a Trajectory's ``[T, B]``) gives results of that
        shape, read off the action's rank where ``action_ndim`` is known (``from_linen``/
        ``from_nnx``); without it, one batch axis."""
        if self.evaluate_fn is None:
            raise InvalidArgumentError(
                "Policy.evaluate: this Policy has no evaluate_fn; build it with "
                "Policy.from_linen/from_nnx or pass evaluate_fn=(params, obs, carry, action) "
                "-> dict."
            )
        if self.action_ndim is None:
            return self.evaluate_fn(params, obs, carry, action)
        batch_ndim = jnp.ndim(action) - self.action_ndim
        if batch_ndim < 1:
            raise InvalidArgumentError(
                f"Policy.evaluate(action=...): expected actions of shape [*batch, "
                f"<{self.action_ndim} action axes>], got shape {jnp.shape(action)}. Pass a "
                "batch of actions (e.g. action[None] for one)."
            )
        fn = self.evaluate_fn
        source = f"of the actions, {batch_ndim} axes before the action space's {self.action_ndim}"
        trees = (action, obs, carry)  # the batch is read off the actions, named in errors
        return _over_batch(lambda a, o, c: fn(params, o, c, a), batch_ndim, *trees, source=source)

    def distribution(
        self, params: Params, obs: Any, carry: Carry = None
    ) -> distributions.Distribution:
        """The action distribution at a batch of observations ``[B, ...]``, the one
        ``apply_fn`` samples from: e.g. ``Categorical(logits)`` or ``DiagGaussian(mean,
        log_std)``, with ``sample(keys)``, ``mode()``, ``log_prob(action)`` and
        ``entropy()``. Jittable; for ``[T, B, ...]`` observations ``jax.vmap`` it over
        the time axis."""
        return self._distribution_fn("distribution")(params, obs, carry)[0]

    def value(
        self, params: Params, obs: Any, carry: Carry = None, *, batch_ndim: int = 1
    ) -> jax.Array:
        """The critic's value of observations ``[*batch, ...]`` with ``batch_ndim``
        leading batch axes (``batch_ndim=2``: a Trajectory's ``[T, B]``, e.g. the
        ``next_value`` :func:`jaxrunner.gae` takes). Jittable and differentiable."""
        batch_ndim = check_int(
            "Policy.value", "batch_ndim", batch_ndim,
            hint="the number of leading batch axes of obs: 2 for a Trajectory's [T, B, ...]",
        )  # fmt: skip
        fn = self._distribution_fn("value")
        value = _over_batch(lambda o, c: fn(params, o, c)[1], batch_ndim, obs, carry)
        if value is None:
            raise InvalidArgumentError(
                "Policy.value: the policy module has no value head. Return (out, value) or "
                "a dict with a 'value' entry from the module to have one."
            )
        return value

    def deterministic(self) -> Policy:
        """This policy acting with its distribution's mode instead of sampling: the
        argmax of the logits (Discrete, MultiDiscrete), ``logits > 0`` (MultiBinary),
        the mean (Box). Same params, same ``extras`` (``log_prob`` of the mode action,
        ``value``); use it to evaluate a trained policy (:func:`jaxrunner.evaluate`)."""
        distribution_fn = self._distribution_fn("deterministic")
        # The same function each time, so a runner built again compiles nothing again.
        _, apply_fn = _recent(
            _MODE_ACTING,
            id(distribution_fn),
            lambda kept: kept[0] is distribution_fn,
            lambda: (distribution_fn, acting_fn(distribution_fn, True)),
        )
        return dataclasses.replace(self, apply_fn=apply_fn)

    def _distribution_fn(self, what: str) -> DistributionFn:
        if self.distribution_fn is None:
            raise InvalidArgumentError(
                f"Policy.{what}: this Policy has no distribution_fn; build it with "
                "Policy.from_linen/from_nnx or pass distribution_fn=(params, obs, carry) -> "
                "(distribution, value_or_None, carry)."
            )
        return self.distribution_fn

    def init(self, key: jax.Array, observation_space: spaces.Space) -> Params:
        """Initial params for observations of ``observation_space`` (a single env's)."""
        if self.init_fn is None:
            raise InvalidArgumentError(
                "Policy.init: this Policy has no init_fn; build params yourself or pass "
                "init_fn=(key, obs, carry) -> params."
            )
        check_space("Policy.init", "observation_space", observation_space)
        if not _is_key(key):  # (an int reached flax as "RNGs should be of shape (2,)")
            raise InvalidArgumentTypeError(
                f"Policy.init(key={key!r:.40}): expected a JAX random key, e.g. jax.random.key(0)."
            )
        obs = space_arrays.allocate(observation_space, (1,))
        return self.init_fn(key, obs, self.batched_carry(1))

    def recording_carry(self, name: str = "carry") -> Policy:
        """This recurrent policy with each step's carry (the one it acted from, reset
        at episode starts) also in ``extras[name]``: a trajectory then holds what
        :meth:`evaluate` takes as ``carry``, step for step
        (``policy.evaluate(params, traj.obs, traj.action, traj.extras["carry"])``)."""
        if self.initial_carry is None:
            raise InvalidArgumentError(
                "Policy.recording_carry(): the policy is feed-forward (initial_carry=None), "
                "so it has no carry to record."
            )
        return dataclasses.replace(self, apply_fn=_recording_carry(self.apply_fn, name))

    def batched_carry(self, num_envs: int) -> Carry:
        """``initial_carry`` repeated for ``num_envs`` envs (``None`` if feed-forward)."""
        if self.initial_carry is None:
            return None
        return jax.tree.map(
            lambda c: jnp.broadcast_to(jnp.asarray(c), (num_envs, *jnp.shape(c))),
            self.initial_carry,
        )

    @classmethod
    def from_linen(
        cls,
        module: Any,
        action_space: spaces.Space,
        *,
        deterministic: bool = False,
        initial_carry: Carry = None,
    ) -> Policy:
        """Wraps a ``flax.linen`` module that maps a batch of observations to the
        parameters of the action distribution.

        The module's output (``out``) is one of:

        * an array: logits (Discrete, MultiDiscrete with all components' logits
          concatenated, MultiBinary) or the mean (Box);
        * a tuple ``(out, value)`` with ``value`` of shape ``[B]`` or ``[B, 1]``;
        * a dict with ``"logits"`` or ``"mean"``, and optionally ``"log_std"`` (Box;
          otherwise a learned state-independent log-std is used) and ``"value"``.

        Recurrent modules (``initial_carry`` given) are called as
        ``module(carry, obs) -> (carry, out)``, like flax's RNN cells.

        Args:
            module: the linen module.
            action_space: a single env's action space; picks the distribution.
            deterministic: act with the distribution's mode instead of sampling (the
                same as ``Policy.from_linen(...).deterministic()``).
            initial_carry: one env's initial recurrent state, for recurrent modules.
        """

        if isinstance(module, type) or not callable(getattr(module, "apply", None)):
            got = f"the class {module.__name__}" if isinstance(module, type) else repr(module)
            raise InvalidArgumentTypeError(
                f"Policy.from_linen(module=...): expected a flax.linen module instance, got "
                f"{got:.80}; construct it first, e.g. Policy.from_linen(MyModule(), space)."
            )
        check_space("Policy.from_linen", "action_space", action_space)
        recurrent = initial_carry is not None

        def fns(init: Callable[..., Params]) -> dict[str, Any]:
            return module_policy_fns(module.apply, init, action_space, deterministic, recurrent)

        try:
            hash(module)
        except TypeError:  # a module with an unhashable field: its own functions
            return cls._with_fns(fns(jax.jit(module.init)), action_space, initial_carry)
        # An equal module on an equal space gets the same functions: nothing recompiles.
        _, shared_fns = _recent(
            _LINEN_FNS,
            (module, type(action_space), action_space.shape, deterministic, recurrent),
            lambda kept: _same_space(kept[0], action_space),
            lambda: (action_space, fns(functools.partial(_init_linen, module))),
        )
        return cls._with_fns(shared_fns, action_space, initial_carry)

    @classmethod
    def from_nnx(
        cls,
        module: Any,
        action_space: spaces.Space,
        *,
        deterministic: bool = False,
        initial_carry: Carry = None,
    ) -> Policy:
        """Like :meth:`from_linen`, for a constructed ``flax.nnx`` module. Its state
        (from ``nnx.split``) becomes the params; ``init`` returns the module's current
        state (nnx modules are initialised when constructed), whatever the key."""
        from flax import nnx

        check_space("Policy.from_nnx", "action_space", action_space)
        graphdef, state = nnx.split(module)

        def call(module_params: Params, *inputs: Any) -> Any:
            return nnx.merge(graphdef, module_params)(*inputs)

        fns = module_policy_fns(
            call, lambda *_: state, action_space, deterministic, initial_carry is not None
        )
        return cls._with_fns(fns, action_space, initial_carry)

    @classmethod
    def _with_fns(
        cls, fns: dict[str, Any], action_space: spaces.Space, initial_carry: Carry
    ) -> Policy:
        """A Policy of a module's functions (``module_policy_fns``)."""
        return cls(**fns, initial_carry=initial_carry, action_ndim=len(action_space.shape or ()))


_LINEN_FNS: dict[tuple, tuple[spaces.Space, dict[str, Any]]] = {}
"""The functions of the policies ``from_linen`` built last, by module, action space
(type and shape; equality checked), mode and recurrence."""
_MODE_ACTING: dict[int, tuple[DistributionFn, ApplyFn]] = {}
"""The ``apply_fn`` of :meth:`Policy.deterministic` by ``distribution_fn`` (its id),
those made last."""
_MAX_KEPT = 64


def _recent(
    table: dict, key: Hashable, same: Callable[[Any], bool], make: Callable[[], Any]
) -> Any:
    """``table[key]`` where ``same`` holds of it, else ``make()``, stored there (the
    last ``_MAX_KEPT`` keys used are kept)."""
    kept = table.pop(key, None)
    if kept is None or not same(kept):
        kept = make()
    table[key] = kept  # the most recent last
    while len(table) > _MAX_KEPT:
        del table[next(iter(table))]
    return kept


def _is_key(key: Any) -> bool:
    """A typed key (``jax.random.key``), or a raw one (``PRNGKey``: ``uint32[2]``, or
    ``uint32[4]`` for the rbg implementations)."""
    if not isinstance(key, jax.Array | np.ndarray):
        return False
    return jnp.issubdtype(key.dtype, jax.dtypes.prng_key) or (
        key.dtype == jnp.uint32 and key.ndim == 1
    )


def _same_space(a: spaces.Space, b: spaces.Space) -> bool:
    try:
        return bool(a == b)
    except Exception:  # a space that cannot compare: never the same
        return False


@functools.partial(jax.jit, static_argnums=0)
def _init_linen(module: Any, key: jax.Array, *inputs: Any) -> Params:
    """``module.init`` compiled whole (eager, each initializer compiles its own)."""
    return module.init(key, *inputs)


def _over_batch(
    fn: Callable[..., Any], batch_ndim: int, *trees: Any, source: str = "of the first input"
) -> Any:
    """``fn`` (written for one batch axis) on ``trees`` with ``batch_ndim`` leading batch
    axes (those of the first leaf: ``source`` says whose), flattened into one and
    restored on each output leaf."""
    if batch_ndim == 1:
        return fn(*trees)
    leaves = jax.tree.leaves(trees)
    batch = tuple(jnp.shape(leaves[0])[:batch_ndim]) if leaves else ()
    for leaf in leaves:
        if tuple(jnp.shape(leaf)[:batch_ndim]) != batch or jnp.ndim(leaf) < batch_ndim:
            raise InvalidArgumentError(
                f"Policy: expected every input with the leading batch shape {batch} ({source}),"
                f" got one of shape {jnp.shape(leaf)}. Pass obs, action and carry with the "
                "same leading axes."
            )
    size = int(np.prod(batch))

    def flat(x: Any) -> Any:
        return jnp.reshape(x, (size, *jnp.shape(x)[batch_ndim:]))

    out = fn(*jax.tree.map(flat, trees))
    return jax.tree.map(lambda x: jnp.reshape(x, (*batch, *jnp.shape(x)[1:])), out)


@functools.cache  # one function per policy and name: runners built again compile nothing
def _recording_carry(apply_fn: ApplyFn, name: str) -> ApplyFn:
    def apply(params: Params, obs: Any, carry: Carry, keys: jax.Array) -> Any:
        action, extras, next_carry = apply_fn(params, obs, carry, keys)
        if name in extras:
            raise InvalidArgumentError(
                f"Policy.recording_carry(name={name!r}): the policy's extras already have "
                f"{name!r}; pick another name."
            )
        return action, {**extras, name: carry}, next_carry

    return apply
