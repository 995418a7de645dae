"""Inline CPU dispatch: the one JAX setting that matters most to a CPU-hosted sampler.

By default JAX's CPU backend runs each computation on an XLA worker thread and the
caller waits for it (asynchronous dispatch). For a training step that is free; for
a sampler's policy step, a few microseconds of work called once per env step, the
two thread hand-offs cost more than the computation itself. On a shared 2-core
machine the runner's policy call took a median 34 us inline against 56 us dispatched
(``benchmarks/step_costs.py``), and CartPole sampling ran 1.1-1.7x faster at 1 to 256
envs (``benchmarks/cpu_dispatch.py``).

JAX reads the setting once, when its CPU backend starts, so it cannot be switched
per runner: :func:`use_inline_cpu_dispatch` switches it for the whole process, and
must run before the first JAX computation. The cost for other JAX code in the
process: a CPU computation no longer overlaps with the Python that queued it.
Accelerator backends (GPU/TPU) are not affected.
"""

from __future__ import annotations

import jax

from jaxrunner.errors import DispatchConfigError

_FLAG = "jax_cpu_enable_async_dispatch"


def _backends_started() -> bool:
    try:  # not public API; without it the check is skipped, not wrong
        from jax._src.xla_bridge import backends_are_initialized
    except ImportError:
        return False
    return bool(backends_are_initialized())


def use_inline_cpu_dispatch() -> None:
    """Makes JAX run CPU computations inline, in the calling thread (for the whole
    process). Call it first thing, before any JAX computation, ``jax.devices()``
    or ``policy.init``; calling it again later is harmless.

    Raises:
        DispatchConfigError: JAX's backends already started with asynchronous CPU
            dispatch, so the setting could no longer take effect.
    """
    if inline_cpu_dispatch():
        return
    if _backends_started():
        raise DispatchConfigError(
            "use_inline_cpu_dispatch(): JAX's CPU backend has already started with "
            "asynchronous dispatch, and JAX reads this setting only at start-up. Call "
            "jaxrunner.use_inline_cpu_dispatch() before any JAX computation (right after "
            "the imports), or leave dispatch asynchronous."
        )
    jax.config.update(_FLAG, False)


def inline_cpu_dispatch() -> bool:
    """Whether JAX runs CPU computations inline (``use_inline_cpu_dispatch``)."""
    return not jax.config.values.get(_FLAG, True)


__all__ = ["inline_cpu_dispatch", "use_inline_cpu_dispatch"]
