"""Checks of an array's ``.npy`` header (shape and dtype) before a checkpoint reader loads it."""

from __future__ import annotations

import numpy as np

from jaxrunner._src.core.npz_reader import HeaderCheck


def exact(shape: tuple[int, ...], dtype: np.dtype) -> HeaderCheck:
    """A header check: exactly ``shape`` of ``dtype``."""

    def check(got_shape: tuple[int, ...], got_dtype: np.dtype) -> str | None:
        if tuple(got_shape) == tuple(shape) and got_dtype == dtype:
            return None
        return f"is {got_dtype}{list(got_shape)}; this runner's is {dtype}{list(shape)}"

    return check


def leading(
    trailing: tuple[int, ...] | None,
    dtype: np.dtype | None,
    length: int | None,
    most: int | None = None,
    why: str = "",
) -> HeaderCheck:
    """A header check: ``[length, *trailing]`` of ``dtype`` (None: any of that part),
    its length at most ``most`` (``why`` says whose bound it is)."""

    def check(shape: tuple[int, ...], got: np.dtype) -> str | None:
        first = shape[0] if shape else None
        ok = first is not None and (length is None or first == length)
        ok = ok and (trailing is None or tuple(shape[1:]) == tuple(trailing))
        if ok and most is not None and first is not None and first > most:
            return f"is {got}{list(shape)}; expected at most {most} entries ({why})"
        if ok and (dtype is None or got == dtype):
            return None
        lead = "n" if length is None else length
        want = "[..]" if trailing is None else list(trailing)
        return f"is {got}{list(shape)}; expected [{lead}, *{want}] of {dtype or 'a numeric dtype'}"

    return check


def bytes_check(shape: tuple[int, ...], dtype: np.dtype) -> str | None:
    if len(shape) == 1 and dtype == np.uint8:
        return None
    return f"is {dtype}{list(shape)}; expected uint8[n] (a pickle's bytes)"
