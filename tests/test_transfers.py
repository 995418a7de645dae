"""Invariant 9: counted transfers.

The host loop makes one host->device and one device->host transfer per step; the
pure-JAX path makes none per step (one explicit fetch of episode statistics per
``sample()``, whatever its length).

How it is proven, whatever route jaxrunner takes to move data (an explicit
``jax.device_put``/``jax.device_get``, or a numpy argument / ``np.asarray`` inside a
scope that allows transfers by name with ``jax.transfer_guard*("allow")``):

* Under ``jax.transfer_guard("disallow")``, ``sample()`` runs: no transfer happens
  outside explicit calls and named scopes (on accelerators; see below).
* :class:`TransferProbe` counts explicit calls (and the arrays each moves) and turns
  every named "allow" scope into "log_explicit", and the sample runs under
  ``jax.transfer_guard("log_explicit")``: XLA then logs every host->device transfer,
  implicit or explicit, whatever API started it, and the log lines are counted.
* On CPU, XLA neither guards nor logs device->host copies (device memory is host
  memory); there the device->host count is explicit arrays fetched plus named
  device->host scopes entered, and each scope is checked to move one array on
  accelerators, where the XLA log counts them exactly.
"""

from __future__ import annotations

import collections
import importlib
from collections.abc import Callable, Iterator

import jax
import numpy as np
import pytest

import jaxrunner as jr
from jaxrunner.models import mlp_policy
from jaxrunner.testing import RandomWalk

H2D_LOG = "host-to-device transfer"
D2H_LOG = "device-to-host transfer"
ON_CPU = jax.default_backend() == "cpu"


