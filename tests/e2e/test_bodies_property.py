"""No request body gets a 500 (issue 39, item 1): any JSON-ish body, to every route that reads
one and to the WebSocket's request message, is answered, and when it is refused, with a 4xx in
that front's own error shape, and a usage record that says ``refused``.

The bodies: a valid body of the route with one known field (or an item of one) replaced by
any JSON value or by text JSON readers disagree on (lone surrogates, integers past int's
digits, ``1e400``, NaN and Infinity, nesting past any bound), or with a key given twice; or
no object at all. The gateway runs in a thread of its own (``threaded.py``), so hypothesis
drives a synchronous client over real sockets, each example a request.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
import trio
import trio_websocket
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.threaded import ThreadedGateway, threaded_gateway
from trio_gateway.core.endpoints import COMPLETIONS_FIELDS, EMBEDDINGS_FIELDS
from trio_gateway.core.validation import FIELD_CHECKS
from trio_gateway.fronts.messages.request import TRANSLATED
from trio_gateway.fronts.responses.request import HANDLED

TIMEOUT_S = 20.0
# What routes through the gateway answers within: a valid body reaches the simulator.
MAX_TOKENS = 3


@attrs.frozen
class Raw:
    """JSON text put into a body as it is: what json.dumps will not write."""

    text: str


def dump(value: Any) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k) + ":" + dump(v) for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump(item) for item in value) + "]"
    # A str with a lone surrogate is written as its escape (ensure_ascii); NaN as NaN.
    return json.dumps(value)


USER_TEXT = [{"type": "text", "text": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CHAT = {
    "model": "agent-lite",
    "max_tokens": MAX_TOKENS,
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": USER_TEXT},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ],
    "tools": [TOOL],
    "tool_choice": "auto",
    "temperature": 0.5,
    "stop": ["zz"],
    "response_format": {"type": "text"},
}
MESSAGES = {
    "model": "agent-lite",
    "max_tokens": 2048,
    "system": [{"type": "text", "text": "be brief"}],
    "messages": [
        {"role": "user", "content": USER_TEXT},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": USER_TEXT}],
        },
    ],
    "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "auto"},
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "output_config": {"effort": "low"},
    "metadata": {"user_id": "u"},
    "stop_sequences": ["zz"],
    "temperature": 0.5,
}
COUNT = {key: value for key, value in MESSAGES.items() if key != "max_tokens"}
RESPONSES = {
    "model": "agent-lite",
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ],
    "instructions": "be brief",
    "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    "max_output_tokens": 16,
    "temperature": 0.5,
    "store": False,
    "metadata": {"a": "b"},
    "reasoning": {"effort": "low"},
    "text": {"format": {"type": "text"}},
}
COMPLETIONS = {"model": "agent-lite", "prompt": ["hi"], "max_tokens": MAX_TOKENS, "stop": ["zz"]}
EMBEDDINGS = {"model": "agent-lite", "input": ["hi"], "encoding_format": "float"}


@attrs.frozen
class Route:
    path: str
    body: dict[str, Any]
    # Fields the front reads besides those the body has.
    fields: frozenset[str]
    shape: str = "openai"  # or "anthropic", or "ws"
    metered: bool = True


ROUTES = {
    "chat": Route("/v1/chat/completions", CHAT, frozenset(FIELD_CHECKS)),
    "events": Route("/v1/events", CHAT, frozenset(FIELD_CHECKS)),
    "completions": Route("/v1/completions", COMPLETIONS, frozenset(COMPLETIONS_FIELDS)),
    "embeddings": Route("/v1/embeddings", EMBEDDINGS, frozenset(EMBEDDINGS_FIELDS)),
    "messages": Route("/v1/messages", MESSAGES, TRANSLATED, "anthropic"),
    "count_tokens": Route(
        "/v1/messages/count_tokens", COUNT, TRANSLATED, "anthropic", metered=False
    ),
    "responses": Route("/v1/responses", RESPONSES, HANDLED),
    "ws": Route("/v1/ws", CHAT, frozenset(FIELD_CHECKS), "ws"),
}


def paths(value: Any, trail: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    """Every key and item of a body, as paths from it."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        yield (*trail, key)
        if isinstance(item, dict | list):
            yield from paths(item, (*trail, key))


def route_paths(route: Route) -> list[tuple[str | int, ...]]:
    return sorted({*paths(route.body), *((field,) for field in route.fields)}, key=str)


PATHS = {route.path: route_paths(route) for route in ROUTES.values()}


