"""``backend="process"``: sub-envs in worker processes, data in shared memory.

Each worker process owns a contiguous block of sub-envs. Observations, rewards,
flags and actions live in one shared-memory block that the workers write in place
(:mod:`.shared`); per step, each worker gets one small command on its Unix socket and
answers with one small reply, plus pickled infos only when an env returned a
non-empty info (:mod:`.wire`). ``docs/performance.md`` (the signal between processes)
compares this signalling with the alternatives (pipes, semaphores, spinning on shared
flags).

Workers start with ``forkserver`` (or ``spawn``), never a plain ``fork`` of the
main process, which may have started JAX's threads (:mod:`.launch`). They end on
``close()``, when the vector env is garbage collected, at interpreter exit, and on
their own when the main process dies (their socket reaches EOF).

``send``/``recv`` let the runner keep several splits of the workers stepping while it
computes the policy of another group (lockstep), or take whichever worker answers
first (``ProcessConfig(ready_first=True)``). With ``ProcessConfig(main_process_envs=k)``
the main process steps the first ``k`` sub-envs itself while the workers step the
rest (:mod:`.local_share`). Where every process has a CPU of its own, each side
busy-waits a little for the other's message before it sleeps
(``ProcessConfig(spin_wait_us=...)``): a sleeping process takes tens of microseconds
to wake.

Modules, main side first: :mod:`.config` (``ProcessConfig``), :mod:`.local_share` (the
main process's share, and the backend ``make_vec`` builds), :mod:`.vector_env`
(the ``VectorEnv`` facade, composed of the three next), :mod:`.stepping` (``send``
and ``recv``), :mod:`.recovery` (lost workers: replacement and accounting),
:mod:`.pool` (commands and replies), :mod:`.handle` (one worker process), :mod:`.remote` (worker
errors rebuilt here), :mod:`.launch` (arguments, start method); shared by both
sides: :mod:`.wire`, :mod:`.shared`; the worker side: :mod:`.worker`.
"""

from jaxrunner._src.backends.process.config import (
    DEFAULT_SPIN_WAIT_US,
    ProcessConfig,
    main_process_share,
    spin_wait_s,
)
from jaxrunner._src.backends.process.launch import (
    DEFAULT_STEP_TIMEOUT_S,
    START_METHODS,
    EnvFactory,
    default_num_workers,
    pickle_factories,
    worker_bounds,
)
from jaxrunner._src.backends.process.local_share import LocalShareVectorEnv, make_process_vec
from jaxrunner._src.backends.process.vector_env import ProcessVectorEnv
from jaxrunner._src.backends.process.worker_errors import RemoteTraceback

__all__ = [
    "DEFAULT_SPIN_WAIT_US",
    "DEFAULT_STEP_TIMEOUT_S",
    "START_METHODS",
    "EnvFactory",
    "LocalShareVectorEnv",
    "ProcessConfig",
    "ProcessVectorEnv",
    "RemoteTraceback",
    "default_num_workers",
    "main_process_share",
    "make_process_vec",
    "pickle_factories",
    "spin_wait_s",
    "worker_bounds",
]
