"""The HTTP transport under uvicorn: a deadline on reading each request, a cap on
open connections, and the app's JSON error format for what the transport answers.

uvicorn has no header-read timeout (its keep-alive timer stops at a request's first
byte, and the app waits for a promised body for as long as the client likes), so a
few hundred sockets that send half a request used to hold the server for good.
Here, as Node's ``requestTimeout``: a request must arrive whole (headers and body)
within ``read_timeout_s`` of its first byte, or of the connection opening; a late
one gets ``408`` and its socket is closed. Once a request is in, the app has it
(action timeouts are the app's business) and the clock stops.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("jaxrunner.serve")

MAX_HEADER_BYTES = 16 * 1024
"""Request line and headers beyond this get 400 (h11's incomplete-event cap)."""


@dataclasses.dataclass(frozen=True)
class TransportLimits:
    """What the transport enforces for a :class:`~jaxrunner.serve.PolicyServer`.

    Attributes:
        read_timeout_s: a request must arrive whole within this long.
        max_connections: connections beyond this are answered 503 and closed.
    """

    read_timeout_s: float
    max_connections: int


def raw_error(status: int, reason: str, code: str, message: str) -> bytes:
    """A whole ``Connection: close`` response in the app's JSON error format."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a per-request read deadline, a connection cap and
    JSON transport errors. :func:`protocol_class` binds the limits."""

    limits: TransportLimits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._got_bytes = False  # bytes of the request being read have come

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            logger.warning("refused a connection: %d are open", len(self.connections) - 1)
            transport.write(
                raw_error(
                    503,
                    "Service Unavailable",
                    "too_many_connections",
                    f"the server has {self.limits.max_connections} connections open, its "
                    "max_connections; retry later.",
                )
            )
            transport.close()
            return
        self._arm()  # a connection that never sends a whole request is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first byte of the next request on a kept-alive connection
        self._got_bytes = True
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE and self.conn.their_state is not h11.SEND_BODY:
            self._disarm()  # the whole request is in (or the connection is done)

    def on_response_complete(self) -> None:
        self._got_bytes = False
        super().on_response_complete()
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            if self.conn.trailing_data[0]:  # part of a pipelined request waits
                self._got_bytes = True
                self._arm()

    def send_400_response(self, msg: str) -> None:
        self._disarm()
        self.transport.write(raw_error(400, "Bad Request", "bad_http", f"{msg} (malformed HTTP)"))
        self.transport.close()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.limits.read_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is not h11.IDLE and state is not h11.SEND_BODY:
            return  # the request came whole in the meantime
        responding = self.cycle is not None and self.cycle.response_started
        if self._got_bytes and not responding:
            self.transport.write(
                raw_error(
                    408,
                    "Request Timeout",
                    "request_timeout",
                    f"the request did not arrive whole within read_timeout_s="
                    f"{self.limits.read_timeout_s} s; the connection is closed.",
                )
            )
        self.transport.close()  # the app, if waiting for the body, sees a disconnect


def protocol_class(limits: TransportLimits) -> type[DeadlineH11Protocol]:
    """The protocol class uvicorn runs (``uvicorn.Config(http=...)``) for ``limits``."""
    return type("JaxRunnerH11Protocol", (DeadlineH11Protocol,), {"limits": limits})


__all__ = ["MAX_HEADER_BYTES", "DeadlineH11Protocol", "TransportLimits", "protocol_class"]
