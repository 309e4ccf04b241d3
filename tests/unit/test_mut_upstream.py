"""The provider I/O shell (``providers/upstream.py``) against in-memory upstreams.

Written for mutation testing (docs/testing.md): the end-to-end tests reach the streamed path
through a real simulator, but not ``/load``, the probe's request, a whole (non-streamed)
answer, or the exact messages of the shell's own errors. These drive each one in-process.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import httpx
import pytest
import trio

from tests.h1_mock import handler_connect
from tests.unit.test_mut_h1_client import HEAD, Scripted, chunk
from trio_gateway.capacity.gate import LocalGate
from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.errors import GatewayError, UpstreamProtocolError, UpstreamTimeout
from trio_gateway.core.events import Event, ResponseDone, ResponseStarted, TextDelta, Usage
from trio_gateway.core.request import ChatRequest
from trio_gateway.core.usage import UsageMeter
from trio_gateway.http1.client import Origin
from trio_gateway.ops.access import RequestContext, request_context
from trio_gateway.ops.tracing import new_trace
from trio_gateway.providers import upstream as upstream_module
from trio_gateway.providers.upstream import Upstream

Handler = Callable[[httpx.Request], Coroutine[None, None, httpx.Response]]


def provider(**overrides: Any) -> ProviderConfig:
    fields: dict[str, Any] = {
        "name": "p1",
        "type": "openai_compatible",
        "model": "m",
        "base_url": "http://upstream.test/v1",
        "max_inflight": 3,
        "connect_timeout_s": 0.5,
        "first_token_timeout_s": 0.5,
        "idle_timeout_s": 0.5,
    }
    fields.update(overrides)
    return ProviderConfig(**fields)


def shell(handler: Handler, credential: Any = None, **overrides: Any) -> Upstream:
    # /load goes through httpx; the chat exchange through the HTTP/1.1 client, served by the
    # same handler in memory (tests/h1_mock.py).
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return Upstream(provider(**overrides), credential, client, connect=handler_connect(handler))


def chat() -> ChatRequest:
    return ChatRequest(
        alias="a",
        body={"messages": [{"role": "user", "content": "hi"}]},
        stream=True,
        include_usage=True,
        reasoning=False,
        required=frozenset(),
    )


async def collect(upstream: Upstream, meter: UsageMeter | None = None) -> list[Event]:
    events: list[Event] = []

    async def emit(batch: list[Event]) -> None:
        assert batch  # a batch is never empty
        events.extend(batch)

    await upstream.stream_chat(chat(), emit, meter)
    return events


COMPLETION = {
    "choices": [{"message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1},
}


def sse(*payloads: Any) -> bytes:
    out = b""
    for payload in payloads:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        out += f"data: {data}\n\n".encode()
    return out


# --- /load ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, b'{"server_load": 4}', 4),
        (200, b'{"server_load": 0}', 0),
        (200, b'{"server_load": "4"}', None),
        (200, b'{"server_load": 4.0}', None),
        (200, b'{"server_load": true}', None),
        (200, b"{}", None),
        (200, b"[1]", None),
        (200, b"not json", None),
        (404, b'{"server_load": 4}', None),
        (500, b"", None),
    ],
)
async def test_read_load_reads_server_load_from_the_root(
    status: int, body: bytes, expected: int | None
) -> None:
    seen: list[httpx.Request] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, content=body)

    assert await shell(handler).read_load() == expected
    assert [(r.method, str(r.url)) for r in seen] == [("GET", "http://upstream.test/load")]


async def test_read_load_of_a_base_url_without_v1_keeps_the_path() -> None:
    seen: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, json={"server_load": 1})

    assert await shell(handler, base_url="http://upstream.test/x/").read_load() == 1
    assert seen == ["http://upstream.test/x/load"]


async def test_read_load_is_none_for_a_cloud_vendor_without_asking() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("no request expected")

    assert await shell(handler, type="openai", base_url=None).read_load() is None


async def test_read_load_is_none_when_the_server_is_unreachable_or_slow() -> None:
    async def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async def slow(request: httpx.Request) -> httpx.Response:
        await trio.sleep(10)
        raise AssertionError("not reached")

    assert await shell(refused).read_load() is None
    with trio.fail_after(2):
        assert await shell(slow, connect_timeout_s=0.05).read_load() is None


# --- the probe --------------------------------------------------------------------------------


async def test_the_probe_is_one_token_of_ping_and_ignores_the_answer() -> None:
    bodies: list[dict[str, Any]] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json=COMPLETION)

    await shell(handler).probe()
    [body] = bodies
    assert body["messages"] == [{"role": "user", "content": "ping"}]
    assert body["max_tokens"] == 1
    assert body["model"] == "m"


async def test_a_probe_that_is_refused_raises() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"error": {"message": "down"}})

    with pytest.raises(GatewayError):
        await shell(handler).probe()


def test_statistics_and_the_client_limits() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError

    upstream = shell(handler)
    stats = upstream.statistics()
    assert (stats.in_flight, stats.waiting, stats.max_inflight) == (0, 0, 3)
    client = Upstream.make_client(provider(max_inflight=5, connect_timeout_s=2.5))
    pool = client._transport._direct._pool  # type: ignore[attr-defined]
    assert pool._max_connections == 5 + upstream_module.POOL_HEADROOM
    assert pool._max_keepalive_connections == 5
    assert client.timeout == httpx.Timeout(connect=2.5, pool=2.5, write=2.5, read=None)
    assert client._trust_env is False


# --- a whole answer ---------------------------------------------------------------------------


async def test_a_whole_json_answer_becomes_the_stream_it_stands_for() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=COMPLETION)

    events = await collect(shell(handler))
    assert ResponseStarted("p1") in events
    assert TextDelta("hello") in events
    assert Usage(prompt_tokens=3, completion_tokens=1) in events
    assert events[-1] == ResponseDone("stop")


async def test_a_whole_answer_over_the_bound_is_a_protocol_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    body = json.dumps(COMPLETION).encode()
    monkeypatch.setattr(upstream_module, "MAX_WHOLE_BODY_BYTES", len(body) - 1)

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "application/json"})

    with pytest.raises(UpstreamProtocolError) as caught:
        await collect(shell(handler))
    assert caught.value.message == f"p1: a whole answer larger than {len(body) - 1} bytes"
    assert caught.value.provider == "p1"


async def test_a_whole_answer_of_exactly_the_bound_is_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    body = json.dumps(COMPLETION).encode()
    monkeypatch.setattr(upstream_module, "MAX_WHOLE_BODY_BYTES", len(body))

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "application/json"})

    assert (await collect(shell(handler)))[-1] == ResponseDone("stop")


class SlowBody(httpx.AsyncByteStream):
    def __init__(self, first: bytes, delay_s: float, rest: bytes = b"") -> None:
        self.first, self.delay_s, self.rest = first, delay_s, rest

    async def __aiter__(self) -> Any:
        if self.first:
            yield self.first
        await trio.sleep(self.delay_s)
        yield self.rest


async def test_a_whole_answer_that_does_not_arrive_in_time_is_a_timeout() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, stream=SlowBody(b"", 5), headers={"content-type": "application/json"}
        )

    with trio.fail_after(3), pytest.raises(UpstreamTimeout) as caught:
        await collect(shell(handler, first_token_timeout_s=0.05))
    assert caught.value.message == "p1: no whole answer within 0.05 s"
    assert caught.value.provider == "p1"


# --- the streamed path's own errors -----------------------------------------------------------


async def test_no_first_token_and_no_data_are_timeouts_with_their_own_message() -> None:
    async def silent(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, stream=SlowBody(b": hello\n\n", 5), headers={"content-type": "text/event-stream"}
        )

    with trio.fail_after(3), pytest.raises(UpstreamTimeout) as caught:
        await collect(shell(silent, first_token_timeout_s=0.05))
    assert caught.value.message == "p1: no first token within 0.05 s"

    started = sse({"choices": [{"delta": {"content": "a"}, "finish_reason": None}]})

    async def stalls(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, stream=SlowBody(started, 5), headers={"content-type": "text/event-stream"}
        )

    with trio.fail_after(3), pytest.raises(UpstreamTimeout) as caught:
        await collect(shell(stalls, idle_timeout_s=0.05, first_token_timeout_s=2))
    assert caught.value.message == "p1: no data for 0.05 s"
    assert caught.value.provider == "p1"


async def test_no_response_in_time_is_a_timeout() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        await trio.sleep(5)
        raise AssertionError

    with trio.fail_after(3), pytest.raises(UpstreamTimeout) as caught:
        await collect(shell(handler, first_token_timeout_s=0.05))
    assert caught.value.message == "p1: no response within 0.05 s"
    assert caught.value.provider == "p1"


class SlowCredential:
    async def token(self) -> str:
        await trio.sleep(5)
        return "never"


class Secret:
    async def token(self) -> str:
        return "sk-secret-123"


async def test_no_credential_in_time_is_a_timeout() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError

    with trio.fail_after(3), pytest.raises(UpstreamTimeout) as caught:
        await collect(shell(handler, SlowCredential(), first_token_timeout_s=0.05))
    assert caught.value.message == "p1: no credential within 0.05 s"
    assert caught.value.provider == "p1"


async def test_the_credential_is_sent_and_scrubbed_from_an_echoed_error() -> None:
    seen: list[str | None] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(
            401, json={"error": {"message": "Incorrect API key provided: sk-secret-123"}}
        )

    with pytest.raises(GatewayError) as caught:
        await collect(shell(handler, Secret()))
    assert seen == ["Bearer sk-secret-123"]
    assert "sk-secret-123" not in caught.value.message
    assert caught.value.args == (caught.value.message,)
    assert "Incorrect API key provided" in caught.value.message


async def test_an_error_body_is_read_and_classified() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            429, json={"error": {"message": "slow down"}}, headers={"retry-after": "7"}
        )

    with pytest.raises(GatewayError) as caught:
        await collect(shell(handler))
    assert "slow down" in caught.value.message
    assert caught.value.retry_after_s == 7


async def test_a_broken_sse_stream_is_a_protocol_error() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, content=b"data: " + b"x" * (2 * 1024 * 1024), headers={"content-type": "x"}
        )

    with pytest.raises(UpstreamProtocolError) as caught:
        await collect(shell(handler))
    assert caught.value.message.startswith("p1: ")
    assert caught.value.provider == "p1"


async def test_a_stream_without_a_trailing_blank_line_is_still_read() -> None:
    body = sse({"choices": [{"delta": {"content": "a"}, "finish_reason": "stop"}]})
    body += b'data: {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}'

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    meter = UsageMeter()
    events = await collect(shell(handler), meter)
    assert TextDelta("a") in events
    assert Usage(prompt_tokens=1, completion_tokens=1) in events
    assert events[-1] == ResponseDone("stop")


async def test_a_cut_stream_leaves_its_usage_so_far_in_the_meter() -> None:
    body = sse(
        {"choices": [{"delta": {"content": "a"}, "finish_reason": None}]},
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}},
    )

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    meter = UsageMeter()
    with pytest.raises(UpstreamProtocolError):
        await collect(shell(handler), meter)
    assert meter.partial is not None


async def test_after_done_the_rest_of_the_body_is_not_emitted() -> None:
    body = sse({"choices": [{"delta": {"content": "a"}, "finish_reason": "stop"}]}, "[DONE]") + sse(
        {"choices": [{"delta": {"content": "late"}, "finish_reason": None}]}
    )

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    events = await collect(shell(handler))
    assert TextDelta("late") not in events
    assert events[-1] == ResponseDone("stop")


async def test_an_event_cut_by_the_end_of_the_stream_over_the_bound_is_a_protocol_error() -> None:
    # Each line is under the line bound; together, the last event (never ended by a blank
    # line) is over the event bound: found when the body ends, and named like any other.
    line = b"data: " + b"x" * (600 * 1024)
    body = line + b"\n" + line

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    with pytest.raises(UpstreamProtocolError) as caught:
        await collect(shell(handler))
    assert caught.value.message == "p1: an SSE event exceeded 1048576 bytes"
    assert caught.value.provider == "p1"


def tool_call(index: int, name: str) -> dict[str, Any]:
    call = {"index": index, "id": f"c{index}", "type": "function"}
    call["function"] = {"name": name, "arguments": "{}"}
    return {"choices": [{"delta": {"tool_calls": [call]}, "finish_reason": None}]}


async def test_each_answer_ended_at_its_first_tool_call_is_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    body = sse(
        tool_call(0, "f"),
        tool_call(1, "g"),
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
    )

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    async def ignore(events: list[Event]) -> None:
        pass

    upstream = shell(handler)
    request = chat()
    request = ChatRequest(
        alias=request.alias,
        body={**request.body, "parallel_tool_calls": False},
        stream=True,
        include_usage=True,
        reasoning=False,
        required=frozenset(),
    )
    caplog.set_level(logging.DEBUG, logger="trio_gateway")
    for _ in range(2):
        await upstream.stream_chat(request, ignore)
    assert upstream.tool_call_early_stops == 2
    message = "p1: answer ended at its first tool call (parallel_tool_calls: false)"
    assert caplog.messages.count(message) == 2


async def test_every_body_piece_of_a_read_is_decoded_and_a_framing_only_read_is_not_the_end() -> (
    None
):
    # Read by read: two chunks in one read (two body pieces), then a read holding only the
    # next chunk's size line (no body bytes, the body not ended), then the rest.
    first = sse({"choices": [{"delta": {"content": "a"}, "finish_reason": None}]})
    second = sse({"choices": [{"delta": {"content": "b"}, "finish_reason": None}]})
    last = sse({"choices": [{"delta": {"content": "c"}, "finish_reason": "stop"}]}, "[DONE]")
    reads: list[bytes | None] = [
        HEAD,
        chunk(first) + chunk(second),
        b"%x\r\n" % len(last),
        last + b"\r\n0\r\n\r\n",
    ]

    async def connect(origin: Origin) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        return Scripted(reads)

    client = httpx.AsyncClient()
    upstream = Upstream(provider(), None, client, connect=connect)
    events: list[Event] = []

    async def emit(batch: list[Event]) -> None:
        assert batch  # a batch is never empty
        events.extend(batch)

    await upstream.stream_chat(chat(), emit)
    await client.aclose()
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["a", "b", "c"]
    assert events[-1] == ResponseDone("stop")


async def test_an_error_whose_body_never_comes_is_classified_as_empty(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def never() -> Any:
        await trio.sleep_forever()
        yield b""

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, stream=never())

    with pytest.raises(GatewayError) as caught:
        await collect(shell(handler))
    assert "(empty body)" in caught.value.message


async def test_a_stream_without_a_content_type_is_read_as_events() -> None:
    body = sse({"choices": [{"delta": {"content": "a"}, "finish_reason": "stop"}]})

    async def handler(request: httpx.Request) -> httpx.Response:
        response = httpx.Response(200, content=body)
        assert "content-type" not in response.headers
        return response

    events = await collect(shell(handler))
    assert TextDelta("a") in events
    assert events[-1] == ResponseDone("stop")


async def test_an_event_without_data_does_not_hide_the_events_after_it() -> None:
    # One read: an event with an empty data line, then the answer.
    body = b"data:\n\n" + sse(
        {"choices": [{"delta": {"content": "a"}, "finish_reason": "stop"}]}, "[DONE]"
    )

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    events = await collect(shell(handler))
    assert TextDelta("a") in events
    assert events[-1] == ResponseDone("stop")


def test_the_shell_s_connections_follow_the_provider_s_config() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError

    upstream = shell(handler, max_inflight=6, connect_timeout_s=1.5)
    assert (upstream.name, upstream.active, upstream.tool_call_early_stops) == ("p1", 0, 0)
    assert upstream.gate.statistics().max_inflight == 6
    h1 = upstream._h1
    assert (h1.provider, h1.max_idle, h1.idle_expiry_s) == ("p1", 6, 2.0)
    assert (h1.connect_timeout_s, h1.write_timeout_s) == (1.5, 1.5)
    assert upstream_module.KEEPALIVE_EXPIRY_S == 2.0
    client = Upstream.make_client(provider(max_inflight=6))
    pool = client._transport._direct._pool  # type: ignore[attr-defined]
    assert pool._keepalive_expiry == upstream_module.KEEPALIVE_EXPIRY_S
    probe = upstream._probe_request
    # No reasoning switch: some models cannot stop reasoning, and would refuse every probe.
    assert (probe.alias, probe.stream, probe.include_usage, probe.reasoning) == (
        "(probe)",
        False,
        False,
        None,
    )
    assert probe.required == frozenset()
    assert probe.body == {"messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}


def test_a_gate_given_is_the_one_used() -> None:
    shared = LocalGate(9)
    upstream = Upstream(provider(), None, httpx.AsyncClient(), gate=shared)
    assert upstream.gate is shared and upstream.statistics().max_inflight == 9


async def test_each_attempt_carries_the_request_id_and_a_child_span_of_its_trace() -> None:
    seen: list[httpx.Request] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=COMPLETION)

    trace = new_trace()
    context = RequestContext(request_id="req-7", route="POST /v1/chat/completions", trace=trace)
    with request_context(context):
        await collect(shell(handler))
    [request] = seen
    assert request.headers["x-request-id"] == "req-7"
    traceparent = request.headers["traceparent"]
    assert traceparent.split("-")[1] == trace.trace_id  # the same trace, a span of its own
    assert traceparent != trace.traceparent()


async def test_the_response_being_read_can_be_aborted_from_the_context_and_only_then() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        body = sse({"choices": [{"delta": {"content": "a"}, "finish_reason": "stop"}]}, "[DONE]")
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    context = RequestContext(request_id="r", route="POST /v1/chat/completions", trace=new_trace())
    during: list[object] = []

    async def emit(batch: list[Event]) -> None:
        during.append(context.abort_upstream)

    with request_context(context):
        await shell(handler).stream_chat(chat(), emit)
    assert during and all(getattr(a, "__name__", None) == "abort" for a in during)
    assert context.abort_upstream is None  # the response is closed: nothing to abort
