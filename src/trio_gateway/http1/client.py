"""The streaming request's HTTP/1.1 client: one request on a trio stream, read by llhttp.

The per-chunk read is one socket read and one pass of llhttp (``response.py``): no async
generator layers, no cancel scope per read (the caller's ``ReadTimer`` bounds reads). Everything
else the upstream exchange needs is here too, and nothing more: a bounded set of idle
connections per origin, TLS with the provider's trust (``tls.py``), an egress proxy from the
environment (``proxy.py``: CONNECT for https, the absolute form for http), and the one boundary
where socket, TLS and protocol failures become the gateway's errors, named as before
(``cannot connect``, ``connect timed out``, ``connection lost``).

New connections to a provider are bounded: at most ``max_dials_in_flight`` at once, each counted
from its dial until the response head came (the server had accepted it and read the request),
so the connections a storm of requests opens at once never overflow the server's listen queue
(its backlog: uvicorn's, so vLLM's, is 2048) into dropped SYNs and connect timeouts. The rest
wait for their turn in order, within ``dial_wait_s``, and are then refused as ``Overloaded``
(the request moves to the next provider, as from a full gate). Reused connections are not
counted: the server accepted them long ago.

A connection goes back to the idle set only after a whole body on a keep-alive response;
anything else (an error, a cancel, a body not read to its end) closes it. Idle connections are
dropped after ``idle_expiry_s``, below the servers' own idle timeouts; one a server closed
anyway is noticed before use (it is readable), and a request whose reused connection failed
before a single response byte is sent once more on a new one: the server cannot have run it.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import NoReturn
from urllib.parse import urlsplit

import attrs
import httpx
import trio

from trio_gateway.core.descriptors import is_exhaustion
from trio_gateway.core.errors import (
    DescriptorsExhausted,
    Overloaded,
    UpstreamProtocolError,
    UpstreamUnreachable,
)
from trio_gateway.http1.dial import ConnectTimedOut, open_tcp_stream
from trio_gateway.http1.errors import H1Error
from trio_gateway.http1.exhaustion import note
from trio_gateway.http1.proxy import Proxy, proxy_for
from trio_gateway.http1.response import ResponseHead, ResponseParser
from trio_gateway.http1.tls import trust_context

# One read of a stream's body, at most. A stream whose client is slow holds one read and its
# rendered chunks while it waits for room (the upstream keeps sending meanwhile, so the next read
# is a full one): 200 such streams held 26 MB at 64 KiB (docs/benchmarks.md, scenario E).
READ_BYTES = 16384
# What the kernel may hold of one upstream answer that the gateway is not reading (its client
# is slow): set on every upstream socket, so the upstream feels a slow client soon, as it would
# if the client were its own. Left to the kernel's autotuning, a buffer read fast before the
# client stalled grew to about a MiB (up to tcp_rmem's maximum), a simulator whose writes never
# blocked generated every token of 200 stalled answers, and the other streams paid for it
# (docs/benchmarks.md, scenario E). The kernel doubles it (32 KiB, about half of it window): at
# a 100 ms round trip, 160 KB/s, several times the fastest token stream. Set before the
# handshake (dial.py): set after it, a loopback answer held back once crawled ever after.
UPSTREAM_RCVBUF_BYTES = 16384
# A proxy's answer to CONNECT is a head and nothing more; one past this is not a proxy's.
MAX_PROXY_HEAD_BYTES = 8192


@attrs.frozen
class Origin:
    scheme: str
    host: str
    port: int


def split_url(url: str) -> tuple[Origin, str, str]:
    """``url`` → its origin, the request target (path and query) and the Host header."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    default = 443 if parts.scheme == "https" else 80
    port = parts.port or default
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    host_header = host if port == default else f"{host}:{port}"
    return Origin(parts.scheme, parts.hostname, port), target, host_header


