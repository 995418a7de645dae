"""PolicyServer: an :class:`~jaxrunner.ExternalEnv` over HTTP (uvicorn)."""

from __future__ import annotations

import contextlib
import pathlib
import resource
import socket
import threading
import time
from typing import Any

import uvicorn

from jaxrunner._src.arg_checks import check_config
from jaxrunner._src.services.external import ExternalEnv, MultiAgentExternalEnv
from jaxrunner._src.services.external.run_thread import RunDriven
from jaxrunner._src.services.serve.auth import default_token_file, load_or_create_token
from jaxrunner._src.services.serve.config import ServerConfig
from jaxrunner._src.services.serve.routes import create_app
from jaxrunner._src.services.serve.transport import protocol_class
from jaxrunner.errors import InvalidArgumentError, InvalidArgumentTypeError


def _raise_open_file_limit(wanted: int) -> int:
    """Raises this process's soft open-file limit towards ``wanted`` (as Go's runtime
    does; 1024 would refuse connections long before ``max_connections``); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):  # not allowed: the OS's cap stays
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return wanted if soft == resource.RLIM_INFINITY else soft


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
                f"jaxrunner.multi_agent.MultiAgentExternalEnv, got {type(env).__name__}."
            )
        if config is not None and fields:
            raise InvalidArgumentError(
                "PolicyServer(): pass a ServerConfig or keyword fields, not both."
            )
        if config is None:
            config = ServerConfig(**fields)
        self.config = config = check_config(
            "PolicyServer", config, ServerConfig, home="jaxrunner.serve"
        )
        self.env = env
        self.token_file: pathlib.Path | None = None
        self.token = config.token if config.require_token else None
        if config.require_token and self.token is None:
            self.token_file = pathlib.Path(config.token_file or default_token_file())
            self.token = load_or_create_token(self.token_file)
        self.asgi_app, self.app = create_app(env, self.token, config.max_body_bytes)
        # Files for the connections, up to twice as many lingering ones (see slots.py) and
        # 256 for the rest: an accept() refused for want of one would stall every newcomer.
        files = _raise_open_file_limit(3 * config.max_connections + 256)
        max_lingering = max(
            0, min(2 * config.max_connections, files - config.max_connections - 256)
        )
        family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((config.host, config.port))
        except OSError as err:  # a port in use, an unknown host: named, not a traceback
            self._socket.close()
            raise InvalidArgumentError(
                f"PolicyServer: cannot listen on host {config.host!r}, port {config.port} "
                f"({err.strerror or err}); pick a free port (port=0, or --port 0, picks one) "
                "or a host of this machine."
            ) from err
        # Listening now: a client given the url before uvicorn starts is queued, not refused.
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
                log_config=None,  # records go to the caller's logging setup
                http=protocol_class(config, self.token, max_lingering),
                # Typed int by uvicorn, but only handed to loop.call_later (float seconds).
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
