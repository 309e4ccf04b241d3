"""The HTTP/1.1 client over TLS: a real handshake with a local CA, on a real socket.

What it pins: an https URL is spoken over TLS (never in the clear), with the host's name sent
and checked, ALPN offering http/1.1 (a server that wants to know gets it), and a body framed by
the connection's end read to that end even when the server drops TCP without TLS's
close_notify (``https_compatible``: what browsers and httpx accept, and many servers do).
"""

from __future__ import annotations

import datetime
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from trio_gateway.core.errors import UpstreamProtocolError, UpstreamUnreachable
from trio_gateway.http1.client import H1Pool


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_ca_and_server(directory: Path) -> tuple[Path, ssl.SSLContext]:
    """A CA (its certificate written to ``directory``) and a server context for localhost."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("test CA"))
        .issuer_name(_name("test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.OID_SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_path = directory / "ca.pem"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    chain = directory / "server.pem"
    chain.write_bytes(
        leaf.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(chain)
    server.set_alpn_protocols(["http/1.1"])
    return ca_path, server


@asynccontextmanager
async def tls_server(context: ssl.SSLContext, alpn: list[str | None]) -> AsyncIterator[str]:
    """Answers ``hello`` framed by the connection's end, then drops TCP without close_notify;
    ``alpn`` collects what each handshake selected."""

    async def serve(stream: trio.SSLStream[trio.SocketStream]) -> None:
        try:
            await stream.do_handshake()
            alpn.append(stream.selected_alpn_protocol())
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive_some(65536)
            await stream.send_all(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nhello")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # a client speaking in the clear, or one that refused the certificate
        finally:
            await trio.aclose_forcefully(stream.transport_stream)  # TCP only: a ragged end

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_ssl_over_tcp, serve, 0, context, host="127.0.0.1")
        )
        port = listeners[0].transport_listener.socket.getsockname()[1]
        yield f"https://localhost:{port}/v1/chat/completions"
        nursery.cancel_scope.cancel()


def pool() -> H1Pool:
    return H1Pool("up", max_idle=4, idle_expiry_s=60, connect_timeout_s=5, write_timeout_s=5)


async def test_an_https_url_is_spoken_over_tls_with_alpn_and_read_to_its_ragged_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca_path, context = make_ca_and_server(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_path))  # httpx's trust store honours it
    alpn: list[str | None] = []
    async with tls_server(context, alpn) as url:
        response = await pool().post(url, {}, b"{}")
        assert response.status_code == 200
        assert await response.read_limited(100) == b"hello"
        assert response.ended
        await response.aclose()
    assert alpn == ["http/1.1"]


async def test_a_certificate_for_another_name_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca_path, context = make_ca_and_server(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_path))
    async with tls_server(context, []) as url:
        # The certificate names localhost; the same server reached by its address is not it.
        other = url.replace("localhost", "127.0.0.1")
        with pytest.raises((UpstreamUnreachable, UpstreamProtocolError), match="certificate"):
            await pool().post(other, {}, b"{}")


async def test_an_untrusted_certificate_is_refused(tmp_path: Path) -> None:
    _, context = make_ca_and_server(tmp_path)
    async with tls_server(context, []) as url:
        with pytest.raises(UpstreamUnreachable, match=r"up: cannot connect .*certificate"):
            await pool().post(url, {}, b"{}")