def replaced(body: Any, path: tuple[str | int, ...], value: Any) -> Any:
    """A copy of ``body`` with the value at ``path`` replaced (a key added where it is not)."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(body, dict) and isinstance(key, str):
        return {**body, key: replaced(body.get(key), rest, value)}
    if isinstance(body, list) and isinstance(key, int) and key < len(body):
        return [replaced(item, rest, value) if i == key else item for i, item in enumerate(body)]
    return body


# Texts readers disagree on, or that no reader takes.
ODD_TEXTS = [
    '"\\ud800"',
    '"x\\udfff"',
    '"\\ud83d\\u0041"',
    '"\\ude00\\ud83d"',
    "9" * 5000,
    "-" + "9" * 4301,
    "1e400",
    "-1e999",
    "NaN",
    "Infinity",
    "-Infinity",
    "[" * 70 + "]" * 70,
    "[" * 3000 + "]" * 3000,
    '{"a":' * 70 + "1" + "}" * 70,
]
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, 1, -1, 2**63, 10**40])
    | st.floats()
    | st.text(st.characters(codec="utf-8") | st.sampled_from(["\ud800", "\udc00"]), max_size=6)
    | st.sampled_from(ODD_TEXTS).map(Raw)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["type", "text", "role", "content", "x"]), inner, max_size=3
        )
    ),
    max_leaves=5,
)


@st.composite
def bodies(draw: st.DrawFn, route: Route) -> str:
    """A body of ``route`` with one thing wrong (or right, by chance)."""
    kind = draw(st.sampled_from(["field", "field", "field", "twice", "whole"]))
    if kind == "whole":
        return dump(draw(VALUES))
    path = draw(st.sampled_from(PATHS[route.path]))
    value = draw(VALUES)
    if kind == "twice":
        # The key again, before the body's own (which wins) or after it (which loses).
        pair = json.dumps(str(path[0])) + ":" + dump(value)
        text = dump(route.body)
        if draw(st.booleans()):
            return "{" + pair + "," + text[1:]
        return text[:-1] + "," + pair + "}"
    return dump(replaced(route.body, path, value))


@pytest.fixture(scope="module")
def gateway() -> Iterator[ThreadedGateway]:
    with threaded_gateway() as running:
        yield running


def check_http(gateway: ThreadedGateway, route: Route, text: str) -> None:
    request_id = secrets.token_hex(12)
    response = gateway.http.post(
        route.path,
        content=text.encode("utf-8", "surrogatepass"),
        headers={"content-type": "application/json", "x-request-id": request_id},
    )
    assert response.status_code < 500, (text[:300], response.status_code, response.text[:300])
    if response.status_code < 400:
        return
    error = response.json()
    if route.shape == "anthropic":
        assert error["type"] == "error" and error["error"]["message"], error
        assert error["error"]["type"] != "api_error", error
    else:
        assert set(error["error"]) >= {"message", "type", "code", "param"}, error
        assert error["error"]["type"] != "server_error", error
    if route.metered:
        record = gateway.records.wait_for(request_id)
        assert record.error_code != "internal_error", (text[:300], record)
        if record.provider is None:
            assert record.outcome == "refused", (text[:300], record)
        # else the body was valid, and the provider refused it (the simulator serves no
        # embeddings): the gateway's answer is the provider's, recorded as its failure.


def check_ws(gateway: ThreadedGateway, text: str) -> None:
    """The message (a request whose body is ``text``): one terminal event for it, never an
    internal error; an error with a request id is a refused request, recorded so."""

    async def exchange() -> dict[str, Any]:
        url = gateway.base_url.replace("http://", "ws://") + "/v1/ws"
        with trio.fail_after(TIMEOUT_S):
            async with trio_websocket.open_websocket_url(url) as ws:
                message = '{"type": "request", "id": "r1", "body": ' + text + "}"
                await ws.send_message(message.encode("utf-8", "surrogatepass"))
                while True:
                    event: dict[str, Any] = json.loads(await ws.get_message())
                    if event["type"] in ("error", "response.done"):
                        return event

    event = trio.run(exchange)
    if event["type"] == "response.done":
        return
    assert event["code"] != "internal_error", (text[:300], event)
    assert event["id"] in ("r1", None)
    if event["request_id"] is not None:
        record = gateway.records.wait_for(event["request_id"])
        assert record.outcome == "refused", (text[:300], record)
    else:
        # Refused as a message (not JSON, say): no request ran, so none is recorded.
        assert event["code"] == "invalid_message", event


def check(gateway: ThreadedGateway, name: str, text: str) -> None:
    route = ROUTES[name]
    if route.shape == "ws":
        check_ws(gateway, text)
    else:
        check_http(gateway, route, text)


@pytest.mark.parametrize("name", list(ROUTES))
def test_each_route_takes_its_own_valid_body(gateway: ThreadedGateway, name: str) -> None:
    """The bases the property test damages are valid: each damage is one fault."""
    route = ROUTES[name]
    if name == "embeddings":
        pytest.skip("the simulator serves no embedding model")
    if route.shape == "ws":
        check_ws(gateway, dump(route.body))
        return
    response = gateway.http.post(route.path, json=route.body)
    assert response.status_code == 200, response.text


# The issue's reproductions, on every route: the 500s it found.
def first_text(body: dict[str, Any]) -> tuple[str | int, ...]:
    """The path of the body's first string that is the client's text."""
    for path in paths(body):
        value: Any = body
        for key in path:
            value = value[key]
        if path[-1] in ("text", "content", "input", "prompt") and isinstance(value, str):
            return path
        if isinstance(path[-1], int) and isinstance(value, str) and path[0] in ("input", "prompt"):
            return path
    raise AssertionError(f"no text in {body}")


@pytest.mark.parametrize("name", list(ROUTES))
@pytest.mark.parametrize(
    ("fault", "value"),
    [
        ("a lone surrogate", "\ud800"),
        ("an integer of 5,000 digits", Raw("9" * 5000)),
        ("1e400", Raw("1e400")),
    ],
)
def test_the_issues_bodies_are_refused_on_every_route(
    gateway: ThreadedGateway, name: str, fault: str, value: Any
) -> None:
    route = ROUTES[name]
    path = first_text(route.body) if fault == "a lone surrogate" else ("temperature",)
    check(gateway, name, dump(replaced(route.body, path, value)))


@pytest.mark.parametrize("name", ["messages", "count_tokens"])
@pytest.mark.parametrize("effort", [["high"], {"high": 1}])
def test_an_effort_that_is_no_string_is_refused(
    gateway: ThreadedGateway, name: str, effort: Any
) -> None:
    route = ROUTES[name]
    check(gateway, name, dump(replaced(route.body, ("output_config", "effort"), effort)))


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_body_gets_a_500_on_any_route(gateway: ThreadedGateway, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(list(ROUTES)), label="route")
    text = data.draw(bodies(ROUTES[name]), label="body")
    check(gateway, name, text)
