"""How JAX dispatches CPU computations in this process, and the switches.

``import jaxrunner`` switches JAX to *inline* CPU dispatch for the whole process (a CPU
computation runs in the calling thread: no overlap with the Python that queued it; GPU
and TPU are not affected), unless JAX's backends already started or
``JAX_CPU_ENABLE_ASYNC_DISPATCH`` is set. To keep JAX's default, set it to ``1``, or call
:func:`use_async_cpu_dispatch` before any JAX computation (README: "What ``import
jaxrunner`` changes").
"""

from jaxrunner._src.cpu_dispatch import (
    ENV_VAR,
    inline_cpu_dispatch,
    use_async_cpu_dispatch,
    use_inline_cpu_dispatch,
)

__all__ = ["ENV_VAR", "inline_cpu_dispatch", "use_async_cpu_dispatch", "use_inline_cpu_dispatch"]
