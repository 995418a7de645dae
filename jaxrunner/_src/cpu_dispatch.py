"""Inline CPU dispatch: the one JAX setting that matters most to a CPU-hosted sampler.

By default JAX's CPU backend runs each computation on an XLA worker thread and the
caller waits for it (asynchronous dispatch). For a training step that is free; for
a sampler's policy step, a few microseconds of work called once per env step, the
two thread hand-offs cost more than the computation itself. On a shared 2-core
machine the runner's policy call took a median 34 us inline against 56 us dispatched
(``benchmarks/step_costs.py``), and CartPole sampling ran 1.1-1.7x faster at 1 to 256
envs (``docs/performance.md``, CPU dispatch).

JAX reads the setting once, when its CPU backend starts, so it cannot be switched
per runner, only for the whole process. Since the samples are what a user came for,
``import jaxrunner`` makes inline the default (:func:`default_to_inline_cpu_dispatch`),
where that is safe: JAX has not started yet, and nobody chose a mode. Choosing is
setting ``JAX_CPU_ENABLE_ASYNC_DISPATCH`` in the environment (``=1`` keeps JAX's
asynchronous default), or calling :func:`use_async_cpu_dispatch` or
:func:`use_inline_cpu_dispatch` before the first JAX computation. The cost for other
JAX code in the process: a CPU computation no longer overlaps with the Python that
queued it, which matters only for long CPU computations queued back to back.
Accelerator backends (GPU/TPU) are not affected.
"""

from __future__ import annotations

import os

import jax

from jaxrunner.errors import DispatchConfigError

_FLAG = "jax_cpu_enable_async_dispatch"
ENV_VAR = "JAX_CPU_ENABLE_ASYNC_DISPATCH"
"""The environment variable JAX reads for the mode; when it is set, jaxrunner keeps it."""


def _backends_started() -> bool | None:
    """Whether JAX's backends have started; None where this JAX cannot tell."""
    try:  # not public API
        from jax._src.xla_bridge import backends_are_initialized
    except ImportError:
        return None
    return bool(backends_are_initialized())


def default_to_inline_cpu_dispatch() -> bool:
    """Switches JAX to inline CPU dispatch unless that is unsafe or someone chose:
    JAX's backends already started (the switch would not take effect), or
    ``JAX_CPU_ENABLE_ASYNC_DISPATCH`` is set. ``import jaxrunner`` calls it first
    thing. Returns whether it switched."""
    if ENV_VAR in os.environ or inline_cpu_dispatch() or _backends_started() is not False:
        return False  # chosen, already inline, started, or unknown: the setting is left
    jax.config.update(_FLAG, False)
    return True


def use_inline_cpu_dispatch() -> None:
    """Makes JAX run CPU computations inline, in the calling thread (for the whole
    process): the default after ``import jaxrunner`` unless JAX had already started
    or ``JAX_CPU_ENABLE_ASYNC_DISPATCH`` is set. Call it first thing, before any JAX
    computation, ``jax.devices()`` or ``policy.init``; calling it again later is
    harmless.

    Raises:
        DispatchConfigError: JAX's backends already started with asynchronous CPU
            dispatch, so the setting could no longer take effect.
    """
    _switch(inline=True)


def use_async_cpu_dispatch() -> None:
    """Makes JAX run CPU computations asynchronously (JAX's own default), for the
    whole process: for a program whose long CPU computations gain from being queued
    back to back. Call it before any JAX computation; harmless when already async.

    Raises:
        DispatchConfigError: JAX's backends already started with inline CPU dispatch.
    """
    _switch(inline=False)


def _switch(inline: bool) -> None:
    if inline_cpu_dispatch() == inline:
        return
    if _backends_started():
        mode, call = ("inline", "use_inline") if inline else ("async", "use_async")
        now = "asynchronous" if inline else "inline"
        raise DispatchConfigError(
            f"{call}_cpu_dispatch(): JAX's CPU backend has already started with {now} "
            f"dispatch, and JAX reads this setting only at start-up. Call "
            f"jaxrunner.cpu_dispatch.{call}_cpu_dispatch() before any JAX computation (right "
            f"after the imports), or set {ENV_VAR}={int(not inline)} in the environment, to get "
            f"{mode} dispatch."
        )
    jax.config.update(_FLAG, not inline)


def inline_cpu_dispatch() -> bool:
    """Whether JAX runs CPU computations inline (``use_inline_cpu_dispatch``)."""
    return not jax.config.values.get(_FLAG, True)
