"""``fronts/responses/turn.py``: a turn's translation runs on the loop or in a worker thread by
its whole weight, the body's bytes and those of the conversation it continues (issue 39's
bound: a big conversation delays no one; a small one pays no thread hop, as over HTTP)."""

from __future__ import annotations

import threading

import pytest

from trio_gateway.accounting.response_records import Record, Stored
from trio_gateway.config.load import parse_config
from trio_gateway.dispatch.router import Router
from trio_gateway.fronts.off_loop import OFF_LOOP_BODY_BYTES
from trio_gateway.fronts.responses.service import service_of
from trio_gateway.fronts.responses.turn import prepare_turn

CONFIG = """
[aliases.a]
providers = [{name = "p", type = "openai_compatible", base_url = "http://h:1/v1", model = "m"}]
"""


def record(text: str) -> Stored:
    output = [
        {
            "id": "msg_" + "1" * 32 + "_0",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "ok"}],
        }
    ]
    return Stored.of(
        Record(
            id="resp_" + "1" * 32,
            previous=None,
            response={"id": "resp_" + "1" * 32, "object": "response", "output": output},
            input=[{"type": "message", "role": "user", "content": text}],
        )
    )


@pytest.mark.parametrize(("history_chars", "off_loop"), [(1_000, False), (100_000, True)])
async def test_a_continued_turn_is_translated_where_its_weight_says(
    history_chars: int, off_loop: bool
) -> None:
    config = parse_config(CONFIG)
    router = Router(config.aliases, {}, filters=config.filters)
    service = service_of(router)
    stored = record("x" * history_chars)
    await service.store.put("", stored)
    assert (stored.size > OFF_LOOP_BODY_BYTES) is off_loop
    threads: list[int] = []
    body = {"model": "a", "input": "next", "previous_response_id": stored.id}
    turn = await prepare_turn(
        router,
        service,
        body,
        None,
        front="responses_ws",
        size=100,
        depth_known=True,
        count_dropped=lambda parsed: threads.append(threading.get_ident()),
    )
    assert [m["role"] for m in turn.request.body["messages"]] == ["user", "assistant", "user"]
    assert (threads != [threading.get_ident()]) is off_loop
