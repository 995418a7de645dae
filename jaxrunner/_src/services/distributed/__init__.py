"""EnvRunnerGroup: N EnvRunners as Ray actors, with weight and connector-statistics sync
and fault tolerance. See docs/distributed.md."""

from jaxrunner._src.services.distributed.config import EnvRunnerGroupConfig as EnvRunnerGroupConfig
from jaxrunner._src.services.distributed.group import EnvRunnerGroup as EnvRunnerGroup
