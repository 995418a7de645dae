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

from jaxrunner._src.bench.benchmark import BenchConfig, plans_for, run
from jaxrunner._src.bench.hand_loop import REFERENCES, RecordingHandLoop, reference_envs
from jaxrunner._src.bench.hand_scan import build_hand_scan
from jaxrunner._src.bench.machine import autogroup, machine_info
from jaxrunner._src.bench.multi_agent import MultiAgentHandLoop, env_factory
from jaxrunner._src.bench.policy import MLP, hand_act, mlp_policy
from jaxrunner._src.bench.report import format_backend, format_report, verdict
from jaxrunner._src.bench.rounds import (
    MULTI_AGENT_PLANS,
    PLANS,
    Harness,
    LocalSystem,
    Plan,
    measure_width,
)
from jaxrunner._src.bench.timing import rollout_length, timed, us_per_call
from jaxrunner._src.bench.workloads import WORKLOADS, Workload, get_workload

__all__ = [
    "MLP",
    "MULTI_AGENT_PLANS",
    "PLANS",
    "REFERENCES",
    "WORKLOADS",
    "BenchConfig",
    "Harness",
    "LocalSystem",
    "MultiAgentHandLoop",
    "Plan",
    "RecordingHandLoop",
    "Workload",
    "autogroup",
    "build_hand_scan",
    "env_factory",
    "format_backend",
    "format_report",
    "get_workload",
    "hand_act",
    "machine_info",
    "measure_width",
    "mlp_policy",
    "plans_for",
    "reference_envs",
    "rollout_length",
    "run",
    "timed",
    "us_per_call",
    "verdict",
]
