"""Which egress proxy a request goes through, from the environment, as curl and httpx read it.

Pure: ``proxy_for(url, environ)`` decides, the shell (``client.py``) dials. The variables are
``HTTPS_PROXY`` for https URLs and ``HTTP_PROXY`` for http ones (``ALL_PROXY`` for both when
the own one is unset), each in lower case too, the lower case winning when both are set (curl's
rule: a CGI server may set ``HTTP_PROXY`` from a request's ``Proxy:`` header, never
``http_proxy``). ``NO_PROXY`` lists what goes direct: ``*`` (everything), a host name (itself
and its subdomains, with or without a leading dot), ``host:port`` (that port only), an IP
address, or a CIDR block (``10.0.0.0/8``, ``fd00::/8``).
"""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

import attrs


@attrs.frozen
class Proxy:
    """An HTTP proxy: where to dial, and the ``Proxy-Authorization`` its URL's user gives."""

    host: str
    port: int
    authorization: str | None = attrs.field(default=None, repr=False)

    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def display(self) -> str:
        """For logs and errors: never the credentials."""
        return f"http://{self.host}:{self.port}"


def _variable(environ: Mapping[str, str], name: str) -> str:
    return environ.get(name.lower()) or environ.get(name.upper()) or ""


def parse_proxy_url(text: str) -> Proxy:
    """``[http://][USER:PASSWORD@]HOST[:PORT]`` → a Proxy; ValueError for anything else (an
    https or socks proxy is not spoken)."""
    if "://" not in text:
        text = "http://" + text  # curl's and httpx's default scheme
    parts = urlsplit(text)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"expected an http:// proxy URL, not {text.split('@')[-1]!r}")
    try:
        port = parts.port or 80
    except ValueError as exc:
        raise ValueError(f"proxy port: {exc}") from None
    authorization = None
    if parts.username is not None:
        user_pass = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(user_pass.encode()).decode("ascii")
    return Proxy(parts.hostname, port, authorization)


def _no_proxy_matches(entry: str, host: str, port: int) -> bool:
    entry = entry.strip().lower()
    if not entry:
        return False
    if entry == "*":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None and "/" in entry:
        try:
            return address in ipaddress.ip_network(entry, strict=False)
        except ValueError:
            return False
    want_port = None
    bracketed = entry.startswith("[")
    if bracketed and "]" in entry:
        inside, _, rest = entry[1:].partition("]")
        entry, want_port = inside, rest.removeprefix(":") or None
    elif entry.count(":") == 1:  # host:port (an IPv6 address has more colons)
        entry, want_port = entry.split(":")
    if want_port is not None and (not want_port.isdigit() or int(want_port) != port):
        return False
    entry = entry.lstrip(".").removeprefix("*.")
    return host == entry or host.endswith("." + entry)


def bypasses(host: str, port: int, no_proxy: str) -> bool:
    """Whether ``NO_PROXY``'s value sends ``host:port`` direct."""
    host = host.strip("[]").lower().rstrip(".")
    return any(_no_proxy_matches(entry, host, port) for entry in no_proxy.split(","))


def proxy_for(url: str, environ: Mapping[str, str]) -> Proxy | None:
    """The proxy ``url`` goes through, or None for a direct connection. ValueError when the
    variable that applies holds no usable proxy URL (a typo must not mean "direct")."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        return None
    port = parts.port or (443 if scheme == "https" else 80)
    if bypasses(parts.hostname, port, _variable(environ, "no_proxy")):
        return None
    value = _variable(environ, f"{scheme}_proxy") or _variable(environ, "all_proxy")
    if not value:
        return None
    return parse_proxy_url(value)
