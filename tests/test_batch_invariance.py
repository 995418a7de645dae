"""Batch invariance: an env's actions are the same bits however envs are batched.

Two levels. The mechanism (``jaxrunner._src.samplers.batch_invariance``): the XLA property it rests
on
(a row of a fixed-shape chunk does not depend on its position or its neighbours) and
chunked calls of every size agreeing. The samplers: Pendulum-v1 with a Box-action MLP
and an image env with a CNN give identical trajectories on the sync backend, in
pipelined groups, in ready-first buckets of 1 and 2 and on the process backend, and
each env's policy row is computed once per step.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import chex
import flax.linen as nn
import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium import spaces
from shuffled_sync import ShuffledSync

import jaxrunner as jr
from jaxrunner._src.samplers.batch_invariance import (
    chunked_apply,
    compute_platform,
    default_chunk_rows,
    is_one_call,
    policy_flops_per_row,
)
from jaxrunner._src.samplers.one_agent import OneAgentSampler
from jaxrunner.errors import InvalidArgumentError
from jaxrunner.models import mlp_policy

NUM_ENVS = 16  # chunks of 8 rows for both policies on CPU: two groups of one chunk each
SEED = 5


class TinyCNN(nn.Module):
    """A small conv policy for image observations (logits and a value)."""

    @nn.compact
    def __call__(self, obs: jax.Array) -> dict[str, jax.Array]:
        x = obs.astype(jnp.float32) / 255.0
        x = nn.relu(nn.Conv(8, (3, 3), (2, 2))(x))
        x = nn.relu(nn.Conv(8, (3, 3), (1, 1))(x))
        x = nn.relu(nn.Dense(32)(x.reshape(x.shape[0], -1)))
        return {"logits": nn.Dense(3)(x), "value": nn.Dense(1)(x)[..., 0]}


class NoiseImageEnv(gymnasium.Env):
    """uint8 ``12x12x2`` images of seeded noise; the action picks the next image's
    brightness and the reward, so a different action changes everything after it."""

    observation_space = spaces.Box(0, 255, (12, 12, 2), np.uint8)
    action_space = spaces.Discrete(3)

    def _image(self, action: int) -> np.ndarray:
        noise = self.np_random.integers(0, 200, self.observation_space.shape)
        return (noise + 25 * action).astype(np.uint8)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self._image(0), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        done = self.t >= 9 + int(self.np_random.integers(0, 5))
        return self._image(int(action)), float(action) - 1.0, done, False, {}


def _pendulum() -> gymnasium.Env:
    return gymnasium.make("Pendulum-v1")


def _image_env() -> gymnasium.Env:
    return NoiseImageEnv()


# -- the mechanism ------------------------------------------------------------------------


POLICY_NAMES = ("mlp64", "mlp256", "mlp512", "cnn")


@functools.cache  # built on first use, not at collection (each xdist process collects)
def _policies() -> dict[str, tuple[jr.Policy, Any, np.ndarray]]:
    """Policies of every shape the guarantee is checked on, with 40 observations each."""
    rng = np.random.default_rng(0)
    box = spaces.Box(-2.0, 2.0, (1,), np.float32)
    vector = spaces.Box(-8.0, 8.0, (3,), np.float32)
    out = {}
    for width in (64, 256, 512):
        policy = mlp_policy(box, hidden=(width, width))
        obs = rng.normal(size=(40, 3)).astype(np.float32)
        out[f"mlp{width}"] = (policy, policy.init(jax.random.key(1), vector), obs)
    image = NoiseImageEnv.observation_space
    policy = jr.Policy.from_linen(TinyCNN(), spaces.Discrete(3))
    obs = rng.integers(0, 255, (40, *image.shape)).astype(np.uint8)
    out["cnn"] = (policy, policy.init(jax.random.key(1), image), obs)
    assert tuple(out) == POLICY_NAMES
    return out


def _row_keys(ids: np.ndarray) -> jax.Array:
    return jax.vmap(lambda i: jax.random.fold_in(jax.random.key(7), i))(jnp.asarray(ids))


@functools.cache
def _jitted_chunked(apply_fn: Any, chunk_rows: int) -> Any:
    # One jitted function per policy and chunk size: calls of a shape it has seen reuse
    # its trace and compile (a new jax.jit of a new closure would redo both).
    return jax.jit(chunked_apply(apply_fn, chunk_rows, max_rows=64))


def _outputs(
    apply_fn: Any,
    params: Any,
    obs: np.ndarray,
    ids: np.ndarray,
    chunk_rows: int | None = None,
    num_rows: int = 0,
) -> list[np.ndarray]:
    """Action and extras of rows ``obs`` (keys from ``ids``) as numpy leaves, from one
    jitted call of ``apply_fn``, or of its :func:`chunked_apply` (``num_rows`` real
    rows, a run-time argument)."""
    keys = _row_keys(ids)
    if chunk_rows is None:
        action, extras, _ = jax.jit(apply_fn)(params, obs, None, keys)
    else:
        chunked = _jitted_chunked(apply_fn, chunk_rows)
        action, extras, _ = chunked(params, obs, None, keys, np.int32(num_rows))
    return [np.asarray(leaf) for leaf in jax.tree.leaves((action, extras))]


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_a_chunk_row_depends_on_neither_its_position_nor_its_neighbours(name):
    """The XLA property the mechanism rests on, checked on this platform: in a
    fixed-shape chunk, a row comes out the same at any position and whatever the
    other rows hold (random neighbours, every position)."""
    policy, params, obs = _policies()[name]
    chunk = 8
    ids = np.arange(len(obs), dtype=np.uint32)
    reference = _outputs(policy.apply_fn, params, obs[:chunk], ids[:chunk])
    rng = np.random.default_rng(1)
    for _ in range(6):
        place = rng.permutation(chunk)  # row i of the reference goes to place[i]
        others = rng.choice(np.arange(chunk, len(obs)), chunk, replace=False)
        mixed_obs, mixed_ids = obs[others].copy(), ids[others].copy()
        keep = rng.permutation(chunk)[: chunk // 2]  # half the rows, moved
        mixed_obs[place[keep]], mixed_ids[place[keep]] = obs[keep], ids[keep]
        got = _outputs(policy.apply_fn, params, mixed_obs, mixed_ids)
        for ours, theirs in zip(got, reference):
            np.testing.assert_array_equal(ours[place[keep]], theirs[keep])


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_chunked_calls_of_every_size_give_the_same_rows(name):
    """A row's outputs are the same bits in calls of 1, 2, 3, 5, 8 and 17 real rows
    (padded on the host with other rows to chunks of 4) as in the call of all 40."""
    policy, params, obs = _policies()[name]
    chunk = 4
    ids = np.arange(len(obs), dtype=np.uint32)
    reference = _outputs(policy.apply_fn, params, obs, ids, chunk, len(obs))
    for size in (1, 2, 3, 5, 8, 17):
        for start in (0, len(obs) - size):
            take = np.arange(start, start + size)
            pad = np.setdiff1d(ids, take)[: -size % chunk]  # other rows as padding
            rows = np.concatenate([take, pad])
            got = _outputs(policy.apply_fn, params, obs[rows], ids[rows], chunk, size)
            for ours, theirs in zip(got, reference):
                np.testing.assert_array_equal(ours[:size], theirs[take])


def test_chunked_apply_refuses_outputs_without_a_row_per_observation():
    def apply_fn(params, obs, carry, keys):
        return obs, {"mean": obs.mean()}, carry  # a batch statistic: not row-wise

    def policy_fn(params, obs, carry, keys):
        return obs, {}, carry

    with pytest.raises(InvalidArgumentError, match=r"one row per observation.*got shape \(\)"):
        _outputs(apply_fn, None, np.zeros((4, 3)), np.arange(4, dtype=np.uint32), 2, 4)
    with pytest.raises(InvalidArgumentError, match=r"3 rows, expected a multiple of chunk_rows=2"):
        _outputs(policy_fn, None, np.zeros((3, 3)), np.arange(3, dtype=np.uint32), 2, 3)


def test_one_chunk_calls_refuse_the_same_outputs_and_other_sizes(monkeypatch):
    """An accelerator's one call (no loop) checks what the loop checks: one output row
    per observation, and its rows exactly one chunk."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")

    def apply_fn(params, obs, carry, keys):
        return obs, {"mean": obs.mean()}, carry

    def policy_fn(params, obs, carry, keys):
        return obs, {}, carry

    def call(fn, rows):
        keys = _row_keys(np.arange(rows, dtype=np.uint32))
        return jax.jit(chunked_apply(fn, 4, 4))(None, np.zeros((rows, 3)), None, keys, rows)

    with pytest.raises(InvalidArgumentError, match=r"one row per observation.*got shape \(\)"):
        call(apply_fn, 4)
    with pytest.raises(InvalidArgumentError, match=r"8 rows, expected exactly chunk_rows=4"):
        call(policy_fn, 8)
    np.testing.assert_array_equal(call(policy_fn, 4)[0], np.zeros((4, 3)))


