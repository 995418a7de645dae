"""Errors of a part of a vector env (a Ray actor's block, the worker processes' share)
renumbered to name the whole vector env's sub-envs."""

from __future__ import annotations


def with_global_env_index(err: BaseException, offset: int, part: str) -> BaseException:
    """``err``, raised by a part of a vector env whose sub-env 0 is the whole's sub-env
    ``offset`` (a Ray actor's block, the worker processes' share), made to name the
    whole's sub-envs: ``env_index`` (and a worker error's ``env_indices``) shifted, with
    a note naming both. Returns ``err``."""
    index, indices = getattr(err, "env_index", None), getattr(err, "env_indices", None)
    if offset and isinstance(index, int) and index >= 0:
        err.env_index = offset + index  # type: ignore[attr-defined]
        err.add_note(
            f"jaxrunner: sub-env {index} of {part} is sub-env {offset + index} of the vector env."
        )
    if offset and isinstance(indices, range):
        err.env_indices = range(indices.start + offset, indices.stop + offset)  # type: ignore[attr-defined]
        err.add_note(
            f"jaxrunner: sub-envs {indices.start}..{indices.stop - 1} of {part} are "
            f"sub-envs {indices.start + offset}..{indices.stop - 1 + offset} of the vector env."
        )
    return err
