"""A provider's side requests (httpx: vLLM's ``/load`` and ``/metrics``, Vertex AI's token
exchange) leave the way its chat exchange does: through the proxy ``http1/proxy.py`` picks for
each URL (httpx's own ``trust_env`` reads the same variables, but with other rules for
``NO_PROXY`` and the variables' case), trusting the same context (``http1/tls.py``)."""

from __future__ import annotations

import ssl
from collections.abc import Mapping

import httpx

from trio_gateway.http1.proxy import Proxy, proxy_for


class EgressTransport(httpx.AsyncBaseTransport):
    """Direct, or through the proxy of the request's URL; one pool per way (at most three:
    direct, the http proxy, the https proxy)."""

    def __init__(
        self, *, tls: ssl.SSLContext, limits: httpx.Limits, environ: Mapping[str, str]
    ) -> None:
        self._tls = tls
        self._limits = limits
        self._environ = dict(environ)
        self._direct = httpx.AsyncHTTPTransport(verify=tls, limits=limits, trust_env=False)
        self._proxied: dict[Proxy, httpx.AsyncHTTPTransport] = {}

    def _transport(self, request: httpx.Request) -> httpx.AsyncHTTPTransport:
        try:
            proxy = proxy_for(str(request.url), self._environ)
        except ValueError as exc:
            raise httpx.ProxyError(str(exc), request=request) from None
        if proxy is None:
            return self._direct
        transport = self._proxied.get(proxy)
        if transport is None:
            headers = (
                {} if proxy.authorization is None else {"proxy-authorization": proxy.authorization}
            )
            transport = self._proxied[proxy] = httpx.AsyncHTTPTransport(
                verify=self._tls,
                limits=self._limits,
                trust_env=False,
                proxy=httpx.Proxy(proxy.display(), headers=headers),
            )
        return transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._transport(request).handle_async_request(request)

    async def aclose(self) -> None:
        await self._direct.aclose()
        for transport in self._proxied.values():
            await transport.aclose()