def encode_request(target: str, host: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = [f"POST {target} HTTP/1.1", f"host: {host}", f"content-length: {len(body)}"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise ValueError(f"header {name!r} holds a line break or a colon")
        if name.lower() not in ("host", "content-length"):
            lines.append(f"{name}: {value}")
    if not any(name.lower() == "accept-encoding" for name in headers):
        # Without it any coding is acceptable (RFC 9110 section 12.5.3); one that comes anyway
        # is decoded (response.py).
        lines.append("accept-encoding: identity")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _socket_of(stream: trio.abc.Stream) -> trio.socket.SocketType | None:
    inner = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    return inner.socket if isinstance(inner, trio.SocketStream) else None


def _readable(stream: trio.abc.Stream) -> bool:
    """An idle connection with something to read was closed (or is talking nonsense)."""
    sock = _socket_of(stream)
    if sock is None:  # an in-memory stream (tests): nothing to look at
        return False
    # poll, not select: select refuses descriptors past 1024, and a gateway holding thousands
    # of streams has them (the scale benchmark turned them into 500s).
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))


def _shut_down(stream: trio.abc.Stream) -> None:
    """Both ways shut, from outside the task using ``stream``: its server reads the end at
    once, and that task's next read or write fails (its close stays that task's)."""
    sock = _socket_of(stream)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


async def _close(stream: trio.abc.Stream) -> None:
    # Closes at once even in a cancelled scope (no graceful TLS close_notify): trio's
    # streams release the socket before their first checkpoint.
    await trio.aclose_forcefully(stream)


