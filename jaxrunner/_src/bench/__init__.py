"""``jaxrunner bench``: is jaxrunner faster than the loop a user writes by hand, and
where does its time go?

Per width: jaxrunner's ``EnvRunner.sample()`` at its defaults; the recording hand
loop (``hand_loop.py``: the same jitted policy, ``np.asarray``, ``[T, B]`` numpy
buffers, JAX at its defaults; for pure-JAX envs a gymnax ``lax.scan``,
``hand_scan.py``); the policy-bound ceiling (raw env + one bare policy call); and the
split of a jaxrunner step into env, policy with transfers, recording and the rest.
Each system runs in a long-lived child process (``child.py``, building ``systems.py``)
with its own JAX settings, timed in interleaved rounds (``rounds.py``);
``benchmark.py`` runs it all, ``report.py`` prints tables and a one-line verdict,
``plot.py`` draws steps/s against envs (``--plot``).

For a PettingZoo env (``--env mpe2:simple_spread_v3``): ``MultiAgentRunner.sample()``
against the hand-written PettingZoo loop, on the sync and process backends
(``multi_agent.py``). ``--workload cartpole|pong|halfcheetah``: a real workload's envs
and policy for every system (``workloads.py``). The peer libraries' loops and the
benchmark scripts' own helpers are in ``benchmarks/``, which builds on this package.
"""

from jaxrunner._src.bench.benchmark import (
    BenchConfig as BenchConfig,
)
from jaxrunner._src.bench.benchmark import (
    plans_for as plans_for,
)
from jaxrunner._src.bench.benchmark import (
    run as run,
)
from jaxrunner._src.bench.hand_loop import (
    REFERENCES as REFERENCES,
)
from jaxrunner._src.bench.hand_loop import (
    RecordingHandLoop as RecordingHandLoop,
)
from jaxrunner._src.bench.hand_loop import (
    reference_envs as reference_envs,
)
from jaxrunner._src.bench.hand_scan import build_hand_scan as build_hand_scan
from jaxrunner._src.bench.machine import autogroup as autogroup
from jaxrunner._src.bench.machine import machine_info as machine_info
from jaxrunner._src.bench.multi_agent import (
    MultiAgentHandLoop as MultiAgentHandLoop,
)
from jaxrunner._src.bench.multi_agent import (
    env_factory as env_factory,
)
from jaxrunner._src.bench.policy import MLP as MLP
from jaxrunner._src.bench.policy import hand_act as hand_act
from jaxrunner._src.bench.policy import mlp_policy as mlp_policy
from jaxrunner._src.bench.report import (
    format_backend as format_backend,
)
from jaxrunner._src.bench.report import (
    format_report as format_report,
)
from jaxrunner._src.bench.report import (
    verdict as verdict,
)
from jaxrunner._src.bench.rounds import (
    MULTI_AGENT_PLANS as MULTI_AGENT_PLANS,
)
from jaxrunner._src.bench.rounds import (
    PLANS as PLANS,
)
from jaxrunner._src.bench.rounds import (
    Harness as Harness,
)
from jaxrunner._src.bench.rounds import (
    LocalSystem as LocalSystem,
)
from jaxrunner._src.bench.rounds import (
    Plan as Plan,
)
from jaxrunner._src.bench.rounds import (
    measure_width as measure_width,
)
from jaxrunner._src.bench.timing import (
    rollout_length as rollout_length,
)
from jaxrunner._src.bench.timing import (
    timed as timed,
)
from jaxrunner._src.bench.timing import (
    us_per_call as us_per_call,
)
from jaxrunner._src.bench.workloads import (
    WORKLOADS as WORKLOADS,
)
from jaxrunner._src.bench.workloads import (
    Workload as Workload,
)
from jaxrunner._src.bench.workloads import (
    get_workload as get_workload,
)
