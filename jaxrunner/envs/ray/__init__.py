"""``backend="ray"``: sub-envs in Ray actors, stepped at their own pace (ready-first).

Modules: :mod:`.config` (``RayConfig``, Ray's import), :mod:`.vector_env` (the
``VectorEnv``: ``send``/``recv``), :mod:`.actors` (starting, replacing and killing
the actors), :mod:`.actor` (an actor's body: a ``SyncVectorEnv``).
"""

from jaxrunner.envs.ray.actor import EnvWorker
from jaxrunner.envs.ray.config import RayConfig, RayEnvConfig, import_ray
from jaxrunner.envs.ray.vector_env import RayVectorEnv

__all__ = ["EnvWorker", "RayConfig", "RayEnvConfig", "RayVectorEnv", "import_ray"]
