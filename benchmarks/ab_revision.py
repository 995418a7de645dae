"""The sampler at a git revision against the working tree, side by side in one process
(or with ``--isolate``, each alone in processes of its own, taking turns).

On a shared machine, throughput measured in separate processes drifts by tens of
percent; a change of a few percent only shows when the two versions take turns in
one process. This copies ``jaxrunner/`` as of ``--base`` into a temporary package
(``jaxrunner_base``, its imports renamed), builds one ``EnvRunner`` of each package
per width (CartPole-v1, the benchmark MLP, the same seed), and times ``sample()``
blocks alternating between them. Several ``--env`` and ``--backend`` give every pair
of them, each at every width, in one run. Per width: microseconds per vector step
(median and minimum over blocks), the median of the per-pair speed-ups (base time /
new time), and whether the two produced identical trajectories.

Usage::

    python benchmarks/ab_revision.py --base HEAD~1
    python benchmarks/ab_revision.py --base 8a8fdb1 --num-envs 1 64 --blocks 60
    python benchmarks/ab_revision.py --base HEAD~1 --backend jax --num-envs 64 1024
    python benchmarks/ab_revision.py --base HEAD~1 --backend jaxmarl --env MPE_simple_spread_v3
    python benchmarks/ab_revision.py --base HEAD~1 --backend envpool \
        --env-kwargs '{"keep_reset_steps": true}'
    python benchmarks/ab_revision.py --base HEAD~1 --env mpe2:simple_spread_v3 --backend process
    python benchmarks/ab_revision.py --base HEAD~1 --workload pong --num-envs 8 32
    python benchmarks/ab_revision.py --base d660c28 --env null --num-envs 1 8 --split
    python benchmarks/ab_revision.py --base d660c28 --num-envs 1 8 --blocks 24 --repeats 3
    python benchmarks/ab_revision.py --base d660c28 --backend sync process \
        --env CartPole-v1 mpe2:simple_spread_v3 --repeats 2
    python benchmarks/ab_revision.py --base d660c28 --backend process --num-envs 64 --isolate 30

``--opcodes`` also counts the Python opcodes each version runs per vector step in one
``sample()`` (the calling thread): its own, by function, and the rest (the env,
gymnasium, numpy). The count does not drift with the machine: where timing cannot
tell a 2% change from the host's, the count can say where the work went.

``--env null`` steps an env that costs next to nothing (a constant observation, an
episode of 200 steps): what is left is each package's own time per step. ``--split``
adds each version's per-step split from the runner's own timers (env wait, inference,
observation and action processing); what no timer holds is the loop and the
per-sample work (compare two ``--rollout-length`` runs to size the latter). ``--repeats
N`` runs the whole A/B N times, each in a fresh process, and reports per width the
median of the runs' speed-ups with every run's row: on a shared machine, one run can
move by more than the few percent it measures. The runs alternate which version's runner
is built first (``--new-first`` builds the working tree's first in one run): on the
EnvPool backend the runner built second in a process ran slower (HEAD against itself:
0.88 built base first, 1.07 new first; at stop 103, with the backend raising glibc's
malloc arena limit, 1.00-1.03 and 0.99-1.00 at 64 and 256 envs:
``ab_revision_envpool_order_stop103_cpu.json``), so each width also reports each order's
median speed-up and ``speedup_both_orders``, their geometric mean, which cancels such a
bias; an even ``--repeats`` gives both orders as many runs. On the process backend both versions'
workers come from one fork server, preloaded as the version that started it asks (since
03023a1 the package also preloads jax and the script's imports there);
``--process-config '{"start_method": "spawn"}'`` gives every worker a fresh interpreter
instead (CartPole at 64 envs against ``d660c28``: 0.96-0.98 spawned, 0.95 forked, in one
sitting). ``--isolate N`` shares nothing between the versions: per width, N rounds of one
child process per version (its own imports, fork server and memory, as a user runs it),
alternating which goes first, and the median of the rounds' speed-ups; each child saves
its last sample for the comparison of trajectories. A round moves by several percent
with the process's own luck (0.88 to 1.08 on a 2-core host), so take 20 rounds or more:
that row read 0.988 over 30.

``--backend jax`` runs the scan sampler on gymnax's env of that name, ``jaxmarl`` the
multi-agent scan sampler on JaxMARL's (one policy for every agent; dones read as
truncations, as MPE's time limits are); both need the ``[gymnax,jaxmarl]`` extras. An
``--env`` written ``module:name`` is a PettingZoo parallel env (``mpe2:simple_spread_v3``:
``mpe2.simple_spread_v3.parallel_env()``) on a host backend, sampled by the
package's multi-agent runner with the benchmark MLP per policy group. ``--workload`` takes a
``jaxrunner bench`` workload's env (its EnvPool port on ``--backend envpool``) and its
policy instead (``pong``: NatureCNN; needs the ``atari`` extra), built by each package.
"""

