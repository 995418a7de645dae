"""PolicyServer: an :class:`~jaxrunner.ExternalEnv` over HTTP (uvicorn)."""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import pathlib
import resource
import socket
import threading
import time
from typing import Any

import uvicorn

from jaxrunner._src.arg_checks import check_int, check_number
from jaxrunner._src.services.external import ExternalEnv, MultiAgentExternalEnv
from jaxrunner._src.services.external.run_thread import RunDriven
from jaxrunner._src.services.serve.app import create_app
from jaxrunner._src.services.serve.auth import default_token_file, load_or_create_token
from jaxrunner._src.services.serve.transport import protocol_class
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """Where and how a :class:`PolicyServer` listens."""

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
    (JSON) and closed. Each costs at most about 30 KB while it sends its request (24
    KB of head, buffers) and 128 KB of kernel send buffer, and lives at most
    ``read_timeout_s`` unless it sends whole requests; the process's open-file limit
    is raised to fit it where the hard limit allows."""
    max_unauthenticated_connections: int | None = None
    """The most open connections that have not yet sent a request with the token
    (each new connection, until its first request's headers are in); past it, once a
    second's grace for new ones is over, the oldest of them are closed, idle ones
    first. None: an eighth of ``max_connections`` (at
    least 16, at most ``max_connections``). Sockets without the token (slow readers,
    idle keep-alive) can hold no more; with ``require_token=False`` any whole request
    counts. An idle one closed for this share after a request without the token
    lingers 2 s, unread, before its socket is closed, so that its owner cannot come
    back at once; while more than the share linger (an attack), up to 120 s. Lingering
    sockets do not count against ``max_connections``: at most twice as many linger
    (within the open-file limit), the oldest closed first past that."""
    write_timeout_s: float = 10.0
    """Answers waiting to be written must make progress (some bytes taken by the
    client) within this long; otherwise the connection is dropped with what it
    holds (as nginx's ``send_timeout``)."""
    max_pipelined: int = 16
    """The most requests answered in a row while the client has sent more (HTTP
    pipelining); the connection is then closed once its answers are written. A
    connection that has not sent the token gets none: it is closed after its first
    answer if more requests wait."""
    read_timeout_s: float = 5.0
    """A request must arrive whole (headers and body) within this long of its first
    byte, or of its connection opening; otherwise 408 and the socket is closed
    (slow clients can hold no connection longer). Size it for your largest body
    (``max_body_bytes``) over your slowest legitimate link."""
    keep_alive_s: float = 30.0
    """Idle keep-alive connections are closed after this long (longer than clients
    keep them: a client reusing a connection the server is closing gets an error)."""
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
        if self.token is not None and (not isinstance(self.token, str) or len(self.token) < 16):
            raise InvalidArgumentError(
                "ServerConfig(token=...): expected a string of at least 16 characters."
            )
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


def _raise_open_file_limit(wanted: int) -> int:
    """Raises this process's soft open-file limit towards ``wanted`` (as Go's runtime
    does): a 1024 default would refuse connections long before ``max_connections``.
    Returns the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):  # not allowed: the OS's cap stays
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return wanted if soft == resource.RLIM_INFINITY else soft


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class PolicyServer:
    """Serves ``env`` over HTTP. The OpenAPI schema is at ``{url}/openapi.json``.

    Args:
        env: the :class:`~jaxrunner.ExternalEnv` or
            :class:`~jaxrunner._src.services.external.MultiAgentExternalEnv` to serve (its owner
            closes it).
        config: a :class:`ServerConfig`; or its fields as keyword arguments.

    Use :meth:`start` (a background thread) and :meth:`close`, or ``with``; or
    :meth:`serve_forever` in the main thread (Ctrl-C stops it).
    """

    def __init__(
        self,
        env: ExternalEnv | MultiAgentExternalEnv,
        config: ServerConfig | None = None,
        **fields: Any,
    ) -> None:
        if not isinstance(env, RunDriven):  # the base both kinds of ExternalEnv share
            raise InvalidArgumentTypeError(
                "PolicyServer(env=...): expected a jaxrunner.ExternalEnv or a "
                f"jaxrunner._src.services.external.MultiAgentExternalEnv, got {type(env).__name__}."
            )
        if config is not None and fields:
            raise InvalidArgumentError(
                "PolicyServer(): pass a ServerConfig or keyword fields, not both."
            )
        self.config = config = config or ServerConfig(**fields)
        self.env = env
        self.token_file: pathlib.Path | None = None
        self.token: str | None = None
        if config.require_token:
            if config.token is not None:
                self.token = config.token
            else:
                self.token_file = pathlib.Path(config.token_file or default_token_file())
                self.token = load_or_create_token(self.token_file)
        self.asgi_app, self.app = create_app(env, self.token, config.max_body_bytes)
        # The open connections, up to twice as many lingering ones (closed, unread, for the
        # unauthenticated share; see transport.py) and 256 files for the rest, as the
        # open-file limit allows: an accept() refused for it would stall every newcomer.
        files = _raise_open_file_limit(3 * config.max_connections + 256)
        max_lingering = max(
            0, min(2 * config.max_connections, files - config.max_connections - 256)
        )
        family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((config.host, config.port))
        # Listening now, not when uvicorn starts: a client given the url (the CLI
        # prints it before serving) is queued in the backlog instead of refused.
        self._socket.listen()
        host, port = self._socket.getsockname()[:2]
        self.port = int(port)
        self.url = (
            f"http://[{host}]:{port}" if family == socket.AF_INET6 else f"http://{host}:{port}"
        )
        self._server = uvicorn.Server(
            uvicorn.Config(
                self.asgi_app,
                log_level=config.log_level,
                # No handlers of uvicorn's own: records go to the caller's logging
                # setup (or Python's last-resort stderr handler for warnings).
                log_config=None,
                # Our h11 protocol: read and write deadlines, connection slots, head
                # limits, JSON errors.
                http=protocol_class(config, self.token, max_lingering),
                # Typed int by uvicorn, but our H11 protocol only hands it to
                # loop.call_later, which takes float seconds.
                timeout_keep_alive=config.keep_alive_s,  # type: ignore[arg-type]
                server_header=False,
                access_log=False,
            )
        )
        self._thread: threading.Thread | None = None

    def openapi(self) -> dict[str, Any]:
        """The published OpenAPI schema."""
        return self.app.openapi()

    def start(self, timeout_s: float = 30.0) -> PolicyServer:
        """Serves from a background thread; returns once it accepts connections."""
        if self._thread is not None:
            raise InvalidArgumentError("PolicyServer.start(): already started.")
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._socket]},
            name="jaxrunner-server",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the policy server did not start on {self.url}.")
            time.sleep(0.01)
        return self

    def serve_forever(self) -> None:
        """Serves in this thread until interrupted (Ctrl-C or SIGTERM)."""
        self._server.run(sockets=[self._socket])

    def close(self) -> None:
        """Stops serving (the env stays open)."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._socket.close()

    def __enter__(self) -> PolicyServer:
        if self._thread is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
