"""``jaxrunner bench``: is jaxrunner faster than the loop a user writes by hand, and
where does its time go? See docs/performance.md."""

from jaxrunner._src.bench.benchmark import BenchConfig as BenchConfig
from jaxrunner._src.bench.benchmark import check_env_id as check_env_id
from jaxrunner._src.bench.benchmark import plans_for as plans_for
from jaxrunner._src.bench.benchmark import run as run
from jaxrunner._src.bench.hand_loop import REFERENCES as REFERENCES
from jaxrunner._src.bench.hand_loop import RecordingHandLoop as RecordingHandLoop
from jaxrunner._src.bench.hand_loop import build_hand_scan as build_hand_scan
from jaxrunner._src.bench.hand_loop import hand_act as hand_act
from jaxrunner._src.bench.multi_agent import MultiAgentHandLoop as MultiAgentHandLoop
from jaxrunner._src.bench.multi_agent import env_factory as env_factory
from jaxrunner._src.bench.report import format_report as format_report
from jaxrunner._src.bench.report import verdict as verdict
from jaxrunner._src.bench.rounds import MULTI_AGENT_PLANS as MULTI_AGENT_PLANS
from jaxrunner._src.bench.rounds import PLANS as PLANS
from jaxrunner._src.bench.rounds import Harness as Harness
from jaxrunner._src.bench.rounds import measure_width as measure_width
from jaxrunner._src.bench.timing import autogroup as autogroup
from jaxrunner._src.bench.timing import machine_info as machine_info
from jaxrunner._src.bench.timing import rollout_length as rollout_length
from jaxrunner._src.bench.timing import timed as timed
from jaxrunner._src.bench.workloads import get_workload as get_workload
from jaxrunner.models import MLP as MLP
from jaxrunner.models import mlp_policy as mlp_policy
