"""How JAX dispatches CPU computations in this process, and the switches.

``import jaxrunner`` switches JAX to *inline* CPU dispatch, for the whole process,
unless JAX's backends already started or ``JAX_CPU_ENABLE_ASYNC_DISPATCH`` is set in
the environment. What changes for your own JAX code: a CPU computation runs in the
calling thread, so it no longer overlaps with the Python that queued it. That
matters only for long CPU computations queued back to back; GPU and TPU computations
are not affected. A sampler's policy step is a few microseconds of work called once
per env step, and there the thread hand-offs of asynchronous dispatch cost more than
the computation (sampling CartPole ran 1.1-1.7x faster inline at 1 to 256 envs).

To keep JAX's own default, set ``JAX_CPU_ENABLE_ASYNC_DISPATCH=1`` in the environment,
or call :func:`use_async_cpu_dispatch` right after the imports, before any JAX
computation. JAX reads the setting once, when its CPU backend starts.
"""

from jaxrunner._src.cpu_dispatch import (
    ENV_VAR,
    inline_cpu_dispatch,
    use_async_cpu_dispatch,
    use_inline_cpu_dispatch,
)

__all__ = ["ENV_VAR", "inline_cpu_dispatch", "use_async_cpu_dispatch", "use_inline_cpu_dispatch"]
