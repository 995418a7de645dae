"""``backend="ray"``: sub-envs in Ray actors, stepped at their own pace (ready-first).

Modules: :mod:`.config` (``RayConfig``, Ray's import), :mod:`.vector_env` (the
``VectorEnv``: ``send``/``recv``), :mod:`.actor_manager` (starting, replacing and
killing the actors), :mod:`.env_actor` (an actor's body: a ``SyncVectorEnv``),
:mod:`.deadlines` (step timeouts); multi-agent: :mod:`.agents` (the driver side) and
:mod:`.agent_env_actor` (an actor's body).
"""

from jaxrunner._src.backends.ray.config import RayConfig, import_ray
from jaxrunner._src.backends.ray.env_actor import EnvWorker
from jaxrunner._src.backends.ray.vector_env import RayVectorEnv

__all__ = ["EnvWorker", "RayConfig", "RayVectorEnv", "import_ray"]
