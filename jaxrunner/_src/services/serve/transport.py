"""The HTTP transport under uvicorn, with what uvicorn lacks: deadlines on reading requests
and writing answers, bounded pipelining, connection slots (:mod:`.slots`) and head size
limits, each refusal in the app's JSON error format (docs/serving.md, "Limits")."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import socket
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from jaxrunner._src.services.serve.auth import carries_token
from jaxrunner._src.services.serve.config import ServerConfig
from jaxrunner._src.services.serve.slots import ConnectionSlots

logger = logging.getLogger("jaxrunner.serve")

MAX_REQUEST_LINE_BYTES = 8 * 1024
"""Longer request lines get 414 (nginx's default buffer for one)."""
MAX_HEADER_BYTES = 16 * 1024
"""Headers (names, values, separators) beyond this get 431."""
MAX_HEAD_BYTES = MAX_REQUEST_LINE_BYTES + MAX_HEADER_BYTES
"""h11's cap on a head still arriving (its incomplete-event size)."""
EVICTED_LINGER_S = 2.0
"""How long a connection closed for the unauthenticated share after a tokenless request
lingers, unread, before its socket is closed (see :mod:`.slots`)."""
REFUSAL_LOG_INTERVAL_S = 1.0
"""Refused connections are logged at most this often, with their count."""
LINGER_RECEIVE_BUFFER_BYTES = 4 * 1024
"""A lingering socket's kernel receive buffer (``SO_RCVBUF``; Linux doubles it)."""
SEND_BUFFER_BYTES = 64 * 1024
"""Each socket's kernel send buffer (``SO_SNDBUF``; Linux doubles it): all a client that
never reads holds of the kernel's memory (a loopback socket grows to 4 MB by itself)."""


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A transport error answer: status, reason phrase, error code, message."""

    status: int
    reason: str
    code: str
    message: str

    def response(self) -> bytes:
        """The whole ``Connection: close`` response in the app's JSON error format."""
        body = json.dumps({"error": {"code": self.code, "message": self.message}}).encode()
        head = (
            f"HTTP/1.1 {self.status} {self.reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        return head.encode() + body


LINE_TOO_LONG = Refusal(
    414,
    "URI Too Long",
    "request_line_too_long",
    f"the request line is longer than {MAX_REQUEST_LINE_BYTES} bytes; send long data in a "
    "JSON body instead.",
)
HEADERS_TOO_LONG = Refusal(
    431,
    "Request Header Fields Too Large",
    "headers_too_large",
    f"the request headers are longer than {MAX_HEADER_BYTES} bytes in all; send fewer or "
    "shorter headers.",
)


class HeadLimitedConnection(h11.Connection):
    """h11's server connection that also refuses request lines and headers over the
    limits when they came whole in one read (h11 caps only a head still arriving).
    ``refusal`` says why, if a size limit raised the last ``RemoteProtocolError`` (414 or
    431 then, else 400)."""

    def __init__(self, on_request: Callable[[h11.Request], None]) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.refusal: Refusal | None = None
        self.on_request = on_request

    def next_event(self) -> Any:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as err:
            if err.error_status_hint == 431:  # the head still arriving is over the cap
                head = self.trailing_data[0]
                line_whole = b"\r\n" in head[:MAX_REQUEST_LINE_BYTES]
                self.refusal = HEADERS_TOO_LONG if line_whole else LINE_TOO_LONG
            raise
        if isinstance(event, h11.Request):
            line = len(event.method) + len(event.target) + len(b"  HTTP/1.1\r\n")
            headers = sum(len(k) + len(v) + 4 for k, v in event.headers.raw_items())
            if line > MAX_REQUEST_LINE_BYTES or headers > MAX_HEADER_BYTES:
                self.refusal = LINE_TOO_LONG if line > MAX_REQUEST_LINE_BYTES else HEADERS_TOO_LONG
                raise h11.RemoteProtocolError(self.refusal.message, self.refusal.status)
            self.on_request(event)
        return event


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the limits of a :class:`~jaxrunner.serve.ServerConfig`,
    the server's token and its slots (bound by :func:`protocol_class`)."""

    limits: ServerConfig
    token: str | None
    """The token that authenticates a connection; None: any whole request does."""
    slots: ConnectionSlots

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = HeadLimitedConnection(self._on_request)
        self._deadline: asyncio.TimerHandle | None = None
        self._got_bytes = False  # bytes of the request being read have come
        self._write_deadline: asyncio.TimerHandle | None = None
        self._write_left = 0  # bytes waiting when the write deadline was armed
        self._pipelined = 0  # answers in a row with the next request already waiting
        self._lingering: asyncio.TimerHandle | None = None

    # -- connections and slots ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self.slots.admit(self):
            self._log_refusal()
            transport.write(
                Refusal(
                    503,
                    "Service Unavailable",
                    "too_many_connections",
                    f"the server has {self.limits.max_connections} connections open, its "
                    "max_connections, none of them idle; retry later.",
                ).response()
            )
            transport.close()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        self._arm()  # a connection that never sends a whole request is closed too
        if self.slots.over_share() and not self.slots.trim_scheduled:
            self._schedule_trim()

    def _log_refusal(self) -> None:
        """Logs refused connections at most once a second (a record each would cost a
        flooded server the CPU it needs to accept the next ones)."""
        slots = self.slots
        slots.refused += 1
        now = self.loop.time()
        if now - slots.refusal_logged_at >= REFUSAL_LOG_INTERVAL_S:
            logger.warning(
                "refused %d connection(s) since the last report: %d are open",
                slots.refused,
                len(slots),
            )
            slots.refused, slots.refusal_logged_at = 0, now

    def _schedule_trim(self) -> None:
        """Restores the unauthenticated share after the newcomers' grace (one timer per
        server)."""
        slots, loop = self.slots, self.loop
        slots.trim_scheduled = True

        def trim() -> None:
            slots.trim_scheduled = slots.trim()  # some still over the share: again later
            if slots.trim_scheduled:
                loop.call_later(slots.grace_s, trim)

        loop.call_later(slots.grace_s, trim)

    def connection_lost(self, exc: Exception | None) -> None:
        self.slots.release(self)
        if self._lingering is not None:
            self._lingering.cancel()
        self._disarm()
        self._disarm_write()
        super().connection_lost(exc)

    def evict(self, reason: str) -> None:
        """Closes this connection now, dropping any answer it has not taken."""
        logger.info("closed a connection: %s", reason)
        self._disarm()
        self._disarm_write()
        self.transport.abort()

    def linger(self, reason: str) -> None:
        """Closes this idle connection after ``slots.linger_s`` or later, reading nothing
        more meanwhile."""
        if self.transport.get_write_buffer_size():
            self.evict(reason)  # not idle after all: an answer is still going out
            return
        logger.info("closing a connection in %s s or later: %s", self.slots.linger_s, reason)
        self._disarm()
        self._disarm_write()
        self._unset_keepalive_if_required()  # uvicorn's keep-alive timer
        self.transport.pause_reading()
        sock = self.transport.get_extra_info("socket")
        if sock is not None:  # what its owner sends meanwhile is held by the kernel, unread
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, LINGER_RECEIVE_BUFFER_BYTES)
        self._lingering = self.loop.call_later(self.slots.linger_s, self._linger_over)

    def _linger_over(self) -> None:
        if _peer_closed(self.transport.get_extra_info("socket")) or self.slots.linger_over(self):
            self.slots.release(self)
            self._lingering = None
            self.transport.abort()
        else:
            self._lingering = self.loop.call_later(self.slots.linger_s, self._linger_over)

    def _on_request(self, event: h11.Request) -> None:
        if self.token is None or carries_token(event.headers, self.token):
            self.slots.authenticated(self)
        else:
            self.slots.tokenless(self)

    # -- reading ------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first byte of the next request on a kept-alive connection
        self._got_bytes = True
        self.slots.busy(self)
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE and self.conn.their_state is not h11.SEND_BODY:
            self._disarm()  # the whole request is in (or the connection is done)

    def on_response_complete(self) -> None:
        self._got_bytes = False
        waiting = bool(self.conn.trailing_data[0])  # a pipelined request is in already
        self._pipelined = self._pipelined + 1 if waiting else 0
        limit = self.limits.max_pipelined if self.slots.is_authenticated(self) else 0
        if self._pipelined > limit and not self.transport.is_closing():
            logger.info("closed a connection: over its pipelining limit %d", limit)
            self.transport.close()  # after the answers given so far are written
        if self.transport.get_write_buffer_size():
            self._arm_write()
        super().on_response_complete()
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return  # closing, or the next pipelined request is being answered
        if self.conn.trailing_data[0]:  # part of a pipelined request waits
            self._got_bytes = True
            if self._deadline is None:
                self._arm()
        else:
            self.slots.idle(self)

    def send_400_response(self, msg: str) -> None:
        self._disarm()
        refusal = self.conn.refusal or Refusal(
            400, "Bad Request", "bad_http", f"{msg} (malformed HTTP)"
        )
        self.transport.write(refusal.response())
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
                Refusal(
                    408,
                    "Request Timeout",
                    "request_timeout",
                    f"the request did not arrive whole within read_timeout_s="
                    f"{self.limits.read_timeout_s} s; the connection is closed.",
                ).response()
            )
        self.transport.close()  # the app, if waiting for the body, sees a disconnect

    # -- writing ------------------------------------------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        self._arm_write()

    def timeout_keep_alive_handler(self) -> None:
        if self.transport.get_write_buffer_size():
            self.transport.abort()  # close() would wait for a reader that never reads
            return
        super().timeout_keep_alive_handler()

    def _arm_write(self) -> None:
        if self._write_deadline is None:
            self._write_left = self.transport.get_write_buffer_size()
            self._write_deadline = self.loop.call_later(
                self.limits.write_timeout_s, self._write_expired
            )

    def _disarm_write(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    def _write_expired(self) -> None:
        self._write_deadline = None
        left = self.transport.get_write_buffer_size()
        if left == 0:
            return  # all written
        if left < self._write_left:
            self._arm_write()  # progress: the client reads, slowly
            return
        logger.info(
            "dropped a connection: %d bytes of answers unread for write_timeout_s=%s s",
            left,
            self.limits.write_timeout_s,
        )
        self.transport.abort()


def _peer_closed(sock: Any) -> bool:
    """Whether the peer of this unread socket (asyncio's ``TransportSocket``) has closed
    or reset it: a lingering socket its owner gave up holds nothing of theirs."""
    if sock is None or sock.fileno() < 0:
        return True
    peek = socket.socket(fileno=sock.fileno())  # the same file, not a copy: detached below
    try:
        return peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        peek.detach()


def protocol_class(
    limits: ServerConfig, token: str | None, max_lingering: int
) -> type[DeadlineH11Protocol]:
    """The protocol class uvicorn runs (``uvicorn.Config(http=...)``) for ``limits`` and
    ``token``, with the slots of one server: at most ``max_lingering`` lingering
    connections (see :mod:`.slots`), apart from ``max_connections``."""
    slots = ConnectionSlots(
        limits.max_connections,
        limits.unauthenticated_cap,
        linger_s=EVICTED_LINGER_S,
        max_lingering=max_lingering,
    )
    attributes = {"limits": limits, "token": token, "slots": slots}
    return type("JaxRunnerH11Protocol", (DeadlineH11Protocol,), attributes)
