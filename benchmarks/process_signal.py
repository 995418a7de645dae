"""Which signal between the main process and env workers costs least?

The process backend moves data through shared memory; what remains per step is a
signal each way ("step rows lo:hi" to a worker, "done" back). Candidates:

* ``mp_pipe``: ``multiprocessing.Pipe(duplex=False)``, ``send_bytes``/``recv_bytes``.
* ``os_pipe``: raw ``os.pipe`` file descriptors, fixed-size ``os.write``/``os.read``.
* ``socketpair``: one Unix ``socket.socketpair()`` per worker, fixed-size ``sendall``/
  ``recv(MSG_WAITALL)`` (what the process backend uses: one fd each way, EOF when
  either side dies, and it can pass the shared-memory fd).
* ``semaphore``: a ``multiprocessing.Semaphore`` per direction (futex-based).
* ``spin``: sequence counters in shared memory, both sides busy-wait.
* ``spin_yield``: the same, with ``os.sched_yield()`` in the wait loop.
* ``spin_then_pipe``: busy-wait on the shared counter for ``--spin-us``, then block on
  a raw pipe; the sender always writes the counter and a pipe byte, so no wake-up is
  ever lost (the receiver drains the byte once it sees the counter).

Each round, the main process does ``main_us`` of CPU work (the policy), sends a step
command to every worker, and waits for all replies; each worker steps its share of
CartPole-v1 envs (real work) per command. Scenarios vary the number of workers,
envs per worker and main work. Mechanisms are interleaved in rounds (median kept), one
harness alive at a time (idle spinning workers would steal the CPU).

Usage::

    python benchmarks/process_signal.py --out benchmarks/results/process_signal_cpu.json
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pathlib
import socket
import statistics
import struct
import sys
import time
from multiprocessing import shared_memory
from typing import Any

import numpy as np

MECHANISMS = (
    "socketpair",
    "mp_pipe",
    "os_pipe",
    "semaphore",
    "spin",
    "spin_yield",
    "spin_then_pipe",
)
_MSG = struct.Struct("qq")  # (seq, payload)


def _busy(iterations: int) -> None:
    x = 0
    for i in range(iterations):
        x += i


def _calibrate(micros: float) -> int:
    """Loop iterations taking about ``micros`` of CPU time."""
    n = 100_000
    start = time.process_time()
    _busy(n)
    per_iter = (time.process_time() - start) / n
    return int(micros * 1e-6 / per_iter)


def _worker(
    mechanism: str, index: int, shm_name: str, num_envs: int, spin_s: float, channels: Any
) -> None:
    import gymnasium

    envs = [gymnasium.make("CartPole-v1") for _ in range(num_envs)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
        env.action_space.seed(i)
    shm = shared_memory.SharedMemory(name=shm_name)
    seqs = np.ndarray((64,), np.int64, shm.buf)
    cmd_slot, reply_slot = 2 * index, 2 * index + 1
    cmd_in, reply_out = channels

    def work() -> None:
        for env in envs:
            _, _, term, trunc, _ = env.step(env.action_space.sample())
            if term or trunc:
                env.reset()

    if mechanism == "socketpair":
        import socket

        sock = socket.socket(fileno=cmd_in)
    seq = 0
    while True:
        seq += 1
        # -- wait for a command
        if mechanism == "socketpair":
            _, cmd = _MSG.unpack(sock.recv(_MSG.size, socket.MSG_WAITALL))
        elif mechanism == "mp_pipe":
            (cmd,) = struct.unpack("q", cmd_in.recv_bytes())
        elif mechanism == "os_pipe":
            _, cmd = _MSG.unpack(os.read(cmd_in, _MSG.size))
        elif mechanism == "semaphore":
            cmd_in.acquire()
            cmd = int(seqs[32 + index])
        elif mechanism in ("spin", "spin_yield"):
            while seqs[cmd_slot] != seq:
                if mechanism == "spin_yield":
                    os.sched_yield()
            cmd = int(seqs[32 + index])
        else:  # spin_then_pipe
            deadline = time.perf_counter() + spin_s
            while seqs[cmd_slot] != seq and time.perf_counter() < deadline:
                pass
            os.read(cmd_in, 1)  # present or about to be: the sender always writes it
            cmd = int(seqs[32 + index])
        if cmd < 0:
            break
        work()
        # -- reply
        if mechanism == "socketpair":
            sock.sendall(_MSG.pack(seq, 0))
        elif mechanism == "mp_pipe":
            reply_out.send_bytes(struct.pack("q", seq))
        elif mechanism == "os_pipe":
            os.write(reply_out, _MSG.pack(seq, 0))
        elif mechanism == "semaphore":
            reply_out.release()
        elif mechanism in ("spin", "spin_yield"):
            seqs[reply_slot] = seq
        else:
            seqs[reply_slot] = seq
            os.write(reply_out, b"x")
    shm.close()


class Harness:
    """Main-process side of one mechanism with ``num_workers`` workers."""

    def __init__(self, mechanism: str, num_workers: int, num_envs: int, spin_s: float) -> None:
        ctx = mp.get_context("forkserver")
        self.mechanism, self.num_workers, self.spin_s = mechanism, num_workers, spin_s
        self.shm = shared_memory.SharedMemory(create=True, size=64 * 8)
        self.seqs = np.ndarray((64,), np.int64, self.shm.buf)
        self.seqs[:] = 0
        self.procs, self.cmd_out, self.reply_in = [], [], []
        self._socks: list[Any] = []
        for w in range(num_workers):
            if mechanism == "socketpair":
                mine_sock, theirs = socket.socketpair()
                self._socks.append(mine_sock)
                child, mine = (theirs.detach(), -1), (mine_sock, mine_sock)
            elif mechanism == "mp_pipe":
                cmd_r, cmd_w = ctx.Pipe(duplex=False)
                rep_r, rep_w = ctx.Pipe(duplex=False)
                child, mine = (cmd_r, rep_w), (cmd_w, rep_r)
            elif mechanism == "semaphore":
                cmd_s, rep_s = ctx.Semaphore(0), ctx.Semaphore(0)
                child, mine = (cmd_s, rep_s), (cmd_s, rep_s)
            else:
                cmd_r, cmd_w = os.pipe()
                rep_r, rep_w = os.pipe()
                child, mine = (cmd_r, rep_w), (cmd_w, rep_r)
            if mechanism in ("socketpair", "os_pipe", "spin_then_pipe", "spin", "spin_yield"):
                proc = ctx.Process(
                    target=_fd_worker,
                    args=(mechanism, w, self.shm.name, num_envs, spin_s, _Fds(*child)),
                    daemon=True,
                )
            else:
                proc = ctx.Process(
                    target=_worker,
                    args=(mechanism, w, self.shm.name, num_envs, spin_s, child),
                    daemon=True,
                )
            proc.start()
            if mechanism == "socketpair":
                os.close(child[0])
            elif mechanism in ("os_pipe", "spin_then_pipe", "spin", "spin_yield"):
                os.close(child[0])
                os.close(child[1])
            self.procs.append(proc)
            self.cmd_out.append(mine[0])
            self.reply_in.append(mine[1])
        self.seq = 0
        self.round(0)  # workers are up

    def round(self, main_iterations: int) -> None:
        _busy(main_iterations)
        self.seq += 1
        seq, mech = self.seq, self.mechanism
        for w in range(self.num_workers):
            self.seqs[32 + w] = 1
            if mech == "socketpair":
                self.cmd_out[w].sendall(_MSG.pack(seq, 1))
            elif mech == "mp_pipe":
                self.cmd_out[w].send_bytes(struct.pack("q", 1))
            elif mech == "os_pipe":
                os.write(self.cmd_out[w], _MSG.pack(seq, 1))
            elif mech == "semaphore":
                self.cmd_out[w].release()
            elif mech in ("spin", "spin_yield"):
                self.seqs[2 * w] = seq
            else:
                self.seqs[2 * w] = seq
                os.write(self.cmd_out[w], b"x")
        for w in range(self.num_workers):
            if mech == "socketpair":
                self.reply_in[w].recv(_MSG.size, socket.MSG_WAITALL)
            elif mech == "mp_pipe":
                self.reply_in[w].recv_bytes()
            elif mech == "os_pipe":
                os.read(self.reply_in[w], _MSG.size)
            elif mech == "semaphore":
                self.reply_in[w].acquire()
            elif mech in ("spin", "spin_yield"):
                while self.seqs[2 * w + 1] != seq:
                    if mech == "spin_yield":
                        os.sched_yield()
            else:
                deadline = time.perf_counter() + self.spin_s
                while self.seqs[2 * w + 1] != seq and time.perf_counter() < deadline:
                    pass
                os.read(self.reply_in[w], 1)

    def close(self) -> None:
        self.seq += 1
        for w in range(self.num_workers):
            self.seqs[32 + w] = -1
            if self.mechanism == "socketpair":
                self.cmd_out[w].sendall(_MSG.pack(self.seq, -1))
            elif self.mechanism == "mp_pipe":
                self.cmd_out[w].send_bytes(struct.pack("q", -1))
            elif self.mechanism == "os_pipe":
                os.write(self.cmd_out[w], _MSG.pack(self.seq, -1))
            elif self.mechanism == "semaphore":
                self.cmd_out[w].release()
            elif self.mechanism in ("spin", "spin_yield"):
                self.seqs[2 * w] = self.seq
            else:
                self.seqs[2 * w] = self.seq
                os.write(self.cmd_out[w], b"x")
        for proc in self.procs:
            proc.join(5)
        for sock in self._socks:
            sock.close()
        self.shm.close()
        self.shm.unlink()


class _Fds:
    """Two raw fds, passed to a forkserver child (duplicated for it while pickling)."""

    def __init__(self, a: int, b: int) -> None:
        self.a, self.b = a, b

    def __reduce__(self) -> Any:
        from multiprocessing.reduction import DupFd

        return (_rebuild_fds, (DupFd(self.a), DupFd(self.b) if self.b >= 0 else None))


def _rebuild_fds(a: Any, b: Any) -> tuple[int, int]:
    return a.detach(), (-1 if b is None else b.detach())


def _fd_worker(
    mechanism: str, index: int, shm_name: str, num_envs: int, spin_s: float, fds: Any
) -> None:
    _worker(mechanism, index, shm_name, num_envs, spin_s, fds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spin-us", type=float, default=50.0)
    parser.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS))
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from jaxrunner._src.bench import autogroup, machine_info, write_report

    # (workers, envs per worker, main work in microseconds)
    scenarios = [(1, 0, 0), (2, 0, 0), (2, 32, 0), (2, 32, 150), (4, 16, 150), (2, 128, 150)]
    results = []
    for workers, envs, main_us in scenarios:
        main_iterations = _calibrate(main_us) if main_us else 0
        rates: dict[str, list[float]] = {m: [] for m in args.mechanisms}
        for _ in range(args.rounds):
            for mech in args.mechanisms:
                # One harness at a time: idle spinning workers would steal the CPU.
                harness = Harness(mech, workers, envs, args.spin_us * 1e-6)
                try:
                    count, start = 0, time.perf_counter()
                    while (elapsed := time.perf_counter() - start) < args.seconds:
                        harness.round(main_iterations)
                        count += 1
                    rates[mech].append(count / elapsed)
                finally:
                    harness.close()
        row: dict[str, Any] = {
            "num_workers": workers,
            "envs_per_worker": envs,
            "main_work_us": main_us,
            "round_trips_per_s": {m: statistics.median(r) for m, r in rates.items()},
            "all_rounds": rates,
        }
        row["us_per_round"] = {m: 1e6 / v for m, v in row["round_trips_per_s"].items()}
        results.append(row)
        line = "  ".join(f"{m}={v:8.1f}us" for m, v in row["us_per_round"].items())
        print(f"workers={workers} envs={envs} main={main_us}us: {line}", flush=True)

    write_report(
        "process_signal",
        args,
        results,
        {**machine_info(), "autogroup": autogroup(), "loadavg": os.getloadavg()},
    )


if __name__ == "__main__":
    main()