from __future__ import annotations

import argparse
import collections
import gc
import importlib
import io
import itertools
import json
import os
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import Any

import gymnasium
import jax
import numpy as np
from script_report import parse_args, write_report

import jaxrunner

REPO = pathlib.Path(__file__).resolve().parent.parent
IMPORT = re.compile(r"^(\s*)(from|import) jaxrunner\b", re.MULTILINE)
MODULE_NAME = re.compile(r"""(["'])jaxrunner\.""")
"""A module named in a string (``importlib.import_module("jaxrunner._src...")``, as the
lazy ``__init__`` does): the base's, not the working tree's."""


def import_base(revision: str, into: pathlib.Path) -> Any:
    """``jaxrunner`` as of ``revision``, imported as ``jaxrunner_base``."""
    archive = subprocess.run(  # one git call for every file of the package
        ["git", "archive", revision, "jaxrunner/"], cwd=REPO, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            name, source = member.name, tar.extractfile(member).read()  # type: ignore[union-attr]
            target = into / name.replace("jaxrunner/", "jaxrunner_base/", 1)
            target.parent.mkdir(parents=True, exist_ok=True)
            if name.endswith(".py"):
                text = IMPORT.sub(r"\1\2 jaxrunner_base", source.decode())
                source = MODULE_NAME.sub(r"\1jaxrunner_base.", text).encode()
            target.write_bytes(source)
    sys.path.insert(0, str(into))
    # Worker processes and Ray actors import it too: they inherit PYTHONPATH.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(into), str(REPO), os.environ.get("PYTHONPATH")) if p
    )
    base = importlib.import_module("jaxrunner_base")
    # Every public name must load from the base: one that loaded the working tree's
    # would time the new code against itself.
    runner = base.EnvRunner
    if not runner.__module__.startswith("jaxrunner_base."):
        raise RuntimeError(f"jaxrunner_base.EnvRunner loaded from {runner.__module__}")
    return base


