"""``bench/cancellation_ws.py``: scenario C's WebSocket clients ask for what the HTTP clients
ask for (a prompt of P simulator tokens, exactly M content tokens, finish "length"), through the
Responses front's translation, and count what they receive the same way."""

from __future__ import annotations

import json
from typing import Any

import pytest
from bench.cancellation_load import SERVED_MODEL, StreamResult
from bench.cancellation_ws import Reader, create_message

from trio_gateway.fronts.responses.request import parse_responses_body
from trio_gateway.fronts.responses.seal import Sealer
from trio_gateway.sim.config import SimConfig
from trio_gateway.sim.request import ChatRequest, chat_request_from
from trio_gateway.sim.script import plan_generation


def _as_the_simulator_sees_it(create: dict[str, Any]) -> ChatRequest:
    """The create as the gateway translates it (a POST body: no ``type``), then as the
    simulator reads the chat body (the provider's model name in place of the alias)."""
    body = {k: v for k, v in create.items() if k != "type"}
    chat = parse_responses_body(body, opener=Sealer().open).chat
    request = chat_request_from(
        {**chat, "model": SERVED_MODEL, "stream": True}, SimConfig(served_model_name=SERVED_MODEL)
    )
    assert isinstance(request, ChatRequest)
    return request


@pytest.mark.parametrize(("prompt_tokens", "max_tokens"), [(500, 2000), (50, 40)])
def test_the_create_asks_for_p_prompt_tokens_and_exactly_m_content_tokens(
    prompt_tokens: int, max_tokens: int
) -> None:
    create = create_message("bench", "n7", prompt_tokens=prompt_tokens, max_tokens=max_tokens)
    assert create["type"] == "response.create" and create["store"] is False
    request = _as_the_simulator_sees_it(create)
    assert request.prompt.tokens == prompt_tokens
    generation = plan_generation(request, SimConfig(served_model_name=SERVED_MODEL))
    assert generation.finish_reason == "length"
    assert len(generation.tokens) == max_tokens
    assert all(token.kind == "content" and token.text for token in generation.tokens)


def test_a_prompt_too_small_for_the_script_is_refused() -> None:
    with pytest.raises(ValueError, match="script alone"):
        create_message("bench", "n0", prompt_tokens=10, max_tokens=2000)


def _delta(text: str = "x") -> str:
    return json.dumps({"type": "response.output_text.delta", "delta": text})


# Async: the reader stamps the first token with trio's clock.
async def test_a_leaver_leaves_at_its_lth_token() -> None:
    result = StreamResult(index=0, leaves=True)
    client = Reader(result, leave_after=3, started=0.0)
    assert [client.on_message(_delta()) for _ in range(3)] == [False, False, True]
    assert result.left and result.tokens == 3 and result.ttft_s is not None


async def test_a_stayer_counts_non_empty_deltas_to_the_end() -> None:
    result = StreamResult(index=0, leaves=False)
    client = Reader(result, leave_after=1, started=0.0)
    assert not client.on_message(json.dumps({"type": "response.created", "response": {}}))
    assert not client.on_message(_delta(""))
    assert result.ttft_s is None
    assert not any(client.on_message(_delta()) for _ in range(4))
    incomplete = {
        "type": "response.incomplete",
        "response": {
            "incomplete_details": {"reason": "max_output_tokens"},
            "usage": {"input_tokens": 50, "output_tokens": 4},
        },
    }
    assert client.on_message(json.dumps(incomplete))
    assert (result.tokens, result.finish_reason, result.prompt_tokens) == (4, "length", 50)
    assert result.completion_tokens == 4 and not result.left and result.error is None


def test_an_error_ends_the_stream_with_its_error() -> None:
    result = StreamResult(index=0, leaves=False)
    client = Reader(result, leave_after=1, started=0.0)
    error = {"type": "error", "status": 429, "error": {"code": "rate_limit_exceeded"}}
    assert client.on_message(json.dumps(error))
    assert result.error is not None and "rate_limit_exceeded" in result.error
