"""The ``.npz`` files of ``Trajectory.save``/``load`` and ``EnvRunner.save``/``restore``:
written whole or not at all; read within bounds as files that may be hostile (only the
members asked for, each once, each ``.npy`` header checked before memory is allocated,
within one byte budget)."""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import stat
import zipfile
from collections.abc import Callable
from typing import Any, Self

import numpy as np

from jaxrunner._src.arg_checks import check_not_folder
from jaxrunner.errors import InvalidArgumentError, JaxRunnerError

NUMERIC_KINDS = "biufc"
"""The ``.npy`` dtype kinds of numeric arrays (bool, ints, floats, complex)."""

HeaderCheck = Callable[[tuple[int, ...], np.dtype], str | None]
"""Checks a member's header (shape, dtype) before it is read: None if it is what the
caller expects, else a description of what is wrong (``"is float32[3]; expected ..."``)."""


def write_npz(path: str, arrays: dict[str, np.ndarray], where: str) -> None:
    """Writes ``arrays`` to one ``.npz`` at exactly ``path`` (no pickle; ``where``, e.g.
    ``"EnvRunner.save"``, names the call in errors): aside, then renamed, so a crash
    mid-write leaves an earlier file at ``path`` whole."""
    folder = os.path.dirname(os.path.abspath(path))
    check_not_folder(path, f"{where}({path!r}): that", "file.npz")
    if not os.path.isdir(folder):
        raise InvalidArgumentError(
            f"{where}({path!r}): the folder {folder!r} does not exist; create it first "
            "(os.makedirs(folder, exist_ok=True))."
        )
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        # An open file: np.savez would append ".npz" to a bare path, and load would miss it.
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]  # names like "a/b" are ours
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # (no file: the open failed)
            os.remove(tmp)
        raise


class NpzReader:
    """An open ``.npz`` file read within bounds; use as a context manager. Each refusal
    raises ``error(what is wrong)``, the caller's error: here, not a regular or zip file,
    or two members of one name. ``max_bytes`` caps the memory of the members read, all
    together (None: no cap); ``budget_hint`` (how to raise it) ends that refusal."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        error: Callable[[str], JaxRunnerError],
        max_bytes: int | None,
        budget_hint: str = "",
    ) -> None:
        self.path = path
        self.error = error
        self._left = math.inf if max_bytes is None else max_bytes
        self._hint = budget_hint
        self._read: dict[str, str] = {}  # member -> the field it was read for
        file = _open_regular(path, error)
        try:
            self._zip = zipfile.ZipFile(file)
        except (OSError, zipfile.BadZipFile, ValueError, EOFError, NotImplementedError) as err:
            file.close()
            raise error(f"cannot be opened as a .npz (zip) file ({err})") from err
        self._file = file
        infos = self._zip.infolist()
        self._members = {info.filename: info for info in infos}
        if len(self._members) != len(infos):  # which one a reader takes would be a guess
            counts = collections.Counter(info.filename for info in infos)
            twice = next(name for name, count in counts.items() if count > 1)
            self.close()
            raise error(f"has two members named {twice!r}; each name may appear once")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._zip.close()
        self._file.close()

    def has(self, name: str) -> bool:
        """Whether the file has an array ``name`` (member ``name.npy``)."""
        return f"{name}.npy" in self._members

    def unread(self) -> list[str]:
        """The file's members not read so far (arrays by name, ``.npy`` dropped)."""
        names = (n[:-4] if n.endswith(".npy") else n for n in self._members)
        return [name for name in names if name not in self._read]

    def read(
        self,
        name: str,
        where: str,
        kinds: str = NUMERIC_KINDS,
        check: HeaderCheck | None = None,
    ) -> np.ndarray:
        """The array ``name`` (member ``name.npy``), read for field ``where`` (named in
        errors). Refused: no such member; read before (one member backs one field); a
        header not of a plain dtype of ``kinds`` (``"U"``: a string), unlike its size, or
        failing ``check`` (all before anything is allocated); beyond ``max_bytes``;
        unreadable (truncated, bad CRC, ...)."""
        info = self._members.get(f"{name}.npy")
        if info is None:
            raise self.error(f"has no array {name!r} (for field {where})")
        if name in self._read:
            raise self.error(
                f"names the array {name!r} for field {self._read[name]} and again for "
                f"field {where}; each array backs one field"
            )
        self._read[name] = where
        try:
            with self._zip.open(info) as member:
                shape, fortran, dtype = _read_header(member)
                if dtype.hasobject or dtype.kind not in kinds or dtype.fields is not None:
                    raise self.error(
                        f"stores field {where} as {dtype}; expected a plain dtype of kind "
                        f"{kinds!r} (never objects)"
                    )
                nbytes = math.prod(shape) * dtype.itemsize
                if info.file_size != member.tell() + nbytes:
                    raise self.error(
                        f"has a member for field {where} whose size ({info.file_size} "
                        f"bytes) disagrees with its header ({shape}, {dtype})"
                    )
                problem = None if check is None else check(shape, dtype)
                if problem is not None:
                    raise self.error(f"has field {where} that {problem}")
                if nbytes > self._left:
                    raise self.error(
                        f"needs more than max_bytes for its arrays (field {where} alone is "
                        f"{nbytes} bytes){self._hint}"
                    )
                self._left -= nbytes
                array = np.empty(shape, dtype, order="F" if fortran else "C")
                # numpy's stubs leave out the buffer protocol ndarray has.
                view = memoryview(array.reshape(-1, order="A").view(np.uint8))  # type: ignore[arg-type]
                filled = 0
                while filled < nbytes:
                    # ZipFile.open's stub says IO[bytes]; it is a ZipExtFile (BufferedIOBase).
                    got = member.readinto(view[filled:])  # type: ignore[attr-defined]
                    if not got:
                        raise ValueError("the member ends early")
                    filled += got
                member.read(1)  # at the end: zipfile checks the CRC
                return array
        except JaxRunnerError:
            raise
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, RuntimeError) as err:
            raise self.error(f"has an unreadable member for field {where} ({err})") from err

    def read_json(self, name: str, where: str, max_bytes: int) -> Any:
        """The JSON document stored as the string array ``name``, at most ``max_bytes``
        bytes in the file (4 per character). Refused as by :meth:`read`, or larger, not
        one string, or not valid JSON (nesting too deep for Python's parser included)."""
        info = self._members.get(f"{name}.npy")
        if info is not None and info.file_size > max_bytes:
            raise self.error(f"has a {info.file_size}-byte {where}; the limit is {max_bytes}")
        raw = self.read(name, where, kinds="U")
        if raw.shape != ():
            raise self.error(f"has a {where} of shape {raw.shape}; expected one string")
        try:
            return json.loads(str(raw))
        except (ValueError, RecursionError) as err:
            what = f"has a {where} that is not valid JSON ({type(err).__name__})"
            raise self.error(what) from err


def _open_regular(path: str | os.PathLike[str], error: Callable[[str], JaxRunnerError]) -> Any:
    """``path`` opened for reading if it is a regular file: zipfile's search for the
    end of a device (``/dev/zero``) or a pipe reads without end. Opened before it is
    checked (without blocking: a pipe's open waits for a writer), so it cannot change
    between the two."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as err:
        raise error(f"cannot be opened ({err})") from err
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a device, pipe or socket"
            raise error(f"is not a regular file ({kind}); expected a .npz file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _read_header(member: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(member)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(member)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(member)
    raise ValueError(f"unsupported .npy version {version}")
