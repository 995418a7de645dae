"""backend="process" from notebooks and scripts: factories defined in ``__main__``
travel by value, and a script without ``if __name__ == "__main__":`` gets an error
that says how to fix it. Each case runs a small program in a fresh interpreter."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

ENV_CLASS = """
import gymnasium as gym
import numpy as np
import jaxrunner as jr

class Tiny(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.full(2, 0.5, np.float32), {}

    def step(self, action):
        return np.full(2, float(action) / 2, np.float32), 1.0, False, False, {}
"""

RUN = """
envs = jr.make_vec(Tiny, num_envs=2, backend="process", config=jr.ProcessConfig(num_workers=2))
obs, _ = envs.reset(seed=0)
obs, reward, *_ = envs.step(np.array([1, 0]))
print("OK", obs.tolist(), reward.tolist())
envs.close()
"""


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_class_defined_in_a_notebook_like_main_reaches_the_workers(tmp_path: Path) -> None:
    """``python -c`` has a ``__main__`` with no file, as a notebook kernel does: the
    class cannot be imported in a worker, so it must travel by value."""
    result = run(["-c", ENV_CLASS + RUN], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "OK [[0.5, 0.5], [0.0, 0.0]] [1.0, 1.0]" in result.stdout


def test_class_defined_in_a_guarded_script_reaches_the_workers(tmp_path: Path) -> None:
    script = tmp_path / "guarded.py"
    body = textwrap.indent(RUN.strip(), "    ")
    script.write_text(ENV_CLASS + '\n\nif "__main__" == __name__:\n' + body + "\n")
    result = run([str(script)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout


def test_a_guarded_scripts_imports_are_loaded_once_by_the_fork_server(tmp_path: Path) -> None:
    """Each worker runs the script again (Python before 3.14), and finds the modules it
    imports at its top level already loaded by the fork server it forked from."""
    (tmp_path / "helper.py").write_text("import os\n\nIMPORTED_IN = os.getpid()\n")
    script = tmp_path / "imports.py"
    run_it = """
import os
envs = jr.make_vec(Tiny, num_envs=2, backend="process", config=jr.ProcessConfig(num_workers=2))
print("SEEN", (os.getpid(), envs.call("seen")))
envs.close()
"""
    seen = "import helper\nimport os\n\nTiny.seen = lambda _: (helper.IMPORTED_IN, os.getpid())\n"
    body = textwrap.indent(run_it.strip(), "    ")
    script.write_text(ENV_CLASS + seen + '\n\nif __name__ == "__main__":\n' + body + "\n")
    result = run([str(script)], tmp_path)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("SEEN"))
    main_pid, seen_by = ast.literal_eval(line.removeprefix("SEEN"))  # ((in, worker), ...)
    imported_in = {imported_in for imported_in, _ in seen_by}
    workers = {worker for _, worker in seen_by}
    assert len(workers) == 2 and len(imported_in) == 1, f"imported by each worker: {seen_by}"
    assert not imported_in & {main_pid, *workers}  # by the fork server


@pytest.mark.parametrize("wrapped", [False, True], ids=["top_level", "main_function"])
def test_unguarded_script_says_how_to_fix_it(tmp_path: Path, wrapped: bool) -> None:
    script = tmp_path / "unguarded.py"
    code = RUN
    if wrapped:  # a main() called from the top level, still without the guard
        code = "def main():\n" + textwrap.indent(RUN.strip(), "    ") + "\n\nmain()\n"
    script.write_text(ENV_CLASS + code)
    result = run([str(script)], tmp_path)
    assert result.returncode != 0
    assert "InvalidArgumentError" in result.stderr
    assert 'if __name__ == "__main__":' in result.stderr
    assert f"{script}" in result.stderr
    assert "could not start" not in result.stderr
    assert "OK" not in result.stdout


# backend="auto" measured as taking workers, whatever this machine measures: a step of
# 1 ms and 2 CPUs (one worker per 300 us of work, at most one per CPU but one).
AUTO_TAKES_WORKERS = """
from jaxrunner._src.backends import auto
auto.measure_env_step_us = lambda *args, **kwargs: 1000.0
auto.available_cpus = lambda: 2
"""

AUTO_CALLS = {
    "make_vec": 'envs = jr.make_vec(Tiny, num_envs=2, backend="auto")\n',
    "from_env": (
        "policy = jr.models.mlp_policy(Tiny.action_space)\n"
        "params = policy.init(jax.random.key(0), Tiny.observation_space)\n"
        "runner = jr.EnvRunner.from_env(Tiny, 2, policy, params, rollout_length=4, seed=0)\n"
    ),
}


@pytest.mark.parametrize("call", sorted(AUTO_CALLS))
def test_unguarded_script_hears_that_auto_chose_the_process_backend(
    tmp_path: Path, call: str
) -> None:
    """The caller never wrote backend="process": the error names "auto" as what chose
    it, and both ways out (the guard, or backend="sync")."""
    script = tmp_path / "unguarded_auto.py"
    code = ENV_CLASS + "import jax\n" + AUTO_TAKES_WORKERS + AUTO_CALLS[call] + 'print("OK")\n'
    script.write_text(code)
    result = run([str(script)], tmp_path)
    assert result.returncode != 0
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("jaxrunner.errors.InvalidArgumentError: ")
    caller = {"make_vec": "make_vec", "from_env": "EnvRunner.from_env"}[call]
    assert f'{caller}(backend="auto"' in error
    assert "chose the process backend (2,000 us of env work per step: 1 worker" in error
    assert f"top level of {script} (line {len(code.splitlines()) - 1})" in error  # the call
    assert 'if __name__ == "__main__":' in error and 'backend="sync"' in error
    assert "backend='process' was started" not in error
    assert "OK" not in result.stdout
