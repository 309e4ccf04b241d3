"""session_key (``replica_policy.py``): where a request's affinity key comes from (the session
header, then ``user``, then the prompt), and the prompt key: stable as a conversation grows,
made of what the model saw, never raising on any body, and pinned to the digest that
docs/routing.md documents (a changed key would move every conversation off its replica)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.replica_views import idle
from trio_gateway.capacity.replica_policy import Affinity, session_key

# --- session_key ---------------------------------------------------------------------------

SYSTEM = {"role": "system", "content": "You are terse."}
FIRST = {"role": "user", "content": "Plan a trip to Lyon."}
CHAT = {"messages": [SYSTEM, FIRST]}


@pytest.mark.parametrize(
    ("header", "body", "expected"),
    [
        ("abc", {"user": "alice", **CHAT}, "s:abc"),
        ("  abc\t", CHAT, "s:abc"),
        ("   ", {"user": "alice", **CHAT}, "u:alice"),
        ("", {"user": " alice ", **CHAT}, "u:alice"),
        (None, {"user": "alice", **CHAT}, "u:alice"),
    ],
)
def test_session_key_sources_in_order(
    header: str | None, body: dict[str, Any], expected: str
) -> None:
    assert session_key(header, body) == expected


@pytest.mark.parametrize("user", [None, "", "  ", 7, ["alice"], {"id": "alice"}])
def test_session_key_falls_back_to_the_prompt(user: object) -> None:
    key = session_key(" ", {"user": user, **CHAT})
    assert key.startswith("p:")
    assert key == session_key(None, CHAT)


def test_session_key_sources_never_collide() -> None:
    assert session_key("alice", {}) != session_key(None, {"user": "alice"})
    prompt = session_key(None, CHAT)
    assert session_key(prompt[2:], {}) != prompt


LATER_TURN = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["assistant", "tool", "user", "system"]),
        "content": st.none() | st.text("abc xyz", max_size=20),
    },
    optional={
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {
                    "id": st.text("0123", max_size=5),
                    "function": st.fixed_dictionaries({"name": st.text("fgh", max_size=3)}),
                }
            ),
            max_size=2,
        )
    },
)


@settings(max_examples=50)
@given(st.lists(LATER_TURN, max_size=6))
def test_the_prompt_key_stays_as_the_conversation_grows(later: list[dict[str, Any]]) -> None:
    grown = {"messages": [SYSTEM, FIRST, *later]}
    assert session_key(None, grown) == session_key(None, CHAT)


@pytest.mark.parametrize(
    "other",
    [
        [SYSTEM, {"role": "user", "content": "Plan a trip to Lille."}],
        [{"role": "system", "content": "You are verbose."}, FIRST],
        [FIRST],
        [SYSTEM, {"role": "user", "content": [{"type": "text", "text": "Plan a trip to Lyon!"}]}],
        [SYSTEM, {"role": "assistant", "content": "Plan a trip to Lyon."}],
        [
            SYSTEM,
            {"role": "user", "content": "Plan a trip"},
            {"role": "user", "content": " to Lyon."},
        ],
    ],
)
def test_the_prompt_key_follows_the_opening(other: list[dict[str, Any]]) -> None:
    assert session_key(None, {"messages": other}) != session_key(None, CHAT)


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def test_the_prompt_key_reduces_parts_and_tool_calls_to_what_the_model_saw() -> None:
    def opening(*parts: Any, call_id: str = "call_1", arguments: str = "{}") -> str:
        function = {"name": "f", "arguments": arguments}
        call = {"id": call_id, "type": "function", "function": function}
        msgs = [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "user", "content": list(parts)},
        ]
        return session_key(None, {"messages": msgs})

    text = {"type": "text", "text": "what is this?"}
    assert opening(text, image("https://x/a.png")) == opening(text, image("https://x/a.png"))
    assert opening(text, image("https://x/a.png")) != opening(text, image("https://x/b.png"))
    assert opening(text, call_id="call_1") == opening(text, call_id="call_9")
    assert opening(text, arguments='{"x": 1}') != opening(text)
    assert opening(text) != opening(text, image("https://x/a.png"))
    # A bare string part, a text part and string content are the same text.
    assert opening("what is this?") == opening(text)
    as_parts = {
        "messages": [
            SYSTEM,
            {"role": "user", "content": [{"type": "text", "text": FIRST["content"]}]},
        ]
    }
    assert session_key(None, as_parts) == session_key(None, CHAT)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["role", "content", "type", "text", "image_url", "url", "tool_calls"])
            | st.text(max_size=4),
            inner,
            max_size=4,
        )
    ),
    max_leaves=20,
)
MESSAGE = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["user", "system", "assistant"]) | JSON,
        "content": JSON,
        "tool_calls": JSON,
    },
)
BODY = st.dictionaries(
    st.sampled_from(["messages", "user", "model"]),
    JSON | st.lists(MESSAGE | JSON, max_size=5),
)


# The first unicode strategy of a run builds hypothesis' character map: a second or more on a
# busy machine, which is not this test being slow.
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.none() | st.text(max_size=6), BODY)
def test_session_key_never_raises(header: str | None, body: dict[str, Any]) -> None:
    key = session_key(header, body)
    assert key[:2] in {"s:", "u:", "p:"}
    assert key == session_key(header, body)


def test_a_lone_surrogate_in_user_is_a_key_like_any_other() -> None:
    key = session_key(None, {"user": "\ud800x"})
    assert key == "u:\ud800x"
    assert Affinity().order(idle("a", "b"), key)[0] in {"a", "b"}
    assert session_key(None, {"messages": [{"role": "user", "content": "\udfff"}]}).startswith("p:")


# --- the prompt key: what it is made of ------------------------------------------------------


def one(message: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [message]}


def calls(*tool_calls: object) -> dict[str, Any]:
    return one({"role": "assistant", "content": None, "tool_calls": list(tool_calls)})


@pytest.mark.parametrize(
    ("body", "same_as"),
    [
        (one({"role": 5, "content": "hi"}), one({"content": "hi"})),
        (one({"role": "user", "content": [{"type": 7}]}), one({"role": "user", "content": [{}]})),
        (one({"role": "user", "content": [7]}), one({"role": "user", "content": [{}]})),
        (
            one({"role": "user", "content": [{"type": "text", "text": 5}]}),
            one({"role": "user", "content": [{"type": "text"}]}),
        ),
        # An image_url given as the bare URL string is that URL.
        (
            one({"role": "user", "content": [{"type": "image_url", "image_url": "https://x/a"}]}),
            one({"role": "user", "content": [image("https://x/a")]}),
        ),
        (
            calls({"function": {"name": 3, "arguments": "{}"}}),
            calls({"function": {"arguments": "{}"}}),
        ),
        (calls({"id": "call_1"}), calls({"function": {}})),
        (calls("not a call"), calls({"function": {}})),
    ],
    ids=[
        "role",
        "part-type",
        "part-not-an-object",
        "text",
        "image-url-string",
        "call-name",
        "call-without-function",
        "call-not-an-object",
    ],
)
def test_what_is_not_a_string_counts_as_missing(
    body: dict[str, Any], same_as: dict[str, Any]
) -> None:
    assert session_key(None, body) == session_key(None, same_as)


@pytest.mark.parametrize(
    ("body", "other"),
    [
        (
            calls({"function": {"name": "f", "arguments": "{}"}}),
            calls({"function": {"name": "g", "arguments": "{}"}}),
        ),
        # Other parts are their type: an audio part is not a file part.
        (
            one({"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}),
            one({"role": "user", "content": [{"type": "file", "file": {}}]}),
        ),
    ],
    ids=["tool-call-name", "part-type"],
)
def test_the_prompt_key_tells_apart(body: dict[str, Any], other: dict[str, Any]) -> None:
    assert session_key(None, body) != session_key(None, other)


def test_the_prompt_key_is_the_documented_digest() -> None:
    # Every gateway process, and the next release, must derive the same key from the same
    # conversation (docs/routing.md): a key that changed would move every conversation off the
    # replica holding its prefix. So the format is pinned: blake2b (16 bytes, hex) of the
    # opening as compact JSON lists.
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    body = {
        "messages": [
            SYSTEM,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {
                "role": "user",
                "content": ["hi", image("https://x/a.png"), {"type": "input_audio"}],
            },
            {"role": "assistant", "content": "a later turn"},
        ]
    }
    canonical = (
        '[["system",[["text","You are terse."]],[]],'
        '["assistant",[],[["f","{}"]]],'
        '["user",[["text","hi"],["image_url","https://x/a.png"],["input_audio",null]],[]]]'
    )
    digest = hashlib.blake2b(canonical.encode("ascii"), digest_size=16).hexdigest()
    assert session_key(None, body) == "p:" + digest
