"""``backend="process"``: sub-envs in worker processes, data in shared memory, one small
command and reply per step on each worker's Unix socket. See docs/backends/process.md."""

from jaxrunner._src.backends.process.config import DEFAULT_SPIN_WAIT_US as DEFAULT_SPIN_WAIT_US
from jaxrunner._src.backends.process.config import ProcessConfig as ProcessConfig
from jaxrunner._src.backends.process.config import main_process_share as main_process_share
from jaxrunner._src.backends.process.config import spin_wait_s as spin_wait_s
from jaxrunner._src.backends.process.launch import worker_bounds as worker_bounds
from jaxrunner._src.backends.process.make import make_process_vec as make_process_vec
from jaxrunner._src.backends.process.protocol import RemoteTraceback as RemoteTraceback
from jaxrunner._src.backends.process.vector_env import ProcessVectorEnv as ProcessVectorEnv
