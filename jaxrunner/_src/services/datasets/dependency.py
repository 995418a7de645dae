"""The optional Minari import, with the install hint when it is missing."""

from __future__ import annotations

from typing import Any

from jaxrunner.errors import MissingDependencyError


def import_minari() -> Any:
    try:
        import minari
    except ImportError as err:
        raise MissingDependencyError(
            'jaxrunner._src.services.datasets needs Minari: pip install "jaxrunner[minari]".'
        ) from err
    return minari
