"""``backend="ray"``: sub-envs in Ray actors, stepped at their own pace (ready-first). See
docs/backends/ray.md."""

from jaxrunner._src.backends.ray.config import RayConfig as RayConfig
from jaxrunner._src.backends.ray.config import import_ray as import_ray
from jaxrunner._src.backends.ray.vector_env import RayVectorEnv as RayVectorEnv