class TransferProbe:
    """Counts transfers by every route (see the module docstring)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # The policy step reads the guards' levels from the objects it takes at import:
        # loaded before the patch (jaxrunner loads it lazily), it takes JAX's own.
        importlib.import_module("jaxrunner._src.samplers.policy_step")
        self.puts: list[int] = []  # arrays per jax.device_put call
        self.gets: list[int] = []  # arrays per jax.device_get call
        self.scopes: collections.Counter[str] = collections.Counter()  # "allow" scopes
        put, get = jax.device_put, jax.device_get

        def device_put(x, *args, **kwargs):
            self.puts.append(len(jax.tree.leaves(x)))
            return put(x, *args, **kwargs)

        def device_get(x):
            self.gets.append(len(jax.tree.leaves(x)))
            return get(x)

        monkeypatch.setattr(jax, "device_put", device_put)
        monkeypatch.setattr(jax, "device_get", device_get)
        for name in ("transfer_guard", "transfer_guard_host_to_device"):
            monkeypatch.setattr(jax, name, self._scope(getattr(jax, name), name, "h2d"))
        monkeypatch.setattr(
            jax,
            "transfer_guard_device_to_host",
            self._scope(jax.transfer_guard_device_to_host, "d2h", "d2h"),
        )

    def _scope(self, guard: Callable, name: str, direction: str) -> Callable:
        probe = self

        class CountedScope:
            """An "allow" scope counted each time it is entered (scopes may be reused)."""

            def __init__(self, level: str) -> None:
                self.inner = guard(level)

            def __enter__(self) -> None:
                probe.scopes[direction if name != "transfer_guard" else "both"] += 1
                self.inner.__enter__()

            def __exit__(self, *exc: object) -> None:
                self.inner.__exit__(*exc)

        def scoped(level: str):
            if level == "allow":
                # Allowed still, but XLA logs what moves.
                return CountedScope("log_explicit")
            return guard(level)

        return scoped

    def reset(self) -> None:
        self.puts.clear()
        self.gets.clear()
        self.scopes.clear()

    def d2h_on_cpu(self) -> int:
        """Device->host transfers as far as they can be seen on CPU."""
        return sum(self.gets) + self.scopes["d2h"] + self.scopes["both"]


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> Iterator[TransferProbe]:
    yield TransferProbe(monkeypatch)


def logged_transfers(capfd: pytest.CaptureFixture[str], run: Callable[[], object]):
    """(host->device, device->host) transfers XLA logs while ``run()`` runs."""
    capfd.readouterr()
    with jax.transfer_guard("log_explicit"):
        run()
    err = capfd.readouterr().err
    return err.count(H2D_LOG), err.count(D2H_LOG)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_host_loop_makes_one_transfer_each_way_per_step(probe, capfd, num_splits):
    """Per step, one transfer each way per pipelining group."""
    num_steps = 12
    envs = jr.make_vec("CartPole-v1", 4)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, num_steps, 0, num_splits=num_splits) as runner:
        runner.sample()  # compiles
        with jax.transfer_guard("disallow"):
            runner.sample()
        probe.reset()
        h2d, d2h = logged_transfers(capfd, runner.sample)
    calls = num_steps * num_splits
    assert h2d == calls, "one host->device transfer per step and group, by any route"
    assert all(n == 1 for n in probe.puts), "an explicit put moves one array"
    assert all(n == 1 for n in probe.gets), "an explicit get moves one array"
    if ON_CPU:
        assert probe.d2h_on_cpu() == calls
    else:
        assert d2h == calls


@pytest.mark.parametrize("rollout_length", [4, 16])
def test_scan_path_makes_no_transfer_per_step(probe, capfd, rollout_length):
    envs = jr.JaxVectorEnv(RandomWalk(), None, 3)
    policy = mlp_policy(envs.single_action_space, hidden=(8,))
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, rollout_length, 0) as runner:
        probe.reset()
        # From the first sample on (the scan compiled in the constructor).
        with jax.transfer_guard("disallow"):
            trajs = [runner.sample() for _ in range(3)]
            runner.get_metrics()
        # Per sample, one fetch of one array (episode statistics), whatever its length:
        # a named device->host scope, no put.
        assert probe.puts == [] and probe.gets == []
        assert probe.scopes == {"d2h": 3}
        probe.reset()
        h2d, d2h = logged_transfers(capfd, runner.sample)
    assert h2d == 0
    assert probe.d2h_on_cpu() == 1
    if not ON_CPU:
        assert d2h == 1
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(trajs))
    assert np.asarray(trajs[-1].reward).shape == (rollout_length, 3)


def assert_packing_round_trips(tree: dict[str, np.ndarray]) -> None:
    """What the host writes into a word buffer's views unpacks unchanged on device, and
    what the device packs reads back unchanged through the views."""
    from jaxrunner._src.samplers.transfer import Packing

    packing = Packing(tree)
    buffer = packing.allocate()
    assert buffer.dtype == np.uint32 and buffer.nbytes == packing.nbytes
    views = packing.host_views(buffer)
    for name, value in tree.items():
        views[name][...] = value
    unpacked = jax.jit(packing.unpack)(buffer)
    packed = np.asarray(jax.jit(packing.pack)(tree))
    for name, value in tree.items():
        np.testing.assert_array_equal(np.asarray(unpacked[name]), value, err_msg=name)
        assert unpacked[name].dtype == value.dtype, name
        np.testing.assert_array_equal(packing.host_views(packed)[name], value, err_msg=name)


def test_packing_round_trips_every_leaf_width():
    # Leaves of 1, 2 and 4 bytes, odd sizes, scalars.
    rng = np.random.default_rng(0)
    assert_packing_round_trips(
        {
            "flags": rng.random(3) < 0.5,
            "image": rng.integers(0, 256, (5, 3), dtype=np.uint8),
            "small": rng.integers(-128, 128, 7, dtype=np.int8),
            "half": rng.random(5).astype(np.float16),
            "obs": rng.random((3, 4)).astype(np.float32),
            "index": np.int32(-7),
            "ids": rng.integers(-(2**31), 2**31, 9, dtype=np.int64).astype(np.int32),
        }
    )


def test_packing_round_trips_8_byte_leaves_with_x64():
    with jax.enable_x64(True):
        assert_packing_round_trips(
            {"reward": np.array([0.1, -2.5, 1e300]), "steps": np.array([2**40, -3], np.int64)}
        )


def test_packing_views_a_leading_block_of_rows():
    # host_leaves(buffer, lead): each leaf's first prod(lead) rows as [*lead, ...] views
    # (the multi-agent sampler's [envs, agents] block without the padding rows).
    from jaxrunner._src.samplers.transfer import Packing

    rng = np.random.default_rng(0)
    tree = {
        "action": rng.integers(0, 5, 8, dtype=np.int32),
        "flags": rng.random(8) < 0.5,
        "mean": rng.random((8, 2)).astype(np.float32),
    }
    packing = Packing(tree)
    buffer = packing.allocate()
    for name, view in packing.host_views(buffer).items():
        view[...] = tree[name]
    leaves = packing.host_leaves(buffer, (2, 3))
    for leaf, expected in zip(leaves, jax.tree.leaves(tree)):
        np.testing.assert_array_equal(leaf, expected[:6].reshape(2, 3, *expected.shape[1:]))
        assert np.shares_memory(leaf, buffer)  # views: the step's one transfer, no copy
    with pytest.raises(ValueError, match="fewer than 9 rows"):
        packing.host_leaves(buffer, (3, 3))


@pytest.mark.parametrize("rows", [1, 7, 16])
def test_a_stage_goes_to_the_cpu_device_without_a_copy(rows):
    # JAX aliases a host buffer on a CPU device only where it is 64-byte aligned; numpy's
    # own allocations are 16-byte aligned, and a copied stage of 16 Atari frames cost
    # 30-60 us a step.
    from jaxrunner._src.samplers.transfer import Packing

    packing = Packing({"obs": np.zeros((rows, 4, 84, 84), np.uint8), "i": np.zeros(rows)})
    for _ in range(8):  # (one aligned by chance would not say much)
        buffer = packing.allocate()
        assert buffer.shape == (packing.nwords,) and buffer.dtype == np.uint32
        assert not buffer.any() and buffer.flags.c_contiguous and buffer.flags.writeable
        on_device = jax.device_put(buffer, jax.devices("cpu")[0])
        assert on_device.unsafe_buffer_pointer() == buffer.ctypes.data
