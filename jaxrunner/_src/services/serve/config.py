"""ServerConfig: where a :class:`~jaxrunner.serve.PolicyServer` listens, and its limits."""

from __future__ import annotations

import dataclasses
import ipaddress
import os

from jaxrunner._src.arg_checks import check_int, check_number, check_path
from jaxrunner._src.services.serve.auth import check_sendable
from jaxrunner.errors import InvalidArgumentError


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """Where and how a :class:`~jaxrunner.serve.PolicyServer` listens (the limits:
    docs/serving.md, "Limits")."""

    host: str = "127.0.0.1"
    """Interface to bind; loopback unless you say otherwise."""
    port: int = 0
    """TCP port; 0 picks a free one (see ``PolicyServer.url``)."""
    require_token: bool = True
    """Refuse requests without ``Authorization: Bearer <token>`` (401). Turning this
    off is only allowed on a loopback host."""
    token: str | None = None
    """The token; None reads ``token_file``, or creates it with a new random token."""
    token_file: str | os.PathLike[str] | None = None
    """Where the token lives (mode 0600); None: ``~/.config/jaxrunner/serve-token``."""
    max_body_bytes: int = 1 << 20
    """Larger request bodies are refused (413) before they are parsed."""
    max_connections: int = 2048
    """The most open connections. At the cap a new connection closes the one idle
    the longest (those without a token first); with none idle it is answered 503
    (JSON) and closed. The process's open-file limit is raised to fit it where the
    hard limit allows."""
    max_unauthenticated_connections: int | None = None
    """The most open connections that have not yet sent a request with the token;
    past it, once a second's grace for new ones is over, the oldest of them are
    closed, idle ones first. None: an eighth of ``max_connections`` (at least 16, at
    most ``max_connections``). With ``require_token=False`` any whole request counts."""
    write_timeout_s: float = 10.0
    """Answers waiting to be written must make progress (some bytes taken by the
    client) within this long; otherwise the connection is dropped with what it
    holds (as nginx's ``send_timeout``)."""
    max_pipelined: int = 16
    """The most requests answered in a row while the client has sent more (HTTP
    pipelining); the connection is then closed once its answers are written. None
    without the token."""
    read_timeout_s: float = 5.0
    """A request must arrive whole (headers and body) within this long of its first
    byte, or of its connection opening; otherwise 408 and the socket is closed. Size
    it for your largest body (``max_body_bytes``) over your slowest legitimate link."""
    keep_alive_s: float = 30.0
    """Idle keep-alive connections are closed after this long (longer than clients keep
    them, or a client may reuse a connection being closed: an error)."""
    log_level: str = "warning"
    """uvicorn's log level."""

    def __post_init__(self) -> None:
        check_int("ServerConfig", "port", self.port, low=0, high=65535, hint="0: any free port")
        for name in ("max_body_bytes", "max_connections", "max_pipelined"):
            check_int("ServerConfig", name, getattr(self, name))
        check_int(
            "ServerConfig", "max_unauthenticated_connections",
            self.max_unauthenticated_connections, high=self.max_connections,
            hint=f"at most max_connections={self.max_connections}", none="for the default share",
        )  # fmt: skip
        for name in ("read_timeout_s", "keep_alive_s", "write_timeout_s"):
            check_number("ServerConfig", name, getattr(self, name), low_open=True, hint="seconds")
        if self.token_file is not None:
            check_path("ServerConfig", "token_file", self.token_file)
        if self.token is not None and (not isinstance(self.token, str) or len(self.token) < 16):
            raise InvalidArgumentError(
                "ServerConfig(token=...): expected a string of at least 16 characters."
            )
        if self.token is not None:
            check_sendable(self.token, "ServerConfig(token=...)")
        if not self.require_token and not _is_loopback(self.host):
            raise InvalidArgumentError(
                f"ServerConfig(host={self.host!r}, require_token=False): serving without a token "
                "is only allowed on a loopback host; anyone who can reach the port could feed the "
                "policy. Keep the token (clients read it from the token file)."
            )

    @property
    def unauthenticated_cap(self) -> int:
        """``max_unauthenticated_connections``, with None resolved."""
        if self.max_unauthenticated_connections is not None:
            return self.max_unauthenticated_connections
        return min(self.max_connections, max(16, self.max_connections // 8))


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
