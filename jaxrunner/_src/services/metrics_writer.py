"""Metrics for loggers: :func:`flatten_metrics` (``get_metrics()`` as flat ``{name: number}``)
and a writer that sends them to any callable (W&B, MLflow, a print) and to TensorBoard."""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jaxrunner._src.arg_checks import check_int, check_path, file_above, refusal
from jaxrunner.errors import (
    ClosedError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    MissingDependencyError,
)

Sink = Callable[..., Any]
"""Called as ``sink(flat_metrics, step=step)``: ``wandb.log`` and
``mlflow.log_metrics`` have this signature."""


def flatten_metrics(
    metrics: Mapping[str, Any], *, sep: str = "/", prefix: str = ""
) -> dict[str, int | float]:
    """``metrics`` with nested mappings joined into one level of keys.

    ``{"num_env_steps": 512, "perf": {"inference_ms": 0.1}}`` becomes
    ``{"num_env_steps": 512, "perf/inference_ms": 0.1}``. Numbers are kept as Python
    ``int`` (counters, bools as 0/1) or ``float`` (NaN included: a mean over no
    episodes yet); numpy scalars and 0-d numpy or JAX arrays (a loss) are converted.

    Args:
        metrics: e.g. ``runner.get_metrics()`` or ``EvaluationResult.summary()``.
        sep: joins a nested key to its parent's.
        prefix: put before every key (with ``sep``), e.g. ``"train"``.

    Raises:
        InvalidArgumentTypeError: a value is neither a number nor a mapping; the
            message names its key.
    """
    if not isinstance(metrics, Mapping):
        what = "a mapping of numbers, e.g. runner.get_metrics()"
        raise InvalidArgumentTypeError(
            refusal("flatten_metrics", "metrics", metrics, what, None, "", False)
        )
    flat: dict[str, int | float] = {}
    for key, value in metrics.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten_metrics(value, sep=sep, prefix=name))
        else:
            flat[name] = _number(name, value)
    return flat


def _number(name: str, value: Any) -> int | float:
    if isinstance(value, np.generic) or getattr(value, "shape", None) == ():
        value = np.asarray(value).item()  # numpy scalars, 0-d numpy and JAX arrays
    if isinstance(value, (bool, numbers.Integral)):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise InvalidArgumentTypeError(
        f"flatten_metrics: the value of {name!r} is a {type(value).__name__} ({value!r}); "
        "expected a number or a mapping of them. Drop or summarise it before logging."
    )


class MetricsWriter:
    """Writes metrics, flattened, to callables and to a TensorBoard log directory.

    ::

        with jr.MetricsWriter(wandb.log, tensorboard_dir="runs/ppo") as writer:
            for _ in range(iterations):
                traj = runner.sample()
                ...
                writer.write(runner.get_metrics())  # step: its num_env_steps

    Args:
        *sinks: callables taking ``(flat_metrics, step=step)``, such as ``wandb.log``
            or ``mlflow.log_metrics``.
        tensorboard_dir: if given, a TensorBoard event file is written there (by
            ``tensorboardX``: ``pip install "jaxrunner[tensorboard]"``), one scalar
            per key.
        prefix: put before every key, e.g. ``"train"`` or ``"eval"``.
        sep: joins nested keys (and the prefix).
    """

    def __init__(
        self,
        *sinks: Sink,
        tensorboard_dir: str | os.PathLike[str] | None = None,
        prefix: str = "",
        sep: str = "/",
    ) -> None:
        for i, sink in enumerate(sinks):
            if not callable(sink):
                raise InvalidArgumentTypeError(
                    f"MetricsWriter(sinks[{i}]=...): expected a callable taking (metrics, "
                    f"step=step), got {type(sink).__name__}."
                )
        self.sinks = sinks
        self.prefix = prefix
        self.sep = sep
        self._tensorboard = None
        if tensorboard_dir is not None:
            path = check_path("MetricsWriter", "tensorboard_dir", tensorboard_dir)
            if os.path.exists(path) and not os.path.isdir(path):
                raise InvalidArgumentError(
                    f"MetricsWriter(tensorboard_dir={path!r}): that is a file; give a folder "
                    "(created if missing), where TensorBoard's event files go."
                )
            if (above := file_above(path)) is not None:
                raise InvalidArgumentError(
                    f"MetricsWriter(tensorboard_dir={path!r}): {above} is a file, not a "
                    "folder; give a folder's path (created if missing)."
                )
            try:
                from tensorboardX import SummaryWriter
            except ImportError as err:
                raise MissingDependencyError(
                    "MetricsWriter(tensorboard_dir=...): TensorBoard output needs tensorboardX; "
                    'install it with pip install "jaxrunner[tensorboard]" (or leave '
                    "tensorboard_dir unset and pass a callable)."
                ) from err
            self._tensorboard = SummaryWriter(logdir=path)
        self._writes = 0
        self._closed = False

    def write(self, metrics: Mapping[str, Any], step: int | None = None) -> dict[str, int | float]:
        """Flattens ``metrics`` and sends them to every sink; returns the flat dict.

        Args:
            metrics: a (nested) mapping of numbers, e.g. ``runner.get_metrics()``.
            step: the x-axis value; by default ``metrics["num_env_steps"]`` where
                there is one, else the number of earlier writes.

        Raises:
            InvalidArgumentError: ``step`` is not an int, or, by default, the
                ``num_env_steps`` is not a whole number (2.7, NaN).
        """
        if self._closed:  # (its TensorBoard file would be skipped, the sinks still called)
            raise ClosedError(
                "MetricsWriter.write(): the writer is closed; make a new MetricsWriter "
                "(or write before close(), inside its with block)."
            )
        # First: it refuses a non-mapping by name (before .get raises AttributeError).
        flat = flatten_metrics(metrics, sep=self.sep, prefix=self.prefix)
        if step is None:
            step = self._default_step(metrics)
        at: int = check_int("MetricsWriter.write", "step", step, low=-math.inf)
        for sink in self.sinks:
            sink(flat, step=at)
        if self._tensorboard is not None:
            for name, value in flat.items():
                self._tensorboard.add_scalar(name, value, at)
        self._writes += 1
        return flat

    def _default_step(self, metrics: Mapping[str, Any]) -> int:
        if "num_env_steps" not in metrics:
            return self._writes
        count = metrics["num_env_steps"]
        if not isinstance(count, Mapping):
            count = _number("num_env_steps", count)
        # A whole float (512.0, from a JSON round trip) is a count; 2.7 or NaN is not,
        # and int() would truncate it or raise a bare ValueError.
        if isinstance(count, float) and count.is_integer():
            return int(count)
        if isinstance(count, int):
            return count
        raise InvalidArgumentError(
            f"MetricsWriter.write(): metrics['num_env_steps'] is {count!r}, not a whole "
            "number, and it is the default step; pass step= (an int) or give the count "
            "as an int."
        )

    def flush(self) -> None:
        """Writes buffered TensorBoard events to disk."""
        if self._tensorboard is not None:
            self._tensorboard.flush()

    def close(self) -> None:
        """Flushes and closes the TensorBoard file (the sinks are the caller's); later
        writes are refused. Closing again does nothing."""
        self._closed = True
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