class H1Pool:
    """Connections to the origins of one provider."""

    def __init__(
        self,
        provider: str,
        *,
        max_idle: int,
        idle_expiry_s: float,
        connect_timeout_s: float,
        write_timeout_s: float,
        connect: Callable[[Origin], Awaitable[trio.abc.Stream]] | None = None,
        tls: ssl.SSLContext | None = None,
        environ: Mapping[str, str] | None = None,
        max_dials_in_flight: int = 1024,
        dial_wait_s: float = math.inf,
    ) -> None:
        self.provider = provider
        # Tests put an in-memory server here; by default, TCP (and TLS for https).
        self._connect = connect or self._open
        self.max_idle = max_idle
        self.idle_expiry_s = idle_expiry_s
        self.connect_timeout_s = connect_timeout_s
        self.write_timeout_s = write_timeout_s
        self._idle: dict[Origin, list[tuple[trio.abc.Stream, float]]] = {}
        self._ssl = tls
        # HTTPS_PROXY / HTTP_PROXY / NO_PROXY (proxy.py), read when the pool is made.
        self._environ = dict(os.environ if environ is None else environ)
        self._proxies: dict[Origin, Proxy | None] = {}
        # New connections from their dial to their response head (the module docstring). FIFO.
        self._dials = trio.CapacityLimiter(max_dials_in_flight)
        self.dial_wait_s = dial_wait_s
        self.dials_peak = 0  # the most in flight at once, since made (tests, benchmarks)

    def resize_dials(self, max_dials_in_flight: int, dial_wait_s: float) -> None:
        self._dials.total_tokens = max_dials_in_flight
        self.dial_wait_s = dial_wait_s

    def dial_statistics(self) -> tuple[int, int, int]:
        """New connections in flight, requests waiting to dial, and the bound."""
        stats = self._dials.statistics()
        return stats.borrowed_tokens, stats.tasks_waiting, int(stats.total_tokens)

    def idle_count(self) -> int:
        return sum(len(v) for v in self._idle.values())

    def _take_idle(self, origin: Origin) -> trio.abc.Stream | None:
        idle = self._idle.get(origin)
        now = trio.current_time()
        while idle:
            stream, since = idle.pop()
            if now - since < self.idle_expiry_s and not _readable(stream):
                return stream
            _close_now(stream)
        return None

    def close_idle(self) -> None:
        """Close every idle connection (a provider retired by a reload)."""
        idle, self._idle = self._idle, {}
        for streams in idle.values():
            for stream, _ in streams:
                _close_now(stream)

    def close_expired(self) -> int:
        """Close the idle connections older than ``idle_expiry_s``; how many were."""
        now = trio.current_time()
        closed = 0
        for origin, idle in list(self._idle.items()):
            # Oldest first (connections are appended as they come back): a prefix has expired.
            fresh = 0
            while fresh < len(idle) and now - idle[fresh][1] >= self.idle_expiry_s:
                _close_now(idle[fresh][0])
                fresh += 1
            closed += fresh
            if fresh == len(idle):
                del self._idle[origin]
            elif fresh:
                del idle[:fresh]
        return closed

    async def expire_idle(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """A gateway that goes quiet holds no connection past its expiry for long: one look
        per ``idle_expiry_s`` (so each is closed within two of them), not only when the next
        request comes. Thousands of streams that ended together left thousands of descriptors
        open otherwise (docs/benchmarks.md, scenario D)."""
        task_status.started()
        while True:
            await trio.sleep(self.idle_expiry_s)
            self.close_expired()

    def put_idle(self, origin: Origin, stream: trio.abc.Stream) -> bool:
        idle = self._idle.setdefault(origin, [])
        if len(idle) >= self.max_idle:
            return False
        idle.append((stream, trio.current_time()))
        return True

    def proxy(self, origin: Origin) -> Proxy | None:
        """The egress proxy of ``origin`` (proxy.py), decided once per origin."""
        if origin not in self._proxies:
            url = f"{origin.scheme}://{origin.host}:{origin.port}"
            self._proxies[origin] = proxy_for(url, self._environ)
        return self._proxies[origin]

    async def _open(self, origin: Origin) -> trio.abc.Stream:
        proxy = self.proxy(origin)
        dial_host, dial_port = (origin.host, origin.port) if proxy is None else proxy.address()
        tcp = await open_tcp_stream(
            dial_host,
            dial_port,
            rcvbuf_bytes=UPSTREAM_RCVBUF_BYTES,
            connect_timeout_s=self.connect_timeout_s,
        )
        stream: trio.abc.Stream = tcp
        if origin.scheme == "https":
            if proxy is not None:
                await _tunnel(tcp, proxy, origin)
            if self._ssl is None:
                self._ssl = trust_context(None, self._environ)
            tls = trio.SSLStream(
                stream, self._ssl, server_hostname=origin.host, https_compatible=True
            )
            await tls.do_handshake()
            stream = tls
        return stream

    async def _dial(self, origin: Origin) -> trio.abc.Stream:
        name = self.provider
        # The TCP attempts and the name's resolution time themselves, the attempts from their
        # SYNs (dial.py says why): a plain dial needs no deadline of its own. What comes after
        # the TCP connection (a proxy's tunnel, TLS's handshake) is bounded here, at twice the
        # connect timeout with the attempts' part; a connect of a test's own at once.
        bound_s = self.connect_timeout_s
        if self._connect == self._open:
            bound_s = math.inf if origin.scheme == "http" else 2 * bound_s
        try:
            with trio.move_on_after(bound_s) as late:
                stream = await self._connect(origin)
        except ConnectTimedOut:
            raise UpstreamUnreachable(f"{name}: connect timed out", provider=name) from None
        except (OSError, trio.BrokenResourceError, ssl.SSLError, ValueError) as exc:
            cause = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) else exc
            if isinstance(cause, OSError) and is_exhaustion(cause):
                note("dial", cause)
                raise DescriptorsExhausted(
                    f"the gateway is out of file descriptors ({os.strerror(cause.errno or 0)})"
                    f" and cannot reach {name}; retry shortly"
                ) from None
            raise UpstreamUnreachable(
                f"{name}: cannot connect ({cause or 'connection refused'})", provider=name
            ) from None
        if late.cancelled_caught:
            raise UpstreamUnreachable(f"{name}: connect timed out", provider=name)
        return stream

    async def post(
        self,
        url: str,
        headers: dict[str, str],
        body: bytes,
        on_sending: Callable[[Callable[[], None]], object] | None = None,
    ) -> H1Response:
        """Send the request and read the response head; the caller bounds the whole with its
        own deadline (the first-token deadline) and must ``aclose`` the response.

        ``on_sending`` is given, as the request goes out on a connection, a way to end that
        exchange from outside the task waiting for its head (both ways shut: the server reads
        the end at once), as :meth:`H1Response.abort` does once the head came."""
        origin, target, host = split_url(url)
        name = self.provider
        try:
            proxy = self.proxy(origin) if origin.scheme == "http" else None
        except ValueError as exc:  # the variable holds no proxy we speak: never go direct
            raise UpstreamUnreachable(f"{name}: cannot connect ({exc})", provider=name) from None
        try:
            if proxy is not None:
                # Through a proxy in the clear: the absolute form (RFC 9112 section 3.2.2).
                target = f"http://{host}{target}"
                if proxy.authorization is not None:
                    headers = {**headers, "proxy-authorization": proxy.authorization}
            payload = encode_request(target, host, headers, body)
        except ValueError as exc:
            raise UpstreamProtocolError(f"{self.provider}: {exc}", provider=self.provider) from None
        stream = self._take_idle(origin)
        if stream is not None:
            response = await self._exchange(origin, stream, payload, True, on_sending)
            if response is not None:
                return response
        await self._dial_turn()
        try:
            stream = await self._dial(origin)
            response = await self._exchange(origin, stream, payload, False, on_sending)
        finally:
            self._dials.release()
        assert response is not None
        return response

    async def _dial_turn(self) -> None:
        """A place among the dials in flight, in arrival order, within ``dial_wait_s``."""
        dials = self._dials
        try:
            dials.acquire_nowait()
        except trio.WouldBlock:
            with trio.move_on_after(self.dial_wait_s) as late:
                await dials.acquire()
            if late.cancelled_caught:
                raise Overloaded(
                    f"{self.provider}: {int(dials.total_tokens)} new connections already "
                    f"waiting for their answer for {self.dial_wait_s:g} s",
                    provider=self.provider,
                ) from None
        self.dials_peak = max(self.dials_peak, dials.borrowed_tokens)

    async def _exchange(
        self,
        origin: Origin,
        stream: trio.abc.Stream,
        payload: bytes,
        reused: bool,
        on_sending: Callable[[Callable[[], None]], object] | None,
    ) -> H1Response | None:
        """None: a reused connection failed before any response byte (send again, anew)."""
        name = self.provider
        parser = ResponseParser()
        got_bytes = False
        if on_sending is not None:
            on_sending(partial(_shut_down, stream))
        # A plain TCP connection is written and read as H1Response.receive reads it: a request
        # fits the socket's buffer, so one send() without a deadline or a trip through trio's
        # scheduler (send_all always yields once, even when the bytes went at once), then one
        # wait and one read per piece of the head (receive_some yields after reading too). Two
        # schedule points fewer per request (docs/benchmarks.md, issue 43).
        sock = stream.socket if isinstance(stream, trio.SocketStream) else None
        try:
            sent = 0
            if sock is not None:
                await trio.lowlevel.checkpoint_if_cancelled()
                with contextlib.suppress(BlockingIOError):
                    sent = os.write(sock.fileno(), payload)
            if sent < len(payload):
                with trio.move_on_after(self.write_timeout_s) as late:
                    await stream.send_all(memoryview(payload)[sent:])
                if late.cancelled_caught:
                    raise UpstreamProtocolError(
                        f"{name}: the request could not be sent within {self.write_timeout_s:g} s",
                        provider=name,
                    )
            while True:
                if sock is not None:
                    await trio.lowlevel.wait_readable(sock)
                    try:
                        data = os.read(sock.fileno(), READ_BYTES)
                    except BlockingIOError:
                        continue  # woken for nothing
                else:
                    data = bytes(await stream.receive_some(READ_BYTES))
                if not data:
                    if reused and not got_bytes:
                        await _close(stream)
                        return None
                    raise UpstreamProtocolError(
                        f"{name}: connection lost (server disconnected without sending a response)",
                        provider=name,
                    )
                got_bytes = True
                head = parser.feed(data)
                if head is not None:
                    break
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            await _close(stream)
            if reused and not got_bytes:
                return None
            raise UpstreamProtocolError(
                f"{name}: connection lost ({_describe(exc)})", provider=name
            ) from None
        except H1Error as exc:
            await _close(stream)
            raise UpstreamProtocolError(f"{name}: {exc}", provider=name) from None
        except BaseException:
            await _close(stream)
            raise
        return H1Response(self, origin, stream, head, parser)


