"""``fronts/responses/prefixes.py``: a WebSocket turn that continues one of the socket's
responses goes on from its conversation as already read. The chat body sent upstream is the
same, byte for byte, as the one a turn that reads the conversation back makes; the prefixes are
bounded; a chain the memory no longer wholly holds is read back (and refused) as before."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from trio_gateway.accounting.response_memory import MemoryResponseStore
from trio_gateway.accounting.response_records import ChainBounds, Record, Stored
from trio_gateway.config.load import parse_config
from trio_gateway.config.schema import ServerConfig
from trio_gateway.core.errors import ContentFiltered, ResponseNotFound
from trio_gateway.dispatch.router import Router
from trio_gateway.fronts.responses.items import Prefix
from trio_gateway.fronts.responses.prefixes import MESSAGE_BYTES, Prefixes
from trio_gateway.fronts.responses.service import service_of
from trio_gateway.fronts.responses.socket_turn import FRONT_WS, Session, _memorize
from trio_gateway.fronts.responses.turn import Turn, prepare_turn
from trio_gateway.providers.openai_compatible.dialect import _ENCODER, build_body

PROVIDER = '{name = "p", type = "openai_compatible", base_url = "http://h:1/v1", model = "m"}'
CONFIG = f"""
[aliases.a]
providers = [{PROVIDER}]
[aliases.f]
providers = [{PROVIDER}]
input_filters = ["secret"]
[filters.secret]
patterns = ["falcon"]
"""
MEMORY_BYTES = 1 << 20
TOOLS = [
    {"type": "function", "name": "read_file", "parameters": {"type": "object"}},
    {"type": "function", "name": "run", "description": "Run a command."},
]


async def unused(texts: Sequence[str]) -> None:
    raise AssertionError("nothing is sent")


def session(router: Router, prefixes: bool) -> Session:
    memory = MemoryResponseStore(ttl_s=600, max_bytes=MEMORY_BYTES, key_quota_bytes=MEMORY_BYTES)
    return Session(
        router=router,
        server=ServerConfig(),
        service=service_of(router),
        key=None,
        memory=memory,
        memory_bytes=MEMORY_BYTES,
        new_request_id=lambda: "req",
        send_texts=unused,
        drop_connection=None,
        prefixes=Prefixes(memory, max_bytes=MEMORY_BYTES) if prefixes else None,
    )


def output(turn: Turn, step: int, sealed: str) -> list[dict[str, Any]]:
    """What the model answered on step ``step``: reasoning (sealed, and plain), text, calls."""
    hexid = turn.response_id.removeprefix("resp_")
    return [
        {"id": f"rs_{hexid}_0", "type": "reasoning", "summary": [], "encrypted_content": sealed},
        {
            "id": f"rs_{hexid}_1",
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": f"thinking {step}"}],
        },
        {
            "id": f"msg_{hexid}_2",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": f"Reading {step}.", "annotations": []}],
        },
        {
            "id": f"fc_{hexid}_3",
            "type": "function_call",
            "status": "completed",
            "call_id": f"call_{step}_a",
            "name": "read_file",
            "arguments": json.dumps({"path": f"f{step}.py"}),
        },
        {
            "id": f"fc_{hexid}_4",
            "type": "function_call",
            "status": "completed",
            "call_id": f"call_{step}_b",
            "name": "run",
            "arguments": "{}",
        },
    ]


def tool_outputs(step: int) -> list[dict[str, Any]]:
    return [
        {"type": "function_call_output", "call_id": f"call_{step}_a", "output": f"text {step}"},
        {
            "type": "function_call_output",
            "call_id": f"call_{step}_b",
            "output": [{"type": "input_text", "text": f"ran {step} ✓"}],
        },
    ]


async def take_turn(one: Session, body: dict[str, Any]) -> Turn:
    return await prepare_turn(
        one.router,
        one.service,
        body,
        None,
        front=FRONT_WS,
        size=len(json.dumps(body)),
        depth_known=True,
        local=(one.memory,),
        prefixes=one.prefixes,
    )


def upstream(router: Router, turn: Turn) -> bytes:
    provider = router.aliases[turn.request.alias].providers[0]
    return _ENCODER.encode(build_body(turn.request, provider)).encode()


# Each step: the step it continues (None: the first), its alias, its new input.
Script = list[tuple[int | None, str, list[dict[str, Any]]]]


def script() -> Script:
    steps: Script = [(None, "a", [{"role": "user", "content": "Read the files."}])]
    for step in range(1, 5):
        steps.append((step - 1, "a", tool_outputs(step - 1)))
    # A fork onto another lane: step 2's answer continued again, with an assistant message of
    # the client's own (it joins the open assistant turn), another system message and a user's.
    fork = [
        {"type": "message", "role": "assistant", "content": "And one more."},
        *tool_outputs(2),
        {"type": "message", "role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Go on."}]},
    ]
    steps.append((2, "a", fork))
    steps.append((5, "a", tool_outputs(5)))
    # The same conversation under the alias with an input filter.
    steps.append((6, "f", tool_outputs(6)))
    return steps


async def test_a_continued_turn_sends_upstream_what_reading_it_back_sends() -> None:
    gateway = router()
    cached, plain = session(gateway, True), session(gateway, False)
    sealed = service_of(gateway).sealer.seal([{"type": "reasoning.text", "text": "t", "sig": "s"}])
    ids: dict[str, list[str]] = {"cached": [], "plain": []}
    for step, (previous, alias, items) in enumerate(script()):
        turns = {}
        for name, one in (("cached", cached), ("plain", plain)):
            body: dict[str, Any] = {
                "model": alias,
                "input": items,
                "tools": TOOLS,
                "instructions": f"Step {step}.",
                "store": False,
                "stream": True,
            }
            if previous is not None:
                body["previous_response_id"] = ids[name][previous]
            turn = turns[name] = await take_turn(one, body)
            response: dict[str, Any] = {
                "id": turn.response_id,
                "object": "response",
                "status": "completed",
            }
            response["output"] = output(turn, step, sealed)
            await _memorize(one, turn, turn.record(response))
            ids[name].append(turn.response_id)
        assert upstream(gateway, turns["cached"]) == upstream(gateway, turns["plain"])
        # And before the provider: reasoning_details (the sealed reasoning, opened) included.
        mine_body, theirs_body = turns["cached"].request.body, turns["plain"].request.body
        assert json.dumps(mine_body) == json.dumps(theirs_body)
        mine, theirs = turns["cached"].parsed, turns["plain"].parsed
        assert mine.dropped_fields == theirs.dropped_fields
        assert mine.sources == theirs.sources
        assert mine.input_items == theirs.input_items
        assert turns["cached"].history_bytes == turns["plain"].history_bytes
    assert cached.prefixes is not None
    assert cached.prefixes.hits == len(script()) - 1
    # The last turn's messages: steps 0, 1, 2, the fork, 6 and 7, every tool call answered.
    messages = turns["cached"].request.body["messages"]
    assert [m["role"] for m in messages].count("tool") == 2 * 5
    assert sum("reasoning_details" in m for m in messages) == 5


async def test_a_filtered_word_in_the_new_input_is_refused_with_a_prefix() -> None:
    one = session(router(), True)
    first = await take_turn(one, {"model": "f", "input": "hello", "store": False})
    await _memorize(one, first, first.record({"id": first.response_id, "output": []}))
    body = {"model": "f", "input": "FALCON", "previous_response_id": first.response_id}
    with pytest.raises(ContentFiltered):
        await take_turn(one, body)
    assert one.prefixes is not None and one.prefixes.hits == 1


async def test_a_chain_the_memory_lost_is_read_back_and_refused_as_before() -> None:
    one = session(router(), True)
    first = await take_turn(one, {"model": "a", "input": "hello", "store": False})
    await _memorize(one, first, first.record({"id": first.response_id, "output": []}))
    body = {"model": "a", "input": "again", "previous_response_id": first.response_id}
    second = await take_turn(one, body)
    await _memorize(one, second, second.record({"id": second.response_id, "output": []}))
    assert one.prefixes is not None and len(one.prefixes) == 2
    await one.memory.delete("", first.response_id)
    body = {"model": "a", "input": "more", "previous_response_id": second.response_id}
    with pytest.raises(ResponseNotFound, match="no longer stored"):
        await take_turn(one, body)
    assert len(one.prefixes) == 1  # the lost chain's prefix is dropped


def router() -> Router:
    config = parse_config(CONFIG)
    return Router(config.aliases, {}, filters=config.filters)


BOUNDS = ChainBounds(max_turns=100, max_bytes=1 << 30)


def stored(response_id: str, previous: str | None, text: str) -> Stored:
    record = Record(
        id=response_id,
        previous=previous,
        response={"id": response_id, "output": []},
        input=[{"type": "message", "role": "user", "content": text}],
    )
    return Stored.of(record)


def empty() -> Prefix:
    return Prefix(
        messages=(),
        sources=(),
        text=(),
        calls=(),
        details=(),
        turn_source=None,
        dropped=(),
        items=0,
        namespaced=False,
    )


async def keep(prefixes: Prefixes, memory: MemoryResponseStore, one: Stored) -> None:
    await memory.put("", one)
    items = [{"type": "message", "role": "user", "content": "x" * (one.size - 100)}]
    prefixes.keep("", one.id, empty(), items, opener=lambda s: None, turns=1, size=one.size)


async def test_prefixes_stay_within_their_bytes_and_count() -> None:
    memory = MemoryResponseStore(ttl_s=600, max_bytes=1 << 30, key_quota_bytes=1 << 30)
    charge = 1000 + 2 * MESSAGE_BYTES
    prefixes = Prefixes(memory, max_bytes=3 * charge, max_prefixes=4)
    records = [stored(f"resp_{i}", None, "x" * (1000 - 100)) for i in range(6)]
    records = [attrs_evolve(r, size=1000) for r in records]
    for one in records:
        await keep(prefixes, memory, one)
        assert prefixes.bytes <= 3 * charge
        assert len(prefixes) <= 4
    assert len(prefixes) == 3 and prefixes.bytes == 3 * charge
    # Least recently used first out; a use moves one to the back.
    assert prefixes.get("", "resp_0", BOUNDS) is None
    assert prefixes.get("", "resp_3", BOUNDS) is not None
    await keep(prefixes, memory, attrs_evolve(stored("resp_6", None, ""), size=1000))
    assert prefixes.get("", "resp_4", BOUNDS) is None
    assert prefixes.get("", "resp_3", BOUNDS) is not None
    # One past the bound alone is not kept, and pushes nothing out.
    await keep(prefixes, memory, attrs_evolve(stored("resp_7", None, ""), size=3 * charge))
    assert prefixes.get("", "resp_7", BOUNDS) is None
    assert len(prefixes) == 3


async def test_a_prefix_is_not_used_past_the_chain_bounds() -> None:
    memory = MemoryResponseStore(ttl_s=600, max_bytes=1 << 30, key_quota_bytes=1 << 30)
    prefixes = Prefixes(memory, max_bytes=1 << 20)
    await keep(prefixes, memory, stored("resp_0", None, "x" * 500))
    assert prefixes.get("", "resp_0", ChainBounds(max_turns=1, max_bytes=100)) is None
    assert len(prefixes) == 0


def attrs_evolve(one: Stored, *, size: int) -> Stored:
    return Stored(id=one.id, previous=one.previous, text=one.text, size=size)
