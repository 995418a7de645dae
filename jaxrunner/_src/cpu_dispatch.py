"""Inline CPU dispatch, the default ``import jaxrunner`` sets where it safely can, and the
switches. See :mod:`jaxrunner.cpu_dispatch`."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from typing import Any

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
    """Switches JAX to inline CPU dispatch unless JAX's backends already started or
    ``JAX_CPU_ENABLE_ASYNC_DISPATCH`` is set; before ``import jax``, it runs right after
    that import instead (a Ray actor that steps envs with numpy never loads JAX). Returns
    whether it switched now."""
    if "jax" not in sys.modules:
        sys.meta_path.insert(0, _AfterJaxImport())
        return False
    if ENV_VAR in os.environ or inline_cpu_dispatch() or _backends_started() is not False:
        return False  # chosen, already inline, started, or unknown: the setting is left
    _jax().config.update(_FLAG, False)
    return True


class _AfterJaxImport(importlib.abc.MetaPathFinder):
    """Finds ``jax`` as the other finders do, and calls the default once it has loaded
    (it stays until then: ``importlib.util.find_spec("jax")`` alone loads nothing)."""

    finding = False

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "jax" or self.finding:
            return None
        self.finding = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.finding = False
        if spec is not None and spec.loader is not None:
            load = spec.loader.exec_module

            def exec_module(module: Any) -> None:
                if self in sys.meta_path:
                    sys.meta_path.remove(self)
                load(module)
                default_to_inline_cpu_dispatch()

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def use_inline_cpu_dispatch() -> None:
    """Makes JAX run CPU computations inline, in the calling thread (for the whole
    process). Call it before any JAX computation, ``jax.devices()`` or ``policy.init``;
    harmless when already inline.

    Raises:
        DispatchConfigError: JAX's backends already started with asynchronous CPU
            dispatch, so the setting could no longer take effect.
    """
    _switch(inline=True)


def use_async_cpu_dispatch() -> None:
    """Makes JAX run CPU computations asynchronously (JAX's own default), for the
    whole process. Call it before any JAX computation; harmless when already async.

    Raises:
        DispatchConfigError: JAX's backends already started with inline CPU dispatch.
    """
    _switch(inline=False)


def _switch(inline: bool) -> None:
    if inline_cpu_dispatch() == inline:
        return
    if _backends_started():
        mode, now = ("inline", "asynchronous") if inline else ("async", "inline")
        raise DispatchConfigError(
            f"use_{mode}_cpu_dispatch(): JAX's CPU backend has already started with {now} "
            f"dispatch, and JAX reads this setting only at start-up. Call "
            f"jaxrunner.cpu_dispatch.use_{mode}_cpu_dispatch() before any JAX computation (right "
            f"after the imports), or set {ENV_VAR}={int(not inline)} in the environment, to get "
            f"{mode} dispatch."
        )
    _jax().config.update(_FLAG, not inline)


def inline_cpu_dispatch() -> bool:
    """Whether JAX runs CPU computations inline (``use_inline_cpu_dispatch``)."""
    return not _jax().config.values.get(_FLAG, True)


def _jax() -> Any:
    import jax  # here, not at the top: see default_to_inline_cpu_dispatch

    return jax
