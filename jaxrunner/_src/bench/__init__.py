"""``jaxrunner bench``: is jaxrunner faster than the loop a user writes by hand, and
where does its time go?

Per width: jaxrunner's ``EnvRunner.sample()`` at its defaults; the recording hand
loop (``hand_loop.py``: the same jitted policy, ``np.asarray``, ``[T, B]`` numpy
buffers, JAX at its defaults; for pure-JAX envs a gymnax ``lax.scan``,
``hand_scan.py``); the policy-bound ceiling (raw env + one bare policy call); and the
split of a jaxrunner step into env, policy with transfers, recording and the rest.
Each system runs in a long-lived child process (``child.py``) with its own JAX
settings, timed in interleaved rounds (``rounds.py``); ``benchmark.py`` runs it all,
``report.py`` prints tables and a one-line verdict. The benchmark scripts in
``benchmarks/`` share the policy, the hand loop and the report helpers.

For a PettingZoo env (``--env mpe2:simple_spread_v3``): ``MultiAgentRunner.sample()``
against the hand-written PettingZoo loop, on the sync and process backends
(``multi_agent.py``). ``--workload cartpole|pong|halfcheetah``: a real workload's envs
and policy for every system (``workloads.py``); ``peer_loops.py`` drives the peer
libraries (PufferLib, EnvPool's async mode) by hand for ``benchmarks/peers.py``.
"""

from jaxrunner._src.bench.benchmark import BenchConfig, plans_for, run
from jaxrunner._src.bench.hand_loop import REFERENCES, RecordingHandLoop, hand_loop, reference_envs
from jaxrunner._src.bench.hand_scan import build_hand_scan
from jaxrunner._src.bench.multi_agent import MultiAgentHandLoop, env_factory
from jaxrunner._src.bench.policy import MLP, hand_act, mlp_policy
from jaxrunner._src.bench.report import (
    add_cpu_dispatch_option,
    autogroup,
    format_backend,
    format_report,
    machine_info,
    parse_args,
    verdict,
    write_report,
)
from jaxrunner._src.bench.rounds import (
    MULTI_AGENT_PLANS,
    PLANS,
    Harness,
    LocalSystem,
    Plan,
    measure_width,
)
from jaxrunner._src.bench.timing import interleaved_rates, rollout_length, timed, us_per_call
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
    "add_cpu_dispatch_option",
    "autogroup",
    "build_hand_scan",
    "env_factory",
    "format_backend",
    "format_report",
    "hand_act",
    "hand_loop",
    "interleaved_rates",
    "machine_info",
    "measure_width",
    "mlp_policy",
    "parse_args",
    "plans_for",
    "reference_envs",
    "rollout_length",
    "run",
    "timed",
    "us_per_call",
    "verdict",
    "Workload",
    "get_workload",
    "write_report",
]
