"""Bearer tokens: generated, kept in a file only its owner can read, compared in
constant time."""

from __future__ import annotations

import hmac
import os
import pathlib
import secrets
import stat
from collections.abc import Iterable

from jaxrunner._src.arg_checks import check_not_folder
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError


def default_token_file() -> pathlib.Path:
    """``$XDG_CONFIG_HOME/jaxrunner/serve-token`` (``~/.config/...`` by default)."""
    base = os.environ.get("XDG_CONFIG_HOME") or pathlib.Path.home() / ".config"
    return pathlib.Path(base) / "jaxrunner" / "serve-token"


def load_or_create_token(path: str | os.PathLike[str]) -> str:
    """The token stored at ``path``, refused if others can read the file (a token anyone
    can read protects nothing); a new random one (written with mode 0600) if the file
    does not exist."""
    path = _not_a_folder(path)
    if path.exists():
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise InvalidArgumentError(
                f"token file {path} has mode {oct(mode)}: others can read it. Run "
                f"`chmod 600 {path}` (or delete it to get a new token)."
            )
        token = path.read_text().strip()
        if len(token) < 16:
            raise InvalidArgumentError(
                f"token file {path} holds no token of at least 16 characters; delete it to get a "
                "new one."
            )
        check_sendable(token, f"token file {path}")
        return token
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = secrets.token_urlsafe(32)
    # O_EXCL: never follow a planted symlink or overwrite a file created meanwhile.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(token + "\n")
    return token


def read_token(path: str | os.PathLike[str]) -> str:
    """The token in an existing token file (for clients)."""
    file = _not_a_folder(path)
    if not file.exists():
        raise InvalidArgumentError(
            f"token file {path} does not exist; pass the file the server wrote (its "
            "token_file, printed when `jaxrunner serve` starts) or token=server.token."
        )
    token = file.read_text().strip()
    if not token:
        raise InvalidArgumentError(f"token file {path} is empty.")
    check_sendable(token, f"token file {path}")
    return token


def check_sendable(token: object, where: str) -> None:
    """Raises unless ``token`` can match in an ``Authorization`` header: printable ASCII
    (httpx sends no other, and the server reads headers as latin-1) with no space around
    it (the header's are stripped). Its characters are never shown: it is a secret."""
    if not isinstance(token, str):
        raise InvalidArgumentTypeError(
            f"{where}: expected the token as a str, got {type(token).__name__}."
        )
    bad = next((i for i, c in enumerate(token) if not " " <= c <= "~"), None)
    if bad is None and token == token.strip():
        return
    why = (
        "it starts or ends with a space"
        if bad is None
        else f"its character at index {bad} is not printable ASCII"
    )
    raise InvalidArgumentError(
        f"{where}: {why}, so no request can carry the token (every one would get 401); use "
        "ASCII letters, digits and punctuation, e.g. a new token of secrets.token_urlsafe(32)."
    )


def _not_a_folder(path: str | os.PathLike[str]) -> pathlib.Path:
    # (a folder's mode would be blamed, or read_text raise IsADirectoryError)
    check_not_folder(path, f"token file {path}", "serve-token")
    return pathlib.Path(path)


def carries_token(headers: Iterable[tuple[bytes, bytes]], token: str) -> bool:
    """Whether a request's ``(name, value)`` headers carry the token in their one
    ``Authorization`` header. Two or more are refused whichever holds the token, so the
    guard (401) and the connection slots read every request alike (they took the last
    and the first) and no proxy in front can read another one than the server."""
    values = [value for name, value in headers if name.lower() == b"authorization"]
    return len(values) == 1 and token_matches(values[0].decode("latin-1"), token)


def token_matches(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <token>`` (the token compared
    in constant time; the scheme in any case, as RFC 7235 has it: ``bearer <token>``)."""
    scheme, _, credentials = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(credentials.strip().encode(), token.encode())
