"""deploy/nginx/trio-gateway.conf in a real nginx in front of a real gateway: nginx accepts the
file as shipped, its body limit is the gateway's, SSE arrives unbuffered and byte for byte, the
WebSocket works, request ids, trace context and session ids pass, and a client that stops
reading is dropped with its upstream (the point of proxy_buffering off)."""

from __future__ import annotations

import json
import re
import socket
import time
from typing import Any

import attrs
import httpx
import trio
import trio_websocket

from tests.e2e.deploy_files import NGINX_CONF
from tests.e2e.deploy_fleet import fleet
from tests.e2e.harness import (
    FAST_SIM,
    chat,
    gateway_config,
    provider_toml,
    running_gateway,
    running_sim,
    script,
    wait_until,
)
from tests.e2e.nginx import main_conf, nginx_prefix, nginx_test, running_nginx
from trio_gateway.capacity.replica_policy import Affinity, ReplicaView, session_key
from trio_gateway.config.schema import ServerConfig
from trio_gateway.core.events_codec import TERMINAL_TYPES
from trio_gateway.sim.server import SimHandle

TIMEOUT_S = 20


def test_nginx_accepts_the_shipped_file_as_it_is() -> None:
    with nginx_prefix() as prefix:
        conf = prefix / "nginx.conf"
        conf.write_text(main_conf(prefix, NGINX_CONF))
        nginx_test(conf, prefix)


def test_nginx_body_limit_is_the_gateways() -> None:
    found = re.findall(r"^\s*client_max_body_size (\d+)([km]?);", NGINX_CONF.read_text(), re.M)
    assert len(found) == 1
    number, unit = found[0]
    scale = {"": 1, "k": 1024, "m": 1024 * 1024}[unit]
    assert int(number) * scale == ServerConfig().max_body_bytes


# A slow engine: a stream lasts long enough (~1.3 s) to tell its first chunk from its end.
SLOW_SIM = attrs.evolve(FAST_SIM, decode_step_s=0.03)
STREAM_WORDS = 40


def normalised(body: str) -> str:
    """A stream with what differs between two runs of the same answer blanked: the
    response id and its timestamp."""
    body = re.sub(r'"id":\s*"[^"]*"', '"id": "-"', body)
    return re.sub(r'"created":\s*\d+', '"created": 0', body)


async def timed_stream(
    client: httpx.AsyncClient, url: str, body: dict[str, Any]
) -> tuple[float, float, str]:
    """(seconds to the first `data:` line, seconds to the end, the body)."""
    started = time.monotonic()
    first: float | None = None
    received = bytearray()
    async with client.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for chunk in response.aiter_bytes():
            if first is None and b"data: {" in received + chunk:
                first = time.monotonic() - started
            received += chunk
    assert first is not None
    return first, time.monotonic() - started, received.decode()


def replica_of(key: str, a: SimHandle, b: SimHandle) -> SimHandle:
    """The replica `affinity` sends ``key`` to when both are idle (the policy is pure)."""
    names = {s.base_url.removeprefix("http://"): s for s in (a, b)}
    views = [ReplicaView(name=n, in_flight=0, capacity=4) for n in names]
    return names[Affinity().order(views, key)[0]]