def make_envs(
    package: Any,
    env: Any,
    num_envs: int,
    backend: str,
    env_kwargs: dict | None = None,
    process_config: dict | None = None,
    ray_config: dict | None = None,
) -> Any:
    """The vector env, built the way ``package``'s ``make_vec`` takes Ray's options
    (typed ``config=`` since the send/recv rewrite, keyword arguments before);
    ``env_kwargs`` go to ``make_vec``; ``process_config``: the process backend's
    ``ProcessConfig(**process_config)``, built by ``package``; ``ray_config``: Ray's
    options over the defaults below (a PettingZoo env takes them only when given)."""
    ray_options = {
        "envs_per_actor": max(1, num_envs // 2),
        "num_cpus_per_actor": 0.1,
        **(ray_config or {}),
    }
    if backend == "ray" and ray_config and isinstance(env, str) and ":" in env:  # PettingZoo
        env_kwargs = {**(env_kwargs or {}), "config": package.RayConfig(**ray_options)}
    if process_config:
        config = package.ProcessConfig(**process_config)
        env_kwargs = {**(env_kwargs or {}), "config": config}
    if backend == "jax":
        import gymnax

        return package.JaxVectorEnv(*gymnax.make(env), num_envs)
    if backend == "jaxmarl":
        import jaxmarl

        return package.multi_agent.JaxMultiAgentVectorEnv(
            jaxmarl.make(env), num_envs, dones_are_truncations=True
        )
    if isinstance(env, str) and ":" in env:  # PettingZoo: make_multi_agent_vec until make_vec
        module, name = env.split(":")
        parallel_env = importlib.import_module(f"{module}.{name}").parallel_env
        make = getattr(package, "make_multi_agent_vec", package.make_vec)
        return make(parallel_env, num_envs, backend, **(env_kwargs or {}))
    if backend != "ray":
        return package.make_vec(env, num_envs, backend=backend, **(env_kwargs or {}))
    if hasattr(package, "RayConfig"):
        return package.make_vec(env, num_envs, "ray", config=package.RayConfig(**ray_options))
    return package.make_vec(env, num_envs, "ray", **ray_options)


class NullEnv(gymnasium.Env):
    """``--env null``: a constant observation, reward 1, truncated every 200 steps."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self) -> None:
        self._obs, self._t = np.zeros(4, np.float32), 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self._t = 0
        return self._obs, {}

    def step(self, action: Any) -> tuple:
        self._t += 1
        return self._obs, 1.0, False, self._t >= 200, {}


WORKLOAD_POLICIES = {
    "cartpole": lambda models, obs, act: models.mlp_policy(act),
    "pong": lambda models, obs, act: models.nature_cnn_policy(obs, act),
    "halfcheetah": lambda models, obs, act: models.gaussian_mlp_policy(act),
}
"""Each workload's policy (``jaxrunner._src.bench.workloads``), from a package's models."""


def multi_agent_runner(package: Any) -> Any:
    """The runner a user of ``package`` builds for a multi-agent env: ``EnvRunner`` once
    ``MultiAgentRunner`` became its deprecated alias, ``MultiAgentRunner`` before."""
    if issubclass(package.MultiAgentRunner, package.EnvRunner):
        return package.EnvRunner
    return package.MultiAgentRunner


def make_runner(
    package: Any,
    env: Any,
    num_envs: int,
    rollout_length: int,
    backend: str = "sync",
    env_kwargs: dict | None = None,
    process_config: dict | None = None,
    workload: str | None = None,
    runner_kwargs: dict | None = None,
    ray_config: dict | None = None,
) -> Any:
    runner_kwargs = runner_kwargs or {}
    envs = make_envs(package, env, num_envs, backend, env_kwargs, process_config, ray_config)
    # jr.models since the public/private split; the bench harness's policy before it.
    models = getattr(package, "models", None) or importlib.import_module(
        f"{package.__name__}.bench"
    )
    if backend == "jaxmarl":  # one policy for every agent group: the first group's spaces
        action_space, obs_space = envs.groups[0].action_space, envs.groups[0].observation_space
    elif isinstance(env, str) and ":" in env:  # PettingZoo: one policy per group
        policies = {g.policy_id: models.mlp_policy(g.action_space) for g in envs.groups}
        params = {
            g.policy_id: policies[g.policy_id].init(jax.random.key(0), g.observation_space)
            for g in envs.groups
        }
        runner = multi_agent_runner(package)(
            envs, policies, params, rollout_length, seed=0, **runner_kwargs
        )
        runner.sample()  # warm-up
        return runner
    else:
        action_space, obs_space = envs.single_action_space, envs.single_observation_space
    if workload is not None:
        policy = WORKLOAD_POLICIES[workload](models, obs_space, action_space)
    else:
        policy = models.mlp_policy(action_space)
    params = policy.init(jax.random.key(0), obs_space)
    make = multi_agent_runner(package) if backend == "jaxmarl" else package.EnvRunner
    runner = make(envs, policy, params, rollout_length, seed=0, **runner_kwargs)
    runner.sample()  # warm-up
    return runner


def time_block(runner: Any, samples: int, steps: int) -> float:
    """Microseconds per vector step over ``samples`` calls of ``sample()``."""
    start = time.perf_counter()
    for _ in range(samples):
        runner.sample()
    return (time.perf_counter() - start) / (samples * steps) * 1e6


def same_trajectories(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    """Whether two samples' leaves (``jax.tree.leaves`` order) hold the same values; a
    leaf past the shorter list is not compared (a later version may record more)."""
    return all(np.array_equal(x, y) for x, y in zip(a, b))


def opcodes_per_step(runner: Any, steps: int, package: Any) -> dict[str, Any]:
    """Python opcodes per vector step of one ``sample()`` in this thread: the package's
    own (in all, and by ``module:function``) and the rest."""
    root = str(pathlib.Path(package.__file__).parent) + os.sep
    own: collections.Counter[str] = collections.Counter()
    other = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal other
        if event == "call":
            frame.f_trace_opcodes = True
        elif event == "opcode":
            path = frame.f_code.co_filename
            if path.startswith(root):
                own[f"{path[len(root) :]}:{frame.f_code.co_name}"] += 1
            else:
                other += 1
        return trace

    gc.disable()  # a collection's finalizers would count in whichever version ran it
    sys.settrace(trace)
    try:
        runner.sample()
    finally:
        sys.settrace(None)
        gc.enable()
    by_function = {name: n / steps for name, n in own.most_common()}
    return {"own": sum(own.values()) / steps, "other": other / steps, "by_function": by_function}


def opcode_changes(counts: dict[str, dict[str, Any]], most: int = 12) -> list[list[Any]]:
    """The functions whose opcodes per step differ most: ``[name, base, new]``."""
    base, new = counts["base"]["by_function"], counts["new"]["by_function"]
    names = sorted(set(base) | set(new), key=lambda n: (-abs(new.get(n, 0) - base.get(n, 0)), n))
    return [[n, base.get(n, 0.0), new.get(n, 0.0)] for n in names[:most]]


def git(*command: str) -> str:
    return subprocess.run(
        ["git", *command], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()


def run_child(out: pathlib.Path, options: list[str]) -> list[dict[str, Any]]:
    """This script again in a fresh process, with ``options`` after the parent's own
    (argparse keeps an option's last value) and its report in ``out``: its results."""
    command = [sys.executable, __file__, *sys.argv[1:], *options, "--out", str(out)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["results"]


def repeated(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--repeats``: the whole A/B again in ``args.repeats`` fresh processes. Per width:
    the median over the runs of their speed-ups and times, whether every run sampled
    identical trajectories, and each run's own row under ``runs``."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeats):
            # Every other run builds the working tree's runner first.
            extra = ["--repeats", "1", *(["--new-first"] if k % 2 else [])]
            runs.append(run_child(pathlib.Path(tmp) / f"run{k}.json", extra))
    rows = []
    for per_run in zip(*runs):
        row = {k: per_run[0][k] for k in ("env", "backend", "main_process_envs", "num_envs")}
        for key in ("base_us_per_step_median", "new_us_per_step_median", "speedup_median"):
            row[key] = float(np.median([r[key] for r in per_run]))
        row["identical_trajectories"] = all(r["identical_trajectories"] for r in per_run)
        if "opcodes_per_step" in per_run[0]:  # a count, the same in every run
            row["opcodes_per_step"] = per_run[0]["opcodes_per_step"]
        row["runs"] = list(per_run)
        for first in ("base", "new"):  # each build order's speed-up: a bias between them shows
            ups = [r["speedup_median"] for r in per_run if r["built_first"] == first]
            row[f"speedup_{first}_built_first"] = float(np.median(ups)) if ups else None
        orders = (row["speedup_base_built_first"], row["speedup_new_built_first"])
        # An order's bias multiplies one way and divides the other: the geometric mean cancels it.
        row["speedup_both_orders"] = None if None in orders else float(np.sqrt(np.prod(orders)))
        rows.append(row)
        speedups = ", ".join(f"{r['speedup_median']:.3f}" for r in per_run)
        both = row["speedup_both_orders"]
        print(
            f"{row['env']} {row['backend']} {row['num_envs']:>5} envs: speed-ups {speedups}; "
            f"median {row['speedup_median']:.3f}"
            + ("" if both is None else f"; both build orders {both:.3f}"),
            file=sys.stderr,
        )
    return rows


def isolated(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--isolate N``: per case and width, N rounds of two child processes, one per
    version (each builds and times its own runner alone, with its own fork server and
    imports, as a user runs it), alternating which goes first. Per width: the median of
    the rounds' speed-ups (base time / new time), and whether every round's two children
    sampled the same trajectory."""
    envs = [args.workload] if args.workload else args.env
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for env_name, backend, num_envs in itertools.product(envs, args.backend, args.num_envs):
            case = ["--env", env_name, "--backend", backend, "--num-envs", str(num_envs)]
            rounds: list[dict[str, Any]] = []
            for k in range(args.isolate):
                times, samples = {}, []
                for name in ("base", "new") if k % 2 == 0 else ("new", "base"):
                    out = pathlib.Path(tmp) / f"{name}.json"
                    (child,) = run_child(out, [*case, "--isolate", "0", "--only", name])
                    times[name] = child[f"{name}_us_per_step_median"]
                    with np.load(out.with_suffix(".npz")) as leaves:
                        samples.append([leaves[f"arr_{i}"] for i in range(len(leaves.files))])
                rounds.append({
                    **{f"{n}_us_per_step_median": t for n, t in times.items()},
                    "speedup": times["base"] / times["new"],
                    "base_first": k % 2 == 0,
                    "identical_trajectories": same_trajectories(*samples),
                })  # fmt: skip
            speedups = [r["speedup"] for r in rounds]
            row = {
                "env": env_name,
                "backend": backend,
                "main_process_envs": args.main_process_envs,
                "num_envs": num_envs,
                **{
                    f"{n}_us_per_step_median": float(
                        np.median([r[f"{n}_us_per_step_median"] for r in rounds])
                    )
                    for n in ("base", "new")
                },
                "speedup_median": float(np.median(speedups)),
                "identical_trajectories": all(r["identical_trajectories"] for r in rounds),
                "rounds": rounds,
            }
            rows.append(row)
            print(
                f"{env_name} {backend} {num_envs:>5} envs, isolated: speed-ups "
                f"{', '.join(f'{x:.3f}' for x in speedups)}; median {row['speedup_median']:.3f}; "
                f"identical trajectories: {row['identical_trajectories']}",
                file=sys.stderr,
            )
    return rows


def case_env(args: argparse.Namespace, env_name: str, backend: str) -> tuple[Any, dict]:
    """The env a case steps and its ``make_vec`` options: ``env_name``'s, or with
    ``--workload`` the workload's (its EnvPool port on the envpool backend)."""
    env, env_kwargs = (NullEnv if env_name == "null" else env_name), args.env_kwargs
    if args.workload is not None:
        from jaxrunner._src.bench.workloads import get_workload

        work = get_workload(args.workload)
        env = work.envpool_id if backend == "envpool" else work.make
        if backend == "envpool":
            env_kwargs = {**work.envpool_kwargs, **env_kwargs}
    return env, env_kwargs


def measure(
    args: argparse.Namespace, versions: dict[str, Any], env_name: str, backend: str, num_envs: int
) -> dict[str, Any]:
    """One case at one width: both versions' runners timed in alternating blocks."""
    env, env_kwargs = case_env(args, env_name, backend)
    process_config = dict(args.process_config)
    if args.main_process_envs:
        process_config["main_process_envs"] = args.main_process_envs
    runners = {
        k: make_runner(
            p,
            env,
            num_envs,
            args.rollout_length,
            backend,
            env_kwargs,
            process_config,
            args.workload,
            args.runner_kwargs,
            args.ray_config,
        )
        for k, p in versions.items()
    }
    # About 4k env steps per block, at least one sample.
    samples = max(1, 4096 // (args.rollout_length * num_envs))
    times: dict[str, list[float]] = {k: [] for k in runners}
    splits: dict[str, list[dict[str, float]]] = {k: [] for k in runners}
    steps = dict.fromkeys(runners, args.rollout_length)  # make_runner's warm-up
    for block in range(args.blocks):
        order = ("base", "new") if block % 2 == 0 else ("new", "base")
        for name in (n for n in order if n in runners):  # one, in an --isolate child
            before = runners[name].get_metrics()["perf"] if args.split else {}
            times[name].append(time_block(runners[name], samples, args.rollout_length))
            if args.split:  # the timers are means over every step so far
                after = runners[name].get_metrics()["perf"]
                n0, n1 = steps[name], steps[name] + samples * args.rollout_length
                split = {k: (after[k] * n1 - before[k] * n0) / (n1 - n0) for k in after}
                splits[name].append({k.removesuffix("_ms"): v * 1e3 for k, v in split.items()})
                steps[name] = n1
    samples = {k: [np.asarray(x) for x in jax.tree.leaves(r.sample())] for k, r in runners.items()}
    same = same_trajectories(samples["base"], samples["new"]) if len(samples) == 2 else None
    counts = {  # after the same samples, so both step through the same states
        k: opcodes_per_step(runners[k], args.rollout_length, versions[k])
        for k in runners
        if args.opcodes
    }
    for runner in runners.values():
        runner.stop()
    row = {
        "env": env_name,
        "backend": backend,
        "main_process_envs": args.main_process_envs,
        "num_envs": num_envs,
        **{f"{k}_us_per_step_median": float(np.median(v)) for k, v in times.items()},
        **{f"{k}_us_per_step_min": float(np.min(v)) for k, v in times.items()},
        "built_first": next(iter(versions)),
    }
    if same is None:  # an --isolate child: one version; its sample goes beside its report
        np.savez(args.out.with_suffix(".npz"), *next(iter(samples.values())))
        return row
    row["speedup_median"] = float(np.median(np.array(times["base"]) / np.array(times["new"])))
    row["identical_trajectories"] = same
    if counts:
        row["opcodes_per_step"] = {
            k: {"own": c["own"], "other": c["other"]} for k, c in counts.items()
        }
        row["opcodes_per_step"]["changes"] = opcode_changes(counts)
        print(
            f"{env_name} {backend} {num_envs:>5} envs: opcodes per step, jaxrunner's own: base "
            f"{counts['base']['own']:.1f}, new {counts['new']['own']:.1f}; the rest: "
            f"base {counts['base']['other']:.1f}, new {counts['new']['other']:.1f}",
            file=sys.stderr,
        )
    if args.split:  # us per step, each phase's median over blocks
        for name, parts in splits.items():
            row[f"{name}_split_us_per_step"] = {
                k: float(np.median([p[k] for p in parts])) for k in parts[0]
            }
    print(
        f"{env_name} {backend} {num_envs:>5} envs: base {row['base_us_per_step_median']:.1f} "
        f"us/step, new {row['new_us_per_step_median']:.1f} (medians); speed-up "
        f"{row['speedup_median']:.3f}; identical trajectories: {same}",
        file=sys.stderr,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision to compare against")
    parser.add_argument(
        "--env",
        nargs="+",
        default=["CartPole-v1"],
        help="gymnasium ids, module:name (PettingZoo) or null: each on every --backend",
    )
    parser.add_argument(
        "--workload",
        choices=tuple(WORKLOAD_POLICIES),
        default=None,
        help="a jaxrunner bench workload's env and policy instead of --env and the MLP",
    )
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument(
        "--backend",
        nargs="+",
        choices=("sync", "process", "gymnasium", "envpool", "ray", "jax", "jaxmarl"),
        default=["sync"],
    )
    parser.add_argument(
        "--env-kwargs", type=json.loads, default={}, help="for make_vec, as JSON: '{\"a\": 1}'"
    )
    parser.add_argument("--rollout-length", type=int, default=64)
    parser.add_argument(
        "--main-process-envs",
        type=int,
        default=None,
        help="backend process: ProcessConfig(main_process_envs=...) (the main process's share)",
    )
    parser.add_argument(
        "--process-config",
        type=json.loads,
        default={},
        help="backend process: more ProcessConfig options, as JSON: '{\"ready_first\": true}'",
    )
    parser.add_argument(
        "--ray-config",
        type=json.loads,
        default={},
        help="backend ray: RayConfig options over envs_per_actor=num_envs // 2 and "
        "num_cpus_per_actor=0.1, as JSON: '{\"ready_first\": true}'",
    )
    parser.add_argument(
        "--runner-kwargs",
        type=json.loads,
        default={},
        help="for both runners, as JSON: '{\"num_splits\": 2}'",
    )
    parser.add_argument(
        "--split",
        action="store_true",
        help="also each version's per-step split (the runner's perf timers, us per step, "
        "medians over blocks): where a difference goes",
    )
    parser.add_argument(
        "--opcodes",
        action="store_true",
        help="also the Python opcodes each version runs per vector step (its own, by "
        "function, and the rest): a count that does not drift with the machine",
    )
    parser.add_argument("--blocks", type=int, default=40, help="timed blocks per version")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of the whole A/B, each in a fresh process; per width, the median of "
        "their speed-ups (one run on a shared machine moves by more than a few percent)",
    )
    parser.add_argument(
        "--isolate",
        type=int,
        default=0,
        help="N rounds per width of one child process per version, alternating which "
        "runs first (no fork server, import or memory shared between the versions); "
        "per width, the median of the rounds' speed-ups",
    )
    parser.add_argument(
        "--only", choices=("base", "new"), default=None, help=argparse.SUPPRESS
    )  # an --isolate child's one version
    parser.add_argument(
        "--new-first",
        action="store_true",
        help="build the working tree's runner before the base's (--repeats alternates: "
        "on the EnvPool backend the runner built second runs slower)",
    )
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parse_args(parser)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: expected a number of runs >= 1")
    if args.new_first and args.repeats > 1:
        parser.error("--new-first: --repeats alternates the build order itself; leave it out")
    # Recorded as commits: "HEAD" or "HEAD~1" says nothing once HEAD has moved.
    args.base_commit = git("rev-parse", "--verify", f"{args.base}^{{commit}}")
    changed = bool(git("status", "--porcelain", "--", "jaxrunner/"))
    args.new = f"{git('rev-parse', 'HEAD')}{' with uncommitted changes' if changed else ''}"

    if args.only and not args.out:
        parser.error("--only: the child writes its report and sample beside --out")
    if args.isolate and (args.repeats > 1 or args.split or args.opcodes):
        parser.error("--isolate: leave out --repeats, --split and --opcodes")
    if args.isolate:
        write_report("ab_revision", args, isolated(args))
        return
    if args.repeats > 1:
        write_report("ab_revision", args, repeated(args))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.only == "new":  # an --isolate child: the working tree alone
            versions = {"new": jaxrunner}
        elif args.only == "base":
            versions = {"base": import_base(args.base, pathlib.Path(tmp))}
        else:
            base = import_base(args.base, pathlib.Path(tmp))
            versions = {"base": base, "new": jaxrunner}
            if args.new_first:
                versions = {"new": jaxrunner, "base": base}
        envs = [args.workload] if args.workload else args.env  # a workload names its env
        for env_name, backend in itertools.product(envs, args.backend):
            rows += [measure(args, versions, env_name, backend, n) for n in args.num_envs]
    write_report("ab_revision", args, rows)


if __name__ == "__main__":
    main()
