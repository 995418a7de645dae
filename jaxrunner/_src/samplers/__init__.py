"""Samplers: a backend plus the compiled policy step, turned into trajectories.

``lockstep`` (the host loop with pipelined splits), ``ready_first`` (whichever envs
answered) and ``scan`` (pure JAX) behind one small interface (:mod:`.sampler`), one
episode numbering (:mod:`.episodes`), and the :class:`~jaxrunner.EnvRunner` facade
(:mod:`.runner`) that picks one from the backend's declared capabilities.
"""

from jaxrunner._src.runner.env_runner import EnvRunner

__all__ = ["EnvRunner"]
