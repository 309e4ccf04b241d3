"""The egress proxy decision (http1/proxy.py): a table of environments and URLs."""

from __future__ import annotations

import pytest

from trio_gateway.http1.proxy import Proxy, parse_proxy_url, proxy_for

P = Proxy("proxy.corp", 3128)
BASIC = "Basic " + "dXNlcjpwQHNz"  # user:p@ss

CASES: list[tuple[str, dict[str, str], Proxy | None]] = [
    # The scheme picks the variable; none set: direct.
    ("https://api.openai.com/v1", {}, None),
    ("https://api.openai.com/v1", {"HTTPS_PROXY": "http://proxy.corp:3128"}, P),
    ("https://api.openai.com/v1", {"https_proxy": "proxy.corp:3128"}, P),
    ("https://api.openai.com/v1", {"HTTP_PROXY": "http://proxy.corp:3128"}, None),
    ("http://vllm:8000/v1", {"HTTP_PROXY": "http://proxy.corp:3128"}, P),
    ("http://vllm:8000/v1", {"HTTPS_PROXY": "http://proxy.corp:3128"}, None),
    ("http://vllm:8000/v1", {"ALL_PROXY": "http://proxy.corp:3128"}, P),
    ("https://x.example", {"all_proxy": "http://other:1", "HTTPS_PROXY": "proxy.corp:3128"}, P),
    # The lower case wins over the upper case (curl's rule).
    (
        "https://x.example",
        {"https_proxy": "http://proxy.corp:3128", "HTTPS_PROXY": "http://other:1"},
        P,
    ),
    # No port: 80, as curl and httpx take it.
    ("https://x.example", {"HTTPS_PROXY": "http://proxy.corp"}, Proxy("proxy.corp", 80)),
    # Credentials become Proxy-Authorization: basic.
    (
        "https://x.example",
        {"HTTPS_PROXY": "http://user:p%40ss@proxy.corp:3128"},
        Proxy("proxy.corp", 3128, BASIC),
    ),
    # NO_PROXY: hosts, domains with and without a leading dot, *, ports, addresses, CIDRs.
    ("https://x.example", {"HTTPS_PROXY": "proxy.corp:3128", "NO_PROXY": "*"}, None),
    ("https://x.example", {"HTTPS_PROXY": "proxy.corp:3128", "no_proxy": "x.example"}, None),
    ("https://a.x.example", {"HTTPS_PROXY": "proxy.corp:3128", "NO_PROXY": "x.example"}, None),
    ("https://a.x.example", {"HTTPS_PROXY": "proxy.corp:3128", "NO_PROXY": ".x.example"}, None),
    ("https://x.example", {"HTTPS_PROXY": "proxy.corp:3128", "NO_PROXY": ".x.example"}, None),
    ("https://ax.example", {"HTTPS_PROXY": "proxy.corp:3128", "NO_PROXY": "x.example"}, P),
    ("https://X.Example.", {"HTTPS_PROXY": "proxy.corp:3128", "NO_PROXY": "x.example"}, None),
    (
        "https://x.example",
        {"HTTPS_PROXY": "proxy.corp:3128", "NO_PROXY": "a.b, x.example:443"},
        None,
    ),
    ("https://x.example:8443", {"HTTPS_PROXY": "proxy.corp:3128", "NO_PROXY": "x.example:443"}, P),
    ("http://10.1.2.3:8000", {"HTTP_PROXY": "proxy.corp:3128", "NO_PROXY": "10.0.0.0/8"}, None),
    ("http://11.1.2.3:8000", {"HTTP_PROXY": "proxy.corp:3128", "NO_PROXY": "10.0.0.0/8"}, P),
    ("http://127.0.0.1:8000", {"HTTP_PROXY": "proxy.corp:3128", "NO_PROXY": "127.0.0.1"}, None),
    ("http://[::1]:8000", {"HTTP_PROXY": "proxy.corp:3128", "NO_PROXY": "::1"}, None),
    ("http://[::1]:8000", {"HTTP_PROXY": "proxy.corp:3128", "NO_PROXY": "[::1]:8000"}, None),
    ("http://[fd00::5]:80", {"HTTP_PROXY": "proxy.corp:3128", "NO_PROXY": "fd00::/8"}, None),
    # A variable of the other case does not bypass less: either case of NO_PROXY counts.
    ("https://x.example", {"HTTPS_PROXY": "proxy.corp:3128", "NO_PROXY": "y.example"}, P),
]


@pytest.mark.parametrize(("url", "environ", "expected"), CASES)
def test_proxy_for(url: str, environ: dict[str, str], expected: Proxy | None) -> None:
    assert proxy_for(url, environ) == expected


@pytest.mark.parametrize("bad", ["https://proxy.corp:3128", "socks5://proxy.corp", "http://:3"])
def test_a_proxy_that_cannot_be_spoken_is_an_error_not_a_direct_connection(bad: str) -> None:
    with pytest.raises(ValueError, match="proxy"):
        proxy_for("https://x.example", {"HTTPS_PROXY": bad})


def test_the_display_never_shows_the_credentials() -> None:
    proxy = parse_proxy_url("http://user:secret@proxy.corp:3128")
    assert "secret" not in proxy.display() and "secret" not in repr(proxy)
