"""Tests for jaxrunner._src.services.metrics_writer: flatten_metrics and MetricsWriter."""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ActorCritic

import jaxrunner as jr

NESTED = {
    "num_env_steps": np.int64(512),
    "episode_return_mean": float("nan"),
    "perf": {"inference_ms": np.float32(0.25), "env_wait_ms": 1.5},
    "loss": jnp.asarray(2.0),
    "ok": True,
}


def test_flatten_joins_nested_keys_and_converts_numbers() -> None:
    flat = jr.flatten_metrics(NESTED)
    assert list(flat) == [
        "num_env_steps",
        "episode_return_mean",
        "perf/inference_ms",
        "perf/env_wait_ms",
        "loss",
        "ok",
    ]
    assert flat["num_env_steps"] == 512 and type(flat["num_env_steps"]) is int
    assert math.isnan(flat["episode_return_mean"])
    assert flat["perf/inference_ms"] == 0.25 and type(flat["perf/inference_ms"]) is float
    assert flat["loss"] == 2.0 and flat["ok"] == 1
    dotted = jr.flatten_metrics({"perf": {"a": 1}}, sep=".", prefix="train")
    assert dotted == {"train.perf.a": 1}


def test_flatten_refuses_what_a_logger_cannot_take() -> None:
    with pytest.raises(TypeError, match=r"'perf/hist'.*list"):
        jr.flatten_metrics({"perf": {"hist": [1, 2]}})


def test_runner_metrics_flatten() -> None:
    envs = jr.make_vec("CartPole-v1", num_envs=2)
    policy = jr.Policy.from_linen(ActorCritic(2), envs.single_action_space)
    params = policy.init(jax.random.key(0), envs.single_observation_space)
    with jr.EnvRunner(envs, policy, params, rollout_length=8, seed=0) as runner:
        runner.sample()
        metrics = runner.get_metrics()
    flat = jr.flatten_metrics(metrics)
    assert flat["num_env_steps"] == 16
    for key, value in metrics["perf"].items():
        assert flat[f"perf/{key}"] == pytest.approx(value)
    assert not any(isinstance(v, dict) for v in flat.values())


def test_writer_sends_flat_metrics_to_callables_and_tensorboard(tmp_path: Path) -> None:
    pytest.importorskip("tensorboardX")
    seen: list[tuple[dict, int]] = []
    with jr.MetricsWriter(
        lambda m, step: seen.append((m, step)), tensorboard_dir=tmp_path, prefix="train"
    ) as writer:
        writer.write(NESTED)  # step: num_env_steps
        writer.write({"perf": {"inference_ms": 0.5}}, step=1024)
    assert [step for _, step in seen] == [512, 1024]
    assert seen[0][0]["train/perf/inference_ms"] == 0.25
    scalars = read_scalars(tmp_path)
    assert scalars["train/perf/inference_ms"] == [(512, 0.25), (1024, 0.5)]
    assert scalars["train/num_env_steps"] == [(512, 512.0)]
    # Closed: a write is refused by name (it skipped the TensorBoard file and still
    # called the sinks); closing again does nothing.
    events = [p.read_bytes() for p in sorted(tmp_path.glob("events.out.tfevents.*"))]
    with pytest.raises(
        jr.errors.ClosedError, match=r"MetricsWriter.write\(\): the writer is closed"
    ):
        writer.write(NESTED)
    writer.close()
    assert len(seen) == 2
    assert [p.read_bytes() for p in sorted(tmp_path.glob("events.out.tfevents.*"))] == events


def read_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars of the event files in ``logdir``, parsed as TensorBoard does: TFRecord
    framing (length, CRC, payload, CRC) around ``Event`` protos."""
    from tensorboardX.proto.event_pb2 import Event

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            length = int.from_bytes(data[pos : pos + 8], "little")
            event = Event.FromString(data[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_writer_and_flatten_refuse_other_arguments_by_name(tmp_path) -> None:
    with pytest.raises(TypeError, match="callable"):
        jr.MetricsWriter("wandb")
    with pytest.raises(TypeError, match=r"flatten_metrics\(metrics=3\): expected a mapping"):
        jr.flatten_metrics(3)
    with pytest.raises(TypeError, match=r"flatten_metrics\(metrics=3\): expected a mapping"):
        jr.MetricsWriter().write(3)  # (AttributeError: 'int' object has no attribute 'get')
    with pytest.raises(
        TypeError, match=r"MetricsWriter\(tensorboard_dir=3\): expected a file path"
    ):
        jr.MetricsWriter(tensorboard_dir=3)
    (tmp_path / "a_file").write_text("")  # NotADirectoryError at its first event file before
    with pytest.raises(ValueError, match=r"a_file'\): that is a file; give a folder"):
        jr.MetricsWriter(tensorboard_dir=tmp_path / "a_file")
    inside = tmp_path / "a_file" / "runs"  # NotADirectoryError from tensorboardX before
    with pytest.raises(ValueError, match=r"runs'\): .*a_file is a file, not a folder; give a"):
        jr.MetricsWriter(tensorboard_dir=inside)


def test_writer_refuses_a_default_step_that_is_no_whole_number() -> None:
    steps: list[int] = []
    writer = jr.MetricsWriter(lambda m, step: steps.append(step))
    writer.write({"num_env_steps": 512.0})  # a whole float (a JSON round trip) is a count
    assert steps == [512]
    # 2.7 was truncated to 2; NaN raised a bare ValueError, inf an OverflowError.
    for count in (2.7, math.nan, math.inf):
        with pytest.raises(
            jr.errors.InvalidArgumentError,
            match=r"MetricsWriter.write\(\): metrics\['num_env_steps'\] is .*, not a whole "
            r"number.*pass step=",
        ):
            writer.write({"num_env_steps": count})
    assert steps == [512]
