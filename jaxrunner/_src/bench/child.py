"""Child processes that host the measured systems, each with its own JAX settings:
one JSON request per line on stdin, one JSON reply per line on stdout."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from typing import IO, Any

from jaxrunner._src.cpu_dispatch import ENV_VAR as ASYNC_DISPATCH_VARIABLE
from jaxrunner.errors import JaxRunnerError


class ChildError(JaxRunnerError, RuntimeError):
    """A benchmark child failed: a request raised there, or the process died."""


class Child:
    """The parent's handle on one child process: at JAX's defaults (``jax_defaults``,
    the hand loops) or with this process's environment, as a user runs jaxrunner;
    ``command``: a peer library's server speaking the same protocol."""

    def __init__(
        self, name: str, *, jax_defaults: bool, command: Sequence[str] | None = None
    ) -> None:
        self.name = name
        env = dict(os.environ)
        # The child imports the same jaxrunner as this process (3 folders above this file).
        root = str(pathlib.Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        if jax_defaults:  # JAX keeps its own default, and import jaxrunner leaves it alone
            env[ASYNC_DISPATCH_VARIABLE] = "true"
        # The child's stderr, for the message if it dies; closed by close().
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        self._process = subprocess.Popen(
            list(command or [sys.executable, "-m", "jaxrunner._src.bench"]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            text=True,
        )

    def send(self, op: str, **fields: Any) -> None:
        """Sends a request; :meth:`receive` gets its reply (children work at once)."""
        assert self._process.stdin is not None
        try:
            self._process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self._process.stdin.flush()
        except BrokenPipeError as err:
            raise self._died() from err

    def receive(self) -> Any:
        """The reply to the oldest request not yet answered (ChildError if it failed)."""
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            raise self._died()
        reply = json.loads(line)
        if not reply["ok"]:
            raise ChildError(f"benchmark child {self.name!r}: {reply['error']}")
        return reply["result"]

    def request(self, op: str, **fields: Any) -> Any:
        self.send(op, **fields)
        return self.receive()

    def _died(self) -> ChildError:
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # its output closed, yet it lives on: end it
            self._process.kill()
            self._process.wait()
        self._stderr.seek(0)
        tail = self._stderr.read().decode(errors="replace")[-3000:]
        return ChildError(
            f"benchmark child {self.name!r} exited (code {self._process.returncode}); "
            f"its stderr ends:\n{tail}"
        )

    def close(self) -> None:
        if self._process.poll() is None:
            try:
                self.send("exit")
                self._process.wait(timeout=30)
            except Exception:
                self._process.kill()
                self._process.wait()
        for stream in (self._process.stdin, self._process.stdout, self._stderr):
            if stream is not None:
                stream.close()

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(build: Callable[[Any], Any] | None = None) -> None:
    """Serves requests from stdin until told to exit, building systems with ``build``
    (``Spec -> system`` with ``measure(seconds)`` and ``close()``; None: bench's own)."""
    from jaxrunner._src.bench.systems import Spec
    from jaxrunner._src.bench.systems import build as build_system
    from jaxrunner._src.bench.timing import machine_info

    build = build_system if build is None else build
    # Replies need a clean stdout: keep it for them, and send anything else printed
    # (libraries, C code) to stderr.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    systems: dict[str, Any] = {}
    for line in sys.stdin:
        request = json.loads(line)
        op, name = request["op"], request.get("name")
        try:
            if op == "exit":
                break
            if op == "info":
                machine = machine_info()
                result: Any = {
                    "cpu_dispatch": machine["jax_cpu_dispatch"],
                    ASYNC_DISPATCH_VARIABLE: os.environ.get(ASYNC_DISPATCH_VARIABLE),
                    "machine": machine,
                }
            elif op == "build":
                if name in systems:
                    systems.pop(name).close()
                start = time.perf_counter()
                systems[name] = build(Spec(**request["spec"]))
                result = {"build_s": time.perf_counter() - start}
            elif op == "measure":
                # CPU seconds (this process's, not workers') move less with others' load.
                cpu, wall = time.process_time(), time.perf_counter()
                result = systems[name].measure(float(request["seconds"]))
                result["cpu_s"] = time.process_time() - cpu
                result["wall_s"] = time.perf_counter() - wall
            elif op == "close":
                systems.pop(name).close()
                result = None
            else:
                raise ValueError(f"unknown op {op!r}")
            reply = {"ok": True, "result": result}
        except Exception as err:
            traceback.print_exc()
            reply = {"ok": False, "error": f"{op} {name or ''}: {type(err).__name__}: {err}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    for system in systems.values():
        system.close()