async def test_nginx_in_front_of_a_gateway_streams_sse_websocket_and_ids() -> None:
    words = " ".join(f"w{i}" for i in range(STREAM_WORDS))
    body = chat(script({"text": words}), stream=True)
    with trio.fail_after(TIMEOUT_S):
        async with fleet(SLOW_SIM, probe=False) as (gateway, a, b):
            upstream = gateway.base_url.removeprefix("http://")
            async with running_nginx(upstream) as proxy, httpx.AsyncClient(timeout=10) as client:
                # (a) SSE through nginx arrives as it is generated, not when it is complete.
                first_s, total_s, via_nginx = await timed_stream(
                    client, proxy + "/v1/chat/completions", body
                )
                assert total_s > 0.5, "the stream was too fast to tell buffering apart"
                assert first_s < 0.25 * total_s, (first_s, total_s)
                # ... and byte for byte what the gateway sends directly.
                _, _, direct = await timed_stream(
                    client, gateway.base_url + "/v1/chat/completions", body
                )
                assert normalised(via_nginx) == normalised(direct)
                assert via_nginx.rstrip().endswith("data: [DONE]")

                # (c) The client's X-Request-Id comes back, and reaches vLLM with the trace.
                trace = "4bf92f3577b34da6a3ce929d0e0e4736"
                response = await client.post(
                    proxy + "/v1/chat/completions",
                    json=chat(script({"text": "ok"})),
                    headers={
                        "X-Request-Id": "deploy-test-42",
                        "traceparent": f"00-{trace}-00f067aa0ba902b7-01",
                    },
                )
                assert response.status_code == 200, response.text
                assert response.headers["x-request-id"] == "deploy-test-42"
                sent = [
                    h
                    for sim in (a, b)
                    for h in sim.engine.stats().last_request_headers
                    if h.get("x-request-id") == "deploy-test-42"
                ]
                assert len(sent) == 1
                assert sent[0]["traceparent"].split("-")[1] == trace
                # Without one, nginx's own $request_id (32 hex digits) is the gateway's id.
                response = await client.post(
                    proxy + "/v1/chat/completions", json=chat(script({"text": "ok"}))
                )
                assert re.fullmatch(r"[0-9a-f]{32}", response.headers["x-request-id"])

                # X-Session-Id reaches the affinity policy: requests whose own opening would
                # go to one replica follow their session to the other.
                session = "deploy-session-1"
                target = replica_of(session_key(session, {}), a, b)
                bodies = [
                    candidate
                    for candidate in (
                        chat(f"question {i}" + script({"text": "ok"})) for i in range(40)
                    )
                    if replica_of(session_key(None, candidate), a, b) is not target
                ][:3]
                assert len(bodies) == 3
                before = target.engine.stats().finished
                for session_body in bodies:
                    response = await client.post(
                        proxy + "/v1/chat/completions",
                        json=session_body,
                        headers={"X-Session-Id": session},
                    )
                    assert response.status_code == 200
                assert target.engine.stats().finished - before == 3

                # (b) The WebSocket through nginx: a request, its streamed events, its end.
                events: list[dict[str, Any]] = []
                ws_url = proxy.replace("http://", "ws://") + "/v1/ws"
                async with trio_websocket.open_websocket_url(ws_url) as ws:
                    await ws.send_message(
                        json.dumps(
                            {"type": "request", "id": "r1", "body": chat(script({"text": "a b c"}))}
                        )
                    )
                    while not events or events[-1].get("type") not in TERMINAL_TYPES:
                        events.append(json.loads(await ws.get_message()))
                assert events[-1]["type"] == "response.done", events[-1]
                text = "".join(e["text"] for e in events if e["type"] == "text.delta")
                assert text == "a b c"


# An engine fast enough to fill every buffer between the gateway and a client that reads
# nothing (the kernel's socket buffers on loopback grow to megabytes) in a few seconds.
FLOOD_SIM = attrs.evolve(
    FAST_SIM, max_model_len=65536, decode_step_s=0.00005, decode_step_s_per_seq=0.0
)
FLOOD_TOKENS = 40000


async def test_a_client_that_stops_reading_behind_nginx_is_dropped_with_its_upstream() -> None:
    """What proxy_buffering off is for: nginx passes the gateway's backpressure on, so the
    gateway sees a stalled client, drops it after client_stall_timeout_s and closes the
    upstream. With buffering, nginx would read the whole answer into its temp files whatever
    the client does, and vLLM would generate all of it for nobody."""
    async with running_sim(FLOOD_SIM) as sim:
        config = gateway_config(
            provider_toml("sim-a", sim.base_url), server="client_stall_timeout_s = 1.0"
        )
        async with running_gateway(config) as gateway:
            upstream = gateway.base_url.removeprefix("http://")
            async with running_nginx(upstream) as proxy:
                host, _, port = proxy.removeprefix("http://").partition(":")
                sock = trio.socket.socket()
                # A client with a small window, which then reads nothing at all.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                await sock.connect((host, int(port)))
                body = json.dumps(
                    chat(
                        script({"text_tokens": FLOOD_TOKENS}),
                        stream=True,
                        max_tokens=FLOOD_TOKENS,
                    )
                ).encode()
                head = (
                    "POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                )
                async with trio.SocketStream(sock) as stalled:
                    await stalled.send_all(head.encode() + body)
                    registry = gateway.router.metrics.registry
                    await wait_until(
                        lambda: bool(
                            registry.get_sample_value(
                                "gateway_cancellations_total", {"cause": "client_stall"}
                            )
                        ),
                        timeout_s=TIMEOUT_S,
                    )
                    await wait_until(lambda: "abort" in sim.engine.stats().finished_by_reason)
                    assert sim.engine.stats().tokens_generated < FLOOD_TOKENS
