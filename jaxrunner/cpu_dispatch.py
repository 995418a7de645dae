"""How JAX dispatches CPU computations in this process: ``import jaxrunner`` switches to
inline CPU dispatch unless JAX already started or ``JAX_CPU_ENABLE_ASYNC_DISPATCH`` is set;
these are the switches."""

from jaxrunner._src.cpu_dispatch import (
    ENV_VAR,
    inline_cpu_dispatch,
    use_async_cpu_dispatch,
    use_inline_cpu_dispatch,
)

__all__ = ["ENV_VAR", "inline_cpu_dispatch", "use_async_cpu_dispatch", "use_inline_cpu_dispatch"]
