"""The HTTP/1.x edge behind the shipped nginx config (deploy/nginx/trio-gateway.conf), as it is
deployed: raw smuggling attempts sent to a real nginx, and the gateway's server behind it must
never run a request that nginx did not forward as one.

nginx reads a request body whole and sends it on re-framed with a Content-Length, and it is
more lenient than the gateway (of the vectors below it forwards bare-LF chunk lines, 17-digit
chunk sizes, a request line in the trailers: 18 of 45, each as the requests it read); what
reaches the gateway is nginx's reading, and the test holds the chain to that one reading. The
gateway's own strictness is for what passes bytes through unchanged: a client with no proxy in
front, a TCP load balancer, a proxy that streams request bodies."""

from __future__ import annotations

import contextlib
from typing import Any

import trio

from tests.e2e.nginx import running_nginx
from tests.e2e.test_h1_edge import CHUNKED, NEXT, REFUSED
from tests.e2e.test_h1_server import post, serving

SMUGGLING = [
    (
        "CL.TE",
        b"POST /x HTTP/1.1\r\nHost: gw\r\nContent-Length: 6\r\nTransfer-Encoding: chunked"
        b"\r\n\r\n0\r\n\r\nG",
    ),
    (
        "TE.CL",
        b"POST /x HTTP/1.1\r\nHost: gw\r\nContent-Length: 3\r\nTransfer-Encoding: chunked"
        b"\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n",
    ),
    ("TE.TE", CHUNKED[:-2] + b"Transfer-encoding: cow\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
    ("TE with a tab", CHUNKED.replace(b": chunked", b":\tchunked") + b"0\r\n\r\n"),
    *REFUSED,
]


async def test_nothing_reaches_the_gateway_that_nginx_did_not_forward() -> None:
    """Each request nginx forwards is answered to its client (a 200 from the app behind); a
    request the gateway runs that nginx did not forward, smuggled in a body nginx framed
    otherwise, is one more run than the client has answers."""
    runs: list[str] = []

    async def record(scope: Any, receive: Any, send: Any) -> None:
        runs.append(scope["path"])
        while (await receive()).get("more_body"):
            pass
        headers = [(b"content-length", b"2"), (b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})

    async with serving(record) as (_, port), running_nginx(f"127.0.0.1:{port}") as url:
        host, nginx_port = url.removeprefix("http://").split(":")
        for name, attack in SMUGGLING:
            before = len(runs)
            received = b""
            async with await trio.open_tcp_stream(host, int(nginx_port)) as stream:
                with contextlib.suppress(trio.BrokenResourceError):
                    await stream.send_all(attack + NEXT + post("/last", b"", "Connection: close"))
                with trio.move_on_after(5), contextlib.suppress(trio.BrokenResourceError):
                    while data := await stream.receive_some(65536):
                        received += data
            answered = received.count(b"HTTP/1.1 200")
            assert len(runs) - before == answered, (name, runs[before:], received[:300])