def test_the_default_device_sets_the_platform_of_the_chunks_and_splits(monkeypatch):
    """On an accelerator machine, a runner under jax.default_device(cpu) computes on the
    CPU: it keeps the CPU's chunks and loop (XLA CPU drops the one call's barriers)."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert compute_platform() == "gpu" and is_one_call(8, 8)
    assert default_chunk_rows(64, 9e3) == 64
    with jax.default_device(jax.devices("cpu")[0]):
        assert compute_platform() == "cpu" and not is_one_call(8, 8)
        assert default_chunk_rows(64, 9e3) == default_chunk_rows(64, 9e3, "cpu") == 32
        envs = jr.make_vec("CartPole-v1", 8)  # asking for two splits, as the process backend
        envs.capabilities = dataclasses.replace(envs.capabilities, pipeline_splits=2)
        policy = mlp_policy(envs.single_action_space)
        params = policy.init(jax.random.key(0), envs.single_observation_space)
        with jr.EnvRunner(envs, policy, params, 4, seed=0) as runner:
            assert runner.num_splits == 2  # an accelerator takes one
            blocks = runner.sampler._group._blocks.values()
            # The loop: two chunks of 8 rows a split (one call would be one chunk).
            assert {b.call.new_stage().obs.shape[0] for b in blocks} == {2 * 8}


def test_default_chunk_rows_follow_the_width_and_the_policy_cost():
    mlp, cnn = 9e3, 3e7  # flops per row: a CartPole 64-64 MLP, a NatureCNN (half the envs)
    widths = (1, 2, 8, 16, 64, 256, 4096)
    assert [default_chunk_rows(n, mlp, "cpu") for n in widths] == [1, 2, 8, 8, 32, 128, 128]
    assert [default_chunk_rows(n, cnn, "cpu") for n in widths] == [1, 2, 8, 8, 32, 128, 256]
    assert default_chunk_rows(64, None, "cpu") == default_chunk_rows(64, cnn, "cpu")
    # A policy server's batches often hold one row: a costly policy keeps small chunks.
    small = [default_chunk_rows(n, cnn, "cpu", small_calls=True) for n in widths]
    assert small == [1, 2, 8, 8, 8, 8, 8]
    assert [default_chunk_rows(n, mlp, "cpu", small_calls=True) for n in widths] == [
        default_chunk_rows(n, mlp, "cpu") for n in widths
    ]
    # An accelerator: one call of every row (no loop) up to 512 rows, then chunks of half.
    assert [default_chunk_rows(n, mlp, "gpu") for n in (64, 300, 512, 1000)] == [64, 300, 512, 256]
    for n in (16, 64, 256, 4096):  # two pipelining groups are whole chunks
        assert (n // 2) % default_chunk_rows(n, mlp, "cpu") == 0
        assert (n // 2) % default_chunk_rows(n, cnn, "cpu") == 0


@pytest.mark.usefixtures("cpu_defaults")
@pytest.mark.parametrize(
    ("num_envs", "flops", "splits"),
    [
        (8, 9e3, 2),  # a CartPole MLP: the padded rows cost nothing, the overlap stays
        (8, 3e7, 1),  # a NatureCNN: two splits of 4 would compute 16 images, not 8
        (16, 3e7, 2),  # two whole chunks of 8
        (8, None, 1),  # unknown cost: taken as costly
    ],
)
def test_default_splits_do_not_pay_a_costly_policy_twice(num_envs, flops, splits):
    from types import SimpleNamespace

    from jaxrunner._src.backends.capabilities import Capabilities
    from jaxrunner._src.samplers.pipeline_splits import GroupCost, default_num_splits

    process_like = SimpleNamespace(num_envs=num_envs, capabilities=Capabilities(pipeline_splits=2))
    cost = GroupCost(1, default_chunk_rows(num_envs, flops, "cpu"), flops)
    assert default_num_splits(process_like, [cost]) == splits  # type: ignore[arg-type]
    if num_envs == 8:  # the groups' padding adds up: each under a chunk's work, both over
        light = GroupCost(1, 8, 1.5e5)  # two splits of 4 envs pad 8 rows: 1.2e6 flops
        assert default_num_splits(process_like, [light]) == 2  # type: ignore[arg-type]
        assert default_num_splits(process_like, [light, light]) == 1  # type: ignore[arg-type]


def test_whole_blocks_that_would_pad_a_costly_policy_are_sampled_as_one_split():
    """EnvPool pools (whole blocks of ``pipeline_bounds``) keep a split each where every
    block holds whole policy chunks or the padding costs little; else one split of all
    (two pools of 4 Pong envs computed the NatureCNN's chunk of 8 twice: 0.62x). Other
    declared bounds (the main process's share) keep their splits, as before."""
    from types import SimpleNamespace

    from jaxrunner._src.backends.capabilities import Capabilities
    from jaxrunner._src.samplers.pipeline_splits import GroupCost, default_num_splits

    caps = Capabilities(pipeline_bounds=(0, 4, 8), whole_blocks=True)
    pools = SimpleNamespace(num_envs=8, capabilities=caps)
    assert default_num_splits(pools, [GroupCost(1, 4, None)]) == 2  # type: ignore[arg-type]
    assert default_num_splits(pools, [GroupCost(1, 8, None)]) == 1  # type: ignore[arg-type]
    assert default_num_splits(pools, [GroupCost(1, 8, 1e5)]) == 2  # type: ignore[arg-type]  # 8e5 flops
    assert default_num_splits(pools, [GroupCost(1, 8, 3e7)]) == 1  # type: ignore[arg-type]
    share = SimpleNamespace(num_envs=8, capabilities=dataclasses.replace(caps, whole_blocks=False))
    assert default_num_splits(share, [GroupCost(1, 8, None)]) == 2  # type: ignore[arg-type]


@pytest.mark.usefixtures("cpu_defaults")
@pytest.mark.parametrize(("hidden", "splits"), [((64, 64), 2), ((1024, 1024), 1)])
def test_the_runner_splits_a_costly_policy_only_into_whole_chunks(hidden, splits):
    """A backend that asks for two splits (the process backend does), 8 envs: a cheap
    policy's padding costs nothing and the two stay; a costly policy's chunk is 8 rows,
    so two splits of 4 would compute 16 rows, and the runner takes one."""
    envs = jr.make_vec("CartPole-v1", 8)
    envs.capabilities = dataclasses.replace(envs.capabilities, pipeline_splits=2)
    policy = mlp_policy(envs.single_action_space, hidden=hidden)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, 4, seed=0) as runner:
        assert len(runner.sampler.splits) == splits
        assert runner.sample().valid.all()


def test_policy_flops_per_row_sees_the_policy_cost():
    small = mlp_policy(spaces.Discrete(2), hidden=(8,))
    wide = mlp_policy(spaces.Discrete(2), hidden=(256, 256))
    space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    small_flops = policy_flops_per_row(small, small.init(jax.random.key(0), space), space)
    wide_flops = policy_flops_per_row(wide, wide.init(jax.random.key(0), space), space)
    assert small_flops is not None and wide_flops is not None
    assert wide_flops > 100 * small_flops  # 256x256 multiply-adds against 4x8


def test_policy_flops_per_row_is_kept_per_policy_and_input_shape(monkeypatch):
    """A runner rebuilt with the same policy reuses the estimate (no second lowering),
    and a policy seen on other inputs gets its own."""
    policy = mlp_policy(spaces.Discrete(2), hidden=(16,))
    narrow = spaces.Box(-1.0, 1.0, (4,), np.float32)
    wide = spaces.Box(-1.0, 1.0, (64,), np.float32)
    narrow_params = policy.init(jax.random.key(0), narrow)
    wide_params = policy.init(jax.random.key(0), wide)
    first = policy_flops_per_row(policy, narrow_params, narrow)
    other = policy_flops_per_row(policy, wide_params, wide)
    assert first is not None and other is not None and other > first

    def no_lowering(*args, **kwargs):
        raise AssertionError("the policy was lowered again")

    monkeypatch.setattr(jax, "jit", no_lowering)
    assert policy_flops_per_row(policy, narrow_params, narrow) == first
    assert policy_flops_per_row(policy, wide_params, wide) == other


# -- the samplers -------------------------------------------------------------------------


def _pendulum_policy() -> tuple[jr.Policy, Any]:
    policy = mlp_policy(spaces.Box(-2.0, 2.0, (1,), np.float32), hidden=(64, 64))
    return policy, policy.init(jax.random.key(0), spaces.Box(-8.0, 8.0, (3,), np.float32))


def _cnn_policy() -> tuple[jr.Policy, Any]:
    policy = jr.Policy.from_linen(TinyCNN(), NoiseImageEnv.action_space)
    return policy, policy.init(jax.random.key(0), NoiseImageEnv.observation_space)


CASES = {
    # Pendulum truncates at 200 steps: 3 samples of 100 cross an episode boundary.
    "pendulum": (_pendulum, _pendulum_policy, 100),
    "cnn": (_image_env, _cnn_policy, 30),
}


def _samples(
    envs: Any, case: str, num_splits: int | None = None, ready_first: bool = False
) -> list[jr.Trajectory]:
    _, make_policy, steps = CASES[case]
    policy, params = make_policy()
    # A CPU host's chunk at 16 envs on any platform (an accelerator's is every env: each
    # call is the same one chunk, which test_one_chunk_... checks).
    with jr.EnvRunner(
        envs, policy, params, steps, SEED, num_splits=num_splits, chunk_rows=NUM_ENVS // 2
    ) as runner:
        samples = [runner.sample() for _ in range(3)]
        if ready_first and runner.sampler.ready_first.merging:  # envs in any order
            counts = runner.sampler.ready_first.ready_counts  # calls of fewer than all envs ran
            assert sum(n for ready, n in counts.items() if ready < NUM_ENVS)
        elif ready_first:  # the one loop's ready-first mode: blocks of envs
            assert min(runner.sampler.block_sizes) < NUM_ENVS
        else:
            assert isinstance(runner.sampler, OneAgentSampler)
        return samples


@functools.cache
def _reference(case: str) -> list[jr.Trajectory]:
    """The sync backend, one group."""
    make_env = CASES[case][0]
    return _samples(jr.make_vec(make_env, NUM_ENVS), case, num_splits=1)


def _assert_same(got: list[jr.Trajectory], case: str) -> None:
    for ours, theirs in zip(got, _reference(case), strict=True):
        chex.assert_trees_all_equal(ours, theirs)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("num_splits", [2, 3])
def test_pipelined_groups_equal_one_group(case, num_splits):
    make_env = CASES[case][0]
    envs = jr.make_vec(make_env, NUM_ENVS)
    _assert_same(_samples(envs, case, num_splits=num_splits), case)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("platform", ["this one", "an accelerator"])
def test_one_chunk_of_every_env_is_the_same_bits_in_every_mode(case, platform, monkeypatch):
    """chunk_rows=NUM_ENVS (an accelerator's default): every call is one chunk, whatever
    the splits or the envs ready; on an accelerator one call with no loop (its plumbing
    checked here on any platform, its bits where the suite runs on one)."""
    if platform == "an accelerator":
        monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    make_env, make_policy, steps = CASES[case]
    policy, params = make_policy()
    # One call computes one chunk of every env; the loop, at least two chunks (one run).
    rows = NUM_ENVS if jax.default_backend() != "cpu" else 2 * NUM_ENVS
    got = []
    for envs, splits in (
        (jr.make_vec(make_env, NUM_ENVS), 1),
        (jr.make_vec(make_env, NUM_ENVS), 3),
        (ShuffledSync([make_env] * NUM_ENVS, 3, buckets=(NUM_ENVS,)), None),
    ):
        with jr.EnvRunner(
            envs, policy, params, steps, SEED, num_splits=splits, chunk_rows=NUM_ENVS
        ) as runner:
            got.append([runner.sample() for _ in range(2)])
            if splits is None:  # ready-first: calls of fewer envs than all ran
                counts = runner.sampler.ready_first.ready_counts
                assert sum(n for ready, n in counts.items() if ready < NUM_ENVS)
            else:
                blocks = runner.sampler._group._blocks.values()
                assert {b.call.new_stage().obs.shape[0] for b in blocks} == {rows}
    for other in got[1:]:
        for ours, theirs in zip(other, got[0], strict=True):
            chex.assert_trees_all_equal(ours, theirs)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(("batch", "buckets"), [(None, (1, 2, 4)), (2, (2,)), (3, (1, 2, 3))])
def test_ready_first_small_buckets_equal_the_sync_backend(case, batch, buckets):
    """Envs answer one, two or three at a time, in a seeded random order, and are
    computed in buckets of 1, 2, 3, 4 or all rows."""
    make_env = CASES[case][0]
    envs = ShuffledSync([make_env] * NUM_ENVS, batch, buckets=buckets)
    _assert_same(_samples(envs, case, ready_first=True), case)


@pytest.mark.parametrize("case", list(CASES))
def test_process_backend_ready_first_equals_the_sync_backend(case):
    make_env = CASES[case][0]
    config = jr.ProcessConfig(num_workers=4, ready_first=True)
    envs = jr.make_vec(make_env, NUM_ENVS, backend="process", config=config)
    _assert_same(_samples(envs, case, ready_first=True), case)


def test_a_given_chunk_is_every_layouts_chunk():
    """EnvRunner(chunk_rows=k): the sync backend and the process backend's ready-first
    workers (blocks of 4 envs) both compute chunks of k rows, and sample the same bits."""
    make_env, make_policy, steps = CASES["cnn"]
    policy, params = make_policy()
    config = jr.ProcessConfig(num_workers=4, ready_first=True)
    got = []
    for envs in (
        jr.make_vec(make_env, NUM_ENVS),
        jr.make_vec(make_env, NUM_ENVS, backend="process", config=config),
    ):
        with jr.EnvRunner(envs, policy, params, steps, SEED, chunk_rows=4) as runner:
            got.append([runner.sample() for _ in range(2)])
            blocks = runner.sampler._group._blocks.values()
            assert {block.call.chunk_rows for block in blocks} == {4}
    for ours, theirs in zip(*got, strict=True):
        chex.assert_trees_all_equal(ours, theirs)
    with pytest.raises(InvalidArgumentError, match=r"EnvRunner\(chunk_rows=0\): expected an int"):
        jr.EnvRunner(jr.make_vec(make_env, 2), policy, params, steps, SEED, chunk_rows=0)
    walk = jr.JaxVectorEnv(jr.testing.RandomWalk(), num_envs=2)
    walk_policy = mlp_policy(walk.single_action_space)
    walk_params = walk_policy.init(jax.random.key(0), walk.single_observation_space)
    with pytest.raises(InvalidArgumentError, match=r"pure-JAX env.*in no chunks"):
        jr.EnvRunner(walk, walk_policy, walk_params, 4, SEED, chunk_rows=2)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_each_env_row_is_computed_once_per_step(num_splits):
    """Rows the policy computes per step, counted inside the compiled chunks: one per
    env whatever the grouping (computing every env's row in each group's call would
    be ``num_splits * NUM_ENVS``)."""
    policy, params = _pendulum_policy()
    rows: list[int] = []

    def counted(params, obs, carry, keys):
        jax.debug.callback(lambda n: rows.append(int(n)), obs.shape[0])
        return policy.apply_fn(params, obs, carry, keys)

    counting = jr.Policy(apply_fn=counted, init_fn=policy.init_fn)
    envs = jr.make_vec(_pendulum, NUM_ENVS)
    steps, chunk = 5, NUM_ENVS // 2  # (an accelerator's one chunk of every env pads each split)
    with jr.EnvRunner(
        envs, counting, params, steps, SEED, num_splits=num_splits, chunk_rows=chunk
    ) as runner:
        runner.sample()
        jax.effects_barrier()
    assert sum(rows) == steps * NUM_ENVS


def test_external_env_batcher_rows_do_not_depend_on_their_batch():
    """The ExternalEnv batcher: a row's Box action and log-probs (sampled, and of a
    logged action) are the same bits alone in a bucket of 1, with 2 others, or in a
    full batch of 16."""
    from jaxrunner._src.services.external.batching import PolicyBatcher, Row

    policy, params = _pendulum_policy()
    obs_space = spaces.Box(-8.0, 8.0, (3,), np.float32)
    act_space = spaces.Box(-2.0, 2.0, (1,), np.float32)
    rng = np.random.default_rng(3)
    obs = rng.normal(size=(16, 3)).astype(np.float32)
    logged = rng.uniform(-2, 2, size=(16, 1)).astype(np.float32)

    def rows(ids: range, with_action: bool) -> list[Row]:
        return [Row(obs[i], logged[i] if with_action else None, 1000 + i, 7, None) for i in ids]

    batcher = PolicyBatcher(
        policy, params, obs_space, act_space, SEED,
        max_batch=16, max_wait_s=0.0, buckets=(1, 2, 4, 16),
    )  # fmt: skip
    try:
        for with_action in (False, True):
            full = batcher.submit(rows(range(16), with_action), lambda r: r).result()
            for ids in (range(5, 6), range(9, 12), range(0, 2)):
                part = batcher.submit(rows(ids, with_action), lambda r: r).result()
                for i, (action, extras, _) in zip(ids, part):
                    np.testing.assert_array_equal(action, full[i][0])
                    np.testing.assert_array_equal(extras["log_prob"], full[i][1]["log_prob"])
    finally:
        batcher.close()