async def _tunnel(stream: trio.abc.Stream, proxy: Proxy, origin: Origin) -> None:
    """``CONNECT host:port`` through ``proxy``; raises OSError unless it answers 2xx. Bounded
    by the caller's connect deadline, and here by the size of the answer's head."""
    host = origin.host if ":" not in origin.host else f"[{origin.host}]"
    authority = f"{host}:{origin.port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"host: {authority}"]
    if proxy.authorization is not None:
        lines.append(f"proxy-authorization: {proxy.authorization}")
    await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    head = b""
    # The server speaks only after our ClientHello, so whole reads never take its bytes.
    while b"\r\n\r\n" not in head:
        if len(head) > MAX_PROXY_HEAD_BYTES:
            raise OSError(f"proxy {proxy.display()}: an answer to CONNECT past 8 KiB")
        data = await stream.receive_some(MAX_PROXY_HEAD_BYTES)
        if not data:
            raise OSError(f"proxy {proxy.display()} closed the connection on CONNECT")
        head += data
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1", "replace")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].startswith("2"):
        raise OSError(f"proxy {proxy.display()} refused CONNECT {authority}: {status_line!r}")
    if not head.endswith(b"\r\n\r\n"):
        raise OSError(f"proxy {proxy.display()} sent bytes after its answer to CONNECT")


