"""The HTTP/1.1 client behind an egress proxy, with a private CA: real sockets, a real TLS
handshake through a real CONNECT tunnel (tests/connect_proxy.py)."""

from __future__ import annotations

import contextlib
from functools import partial
from pathlib import Path

import pytest
import trio

from tests.connect_proxy import connect_proxy
from tests.unit.test_h1_client_tls import make_ca_and_server, tls_server
from trio_gateway.core.errors import UpstreamUnreachable
from trio_gateway.http1.client import H1Pool
from trio_gateway.http1.tls import trust_context


def pool(environ: dict[str, str], ca_file: Path | None = None) -> H1Pool:
    return H1Pool(
        "up",
        max_idle=4,
        idle_expiry_s=60,
        connect_timeout_s=5,
        write_timeout_s=5,
        tls=trust_context(str(ca_file) if ca_file else None, environ),
        environ=environ,
    )


async def test_https_goes_through_the_proxy_with_connect_and_its_credentials(
    tmp_path: Path,
) -> None:
    ca_path, context = make_ca_and_server(tmp_path)
    async with connect_proxy() as (proxy_url, seen), tls_server(context, []) as url:
        port = url.split(":")[2].split("/")[0]
        authed = proxy_url.replace("http://", "http://me:s%3Acret@")
        response = await pool({"https_proxy": authed}, ca_path).post(url, {}, b"{}")
        assert await response.read_limited(100) == b"hello"
    assert seen.lines == [f"CONNECT localhost:{port} HTTP/1.1"]
    assert seen.authorizations == ["Basic bWU6czpjcmV0"]  # me:s:cret


async def test_no_proxy_goes_direct(tmp_path: Path) -> None:
    ca_path, context = make_ca_and_server(tmp_path)
    environ = {"HTTPS_PROXY": "", "NO_PROXY": "example.com,localhost"}
    async with connect_proxy() as (proxy_url, seen), tls_server(context, []) as url:
        environ["HTTPS_PROXY"] = proxy_url
        response = await pool(environ, ca_path).post(url, {}, b"{}")
        assert await response.read_limited(100) == b"hello"
    assert seen.lines == []


async def test_ssl_cert_file_is_the_trust_without_a_ca_file(tmp_path: Path) -> None:
    ca_path, context = make_ca_and_server(tmp_path)
    async with connect_proxy() as (proxy_url, seen), tls_server(context, []) as url:
        environ = {"HTTPS_PROXY": proxy_url, "SSL_CERT_FILE": str(ca_path)}
        response = await pool(environ).post(url, {}, b"{}")
        assert await response.read_limited(100) == b"hello"
    assert len(seen.lines) == 1


async def test_an_unknown_ca_through_the_proxy_is_refused_clearly(tmp_path: Path) -> None:
    _, context = make_ca_and_server(tmp_path)
    (tmp_path / "other").mkdir()
    other_ca, _ = make_ca_and_server(tmp_path / "other")
    async with connect_proxy() as (proxy_url, seen), tls_server(context, []) as url:
        with pytest.raises(UpstreamUnreachable, match=r"up: cannot connect.*certificate verify"):
            await pool({"HTTPS_PROXY": proxy_url}, other_ca).post(url, {}, b"{}")
    assert len(seen.lines) == 1


async def test_a_proxy_that_refuses_connect_is_named_in_the_error(tmp_path: Path) -> None:
    ca_path, context = make_ca_and_server(tmp_path)
    async with connect_proxy(refuse=True) as (proxy_url, _), tls_server(context, []) as url:
        with pytest.raises(UpstreamUnreachable, match=r"refused CONNECT localhost:.*403"):
            await pool({"HTTPS_PROXY": proxy_url}, ca_path).post(url, {}, b"{}")


async def test_http_through_the_proxy_is_sent_in_the_absolute_form() -> None:
    targets: list[bytes] = []

    async def serve(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        targets.append(data.split(b"\r\n")[0])
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        async with connect_proxy() as (proxy_url, seen):
            authed = proxy_url.replace("http://", "http://u:p@")
            url = f"http://127.0.0.1:{port}/v1/chat/completions?x=1"
            response = await pool({"HTTP_PROXY": authed}).post(url, {}, b"{}")
            assert await response.read_limited(100) == b"ok"
        nursery.cancel_scope.cancel()
    assert seen.lines == [f"POST {url} HTTP/1.1"]
    assert seen.authorizations == ["Basic dTpw"]
    assert targets == [b"POST /v1/chat/completions?x=1 HTTP/1.1"]  # the proxy's own request


async def silent_or_chatty(answer: bytes | None, stream: trio.SocketStream) -> None:
    """A proxy that never answers CONNECT (``None``), or answers ``answer`` and waits."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await stream.receive_some(65536)
        if answer is not None:
            await stream.send_all(answer)
        await trio.sleep_forever()


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (None, "up: connect timed out"),
        (b"HTTP/1.1 200 OK\r\n" + b"x-pad: " + b"a" * 9000, "answer to CONNECT past 8 KiB"),
        (b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n", "refused CONNECT.*407"),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "refused CONNECT.*SSH"),
    ],
)
async def test_a_proxy_s_answer_to_connect_is_bounded_in_time_and_size(
    answer: bytes | None, error: str
) -> None:
    async with trio.open_nursery() as nursery:
        handler = partial(silent_or_chatty, answer)
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        proxy = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        client = H1Pool(
            "up",
            max_idle=4,
            idle_expiry_s=60,
            connect_timeout_s=0.5,
            write_timeout_s=5,
            environ={"HTTPS_PROXY": proxy},
        )
        with pytest.raises(UpstreamUnreachable, match=error), trio.fail_after(5):
            await client.post("https://provider.example/v1/chat/completions", {}, b"{}")
        nursery.cancel_scope.cancel()


async def test_a_proxy_variable_we_cannot_speak_never_means_direct() -> None:
    client = H1Pool(
        "up",
        max_idle=4,
        idle_expiry_s=60,
        connect_timeout_s=1,
        write_timeout_s=1,
        environ={"HTTP_PROXY": "socks5://proxy:1080"},
    )
    with pytest.raises(UpstreamUnreachable, match=r"up: cannot connect.*http:// proxy URL"):
        await client.post("http://127.0.0.1:9/v1/chat/completions", {}, b"{}")
