"""EnvRunnerGroup: N EnvRunners as Ray actors, with weight sync and fault tolerance.

Each runner is built inside its actor from picklable factories (an env id or factory,
a policy factory and the params), so nothing unpicklable crosses a process or machine.
``sample()`` asks every healthy runner at once and gathers what they return;
``set_params()`` puts the new weights in Ray's object store once and hands every
runner the same reference. A runner that dies, raises, or does not answer within
``sample_timeout_s`` is killed and replaced by a new one (with the latest weights)
while the group goes on sampling from the others.

Ids. Runner ``i`` (of ``N``, ``n`` envs each) reports env ids ``i*n .. i*n+n-1``.
Its ``k``-th incarnation (0 at first, +1 per restart) uses seed
``seed + (k*N + i) * n``: no two runners or incarnations share a seed, so their sub-envs'
reset seeds (:func:`jaxrunner.env_seeds`) are unrelated blocks that do not overlap, and
its episode ids are ``((k*N + i) << 40) + local id``:
unique across runners and restarts.

Connector statistics (``runner_options={"connectors": ...}``, e.g. observation
normalization). Each runner reports the statistics it gathered in a sample beside the
sample; the group merges them exactly (parallel variance, in runner order) into one
global set, and :meth:`EnvRunnerGroup.set_params` broadcasts it with the weights, so
every runner then normalizes with the statistics of every runner's observations. A
restarted runner starts from the merged statistics.
"""

from jaxrunner._src.services.distributed.config import EPISODE_ID_BITS, EnvRunnerGroupConfig
from jaxrunner._src.services.distributed.group import (
    EnvRunnerGroup,
    aggregate_metrics,
    concatenate_envs,
)
from jaxrunner._src.services.distributed.worker import RunnerWorker

__all__ = [
    "EPISODE_ID_BITS",
    "EnvRunnerGroup",
    "EnvRunnerGroupConfig",
    "RunnerWorker",
    "aggregate_metrics",
    "concatenate_envs",
]
