"""A real nginx (Debian's, installed by the Makefile) running deploy/nginx/trio-gateway.conf in
front of an upstream, as any user, on a free port: for the tests of that file and of the
HTTP/1.x edge behind it."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import trio

from tests.e2e.deploy_files import NGINX_CONF

NGINX = Path("/usr/sbin/nginx")
# The two lines of trio-gateway.conf a site edits, and the test rewrites.
UPSTREAM_SERVER = re.compile(r"(upstream trio_gateway \{\s*server )127\.0\.0\.1:8080;")
LISTEN = re.compile(r"^(\s*)listen 80;$", flags=re.MULTILINE)


def site_conf(upstream: str, port: int) -> str:
    text = NGINX_CONF.read_text()
    text, upstreams = UPSTREAM_SERVER.subn(rf"\g<1>{upstream};", text)
    text, listens = LISTEN.subn(rf"\g<1>listen 127.0.0.1:{port};", text)
    assert (upstreams, listens) == (1, 1), "trio-gateway.conf's upstream or listen line changed"
    return text


def main_conf(prefix: Path, site: Path) -> str:
    """A whole nginx.conf around the site file, every path in ``prefix`` (runs as any user)."""
    return f"""
daemon off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {prefix}/access.log;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    include {site};
}}
"""


@contextmanager
def nginx_prefix() -> Iterator[Path]:
    """A directory for nginx's config, logs and temp files. Not pytest's tmp_path: when the
    tests run as root, nginx's workers run as `nobody` and must be able to reach it."""
    prefix = Path(tempfile.mkdtemp(prefix="trio-gateway-nginx-"))
    prefix.chmod(0o755)
    try:
        yield prefix
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


def nginx_test(conf: Path, prefix: Path) -> None:
    assert NGINX.exists(), f"{NGINX} missing: `make test` installs Debian's nginx"
    result = subprocess.run(
        [str(NGINX), "-t", "-p", str(prefix), "-c", str(conf)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nginx_logs(prefix: Path) -> str:
    logs = (prefix / name for name in ("stderr.log", "error.log"))
    return "\n".join(log.read_text(errors="replace") for log in logs if log.exists())


@asynccontextmanager
async def running_nginx(upstream: str) -> AsyncIterator[str]:
    """nginx with deploy/nginx/trio-gateway.conf in front of ``upstream``; yields its URL."""
    with nginx_prefix() as prefix:
        port = free_port()
        site = prefix / "trio-gateway.conf"
        site.write_text(site_conf(upstream, port))
        conf = prefix / "nginx.conf"
        conf.write_text(main_conf(prefix, site))
        nginx_test(conf, prefix)
        with (prefix / "stderr.log").open("wb") as stderr:
            process = await trio.lowlevel.open_process(
                [str(NGINX), "-p", str(prefix), "-c", str(conf)], stderr=stderr
            )
        try:
            with trio.fail_after(10):
                while True:
                    assert process.poll() is None, nginx_logs(prefix)
                    try:
                        stream = await trio.open_tcp_stream("127.0.0.1", port)
                    except OSError:
                        await trio.sleep(0.02)
                        continue
                    await stream.aclose()
                    break
            yield f"http://127.0.0.1:{port}"
        finally:
            # Our own nginx only, by its pid: SIGTERM is its fast shutdown.
            process.terminate()
            with trio.move_on_after(5):
                await process.wait()
            if process.poll() is None:
                process.kill()
                await process.wait()