def _describe(exc: BaseException) -> str:
    cause = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) else exc
    return str(cause) or cause.__class__.__name__


def _close_now(stream: trio.abc.Stream) -> None:
    """Close without waiting (an idle connection that is stale: nothing to say to it)."""
    sock = _socket_of(stream)
    if sock is not None:
        sock.close()


class H1Response:
    """One response: its head, and its body read part by part."""

    def __init__(
        self,
        pool: H1Pool,
        origin: Origin,
        stream: trio.abc.Stream,
        head: ResponseHead,
        parser: ResponseParser,
    ) -> None:
        self._pool = pool
        self._origin = origin
        self._stream: trio.abc.Stream | None = stream
        self.head = head
        self.status_code = head.status
        self._parser = parser
        self._aborted = False

    def abort(self) -> None:
        """Tell the server at once that this exchange is over (both ways shut: it reads the end
        of the connection), from outside the task reading it: nothing waits. The connection is
        never reused; :meth:`aclose` still closes it."""
        self._aborted = True
        if self._stream is not None:
            _shut_down(self._stream)

    @property
    def headers(self) -> httpx.Headers:
        """The head's headers as a case-blind mapping, made when asked for (an error's
        classification): thousands of streams at once each held one otherwise."""
        return httpx.Headers(list(self.head.headers))

    @property
    def ended(self) -> bool:
        """The body was read whole and every byte of it given out by :meth:`receive`."""
        return self._parser.done and not self._parser.pending

    def _failed(self, detail: str) -> UpstreamProtocolError:
        return UpstreamProtocolError(
            f"{self._pool.provider}: {detail}", provider=self._pool.provider
        )

    async def receive(self) -> list[bytes]:
        """The next body bytes, as they arrived ([] once the body ended)."""
        parser = self._parser
        try:
            parts = parser.pieces()  # what came with the head, or a read's decoded rest
            if parts or parser.done:
                return parts
            # The read inline, not in a coroutine of its own: thousands of streams wait here
            # at once, each holding every frame of its chain. A plain TCP connection is read as
            # receive_some would, with one trip through trio's scheduler instead of two:
            # receive_some reads, yields even when there was data, and on the next call reads
            # once in vain before it waits. Waiting first costs nothing when data is there.
            stream = self._stream
            assert stream is not None
            try:
                if isinstance(stream, trio.SocketStream):
                    sock = stream.socket
                    while True:
                        await trio.lowlevel.wait_readable(sock)
                        try:
                            data = os.read(sock.fileno(), READ_BYTES)
                            break
                        except BlockingIOError:
                            continue  # woken for nothing (the response owns the socket)
                else:
                    # bytes() of bytes is the same object: a copy only for TLS's bytearray.
                    data = bytes(await stream.receive_some(READ_BYTES))
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise self._failed(f"connection lost ({_describe(exc)})") from None
            if data:
                parser.feed(data)
            else:
                parser.eof()
            return parser.pieces()
        except H1Error as exc:
            raise self._failed(exc.message) from None

    async def read_limited(self, limit: int) -> bytes:
        """At most ``limit`` bytes of the body (error bodies, whole answers)."""
        parts: list[bytes] = []
        size = 0
        while size < limit:
            got = await self.receive()
            if not got:
                if self.ended:
                    break
                continue
            parts += got
            size += sum(len(p) for p in got)
        return b"".join(parts)[:limit]

    async def aclose(self) -> None:
        """Give the connection back if the body was read whole on a keep-alive response, with
        nothing after it; else close it."""
        stream, self._stream = self._stream, None
        if stream is None:
            return
        parser = self._parser
        reusable = (
            parser.done
            and not parser.extra
            and not parser.until_close
            and self.head.keep_alive
            and not self._aborted
        )
        if reusable and self._pool.put_idle(self._origin, stream):
            return
        await _close(stream)
