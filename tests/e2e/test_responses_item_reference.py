"""``item_reference`` input items (issue 40, item 1): what the Vercel AI SDK's default OpenAI
model sends back for the previous turn's reasoning and text when ``store`` is left on. Each is
resolved to the item of the key's own stored response, with the openai SDK as the client; an
id of another key's, or one never stored, is a 400 that names it, in the API's words."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.harness import Stack, running_gateway, running_sim, script
from tests.e2e.test_responses_store import keyed_toml, sdk
from tests.e2e.test_responses_tool_loop import WEATHER
from tests.e2e.test_thinking_tool_loop import QUESTION, replayed, vendor_fleet
from trio_gateway.config.load import parse_config
from trio_gateway.core.keys import new_key

FIRST = script({"reasoning": "think first"}, {"text": "one"})
SECOND = script({"text": "two"})


def not_found(item_id: str) -> str:
    return (
        f"Item with id '{item_id}' not found. Items are not persisted when `store` is set to "
        "false. Try again with `store` set to true, or remove this item from your input."
    )


async def test_references_to_the_last_turn_s_reasoning_and_text(stack: Stack) -> None:
    client = openai.AsyncOpenAI(base_url=stack.v1, api_key="unused", max_retries=0)
    first = await client.responses.create(model="agent-lite", input=FIRST)
    reasoning, message = first.output
    assert (reasoning.type, message.type) == ("reasoning", "message")
    assert reasoning.id is not None and message.id is not None
    assert reasoning.id.endswith("_0") and reasoning.id.startswith("rs_")
    items: list[Any] = [
        {"role": "user", "content": FIRST},
        {"type": "item_reference", "id": reasoning.id},
        # The API's other form: an item with only an id is a reference too.
        {"id": message.id},
        {"role": "user", "content": SECOND},
    ]
    second = await client.responses.create(model="agent-lite", input=items)
    assert second.output_text == "two"
    sent = (await stack.sim_stats())["last_request_body"]
    assert sent["messages"] == [
        {"role": "user", "content": FIRST},
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": SECOND},
    ]
    # The second turn is stored with the items the references stood for.
    third = await client.responses.create(
        model="agent-lite", input=script({"text": "three"}), previous_response_id=second.id
    )
    assert third.output_text == "three"
    sent = (await stack.sim_stats())["last_request_body"]
    assert [m["content"] for m in sent["messages"]] == [
        FIRST,
        "one",
        SECOND,
        "two",
        script({"text": "three"}),
    ]
    await client.close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_tool_loop_by_reference_gives_anthropic_its_signed_thinking(stream: bool) -> None:
    async with vendor_fleet("anthropic") as f:
        client = openai.AsyncOpenAI(base_url=f.v1, api_key="unused", max_retries=0)
        kwargs: Any = {"model": "agent-lite", "tools": [WEATHER], "reasoning": {"effort": "low"}}
        first = await client.responses.create(
            input=[{"role": "user", "content": QUESTION}], **kwargs
        )
        reasoning = next(item for item in first.output if item.type == "reasoning")
        call = next(item for item in first.output if item.type == "function_call")
        assert reasoning.encrypted_content
        # As the AI SDK sends the loop's next step: the reasoning by reference, the call itself.
        items: list[Any] = [
            {"role": "user", "content": QUESTION},
            {"type": "item_reference", "id": reasoning.id},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "18C"},
        ]
        if stream:
            async with client.responses.stream(input=items, **kwargs) as events:
                second = await events.get_final_response()
        else:
            second = await client.responses.create(input=items, **kwargs)
        assert second.status == "completed"
        block = replayed("anthropic", await f.last_body("anthropic"))
        assert block["type"] == "thinking" and block["signature"]
        assert block["thinking"] == "I should look it up"
        await client.close()


async def test_another_key_s_item_or_an_unknown_one_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    keys = {"alice": new_key(), "bob": new_key()}
    async with running_sim() as sim:
        text = keyed_toml(tmp_path, sim.base_url, keys)
        config = parse_config(text, source="t.toml", environ={"SIM_KEY": "sim-key"})
        async with running_gateway(config) as gateway:
            alice, bob = sdk(gateway.base_url, keys["alice"]), sdk(gateway.base_url, keys["bob"])
            made = await alice.responses.create(model="agent-lite", input=FIRST)
            reasoning_id = made.output[0].id
            assert reasoning_id is not None
            unknown = "rs_" + "0" * 32 + "_0"
            for client, item_id in ((bob, reasoning_id), (alice, unknown), (alice, "nope")):
                refer: list[Any] = [
                    {"type": "item_reference", "id": item_id},
                    {"role": "user", "content": SECOND},
                ]
                with pytest.raises(openai.BadRequestError) as refused:
                    await client.responses.create(model="agent-lite", input=refer)
                error: Any = refused.value.body
                assert (error["message"], error["param"]) == (not_found(item_id), "input")
            # Alice's own reference resolves.
            own: list[Any] = [
                {"type": "item_reference", "id": reasoning_id},
                {"role": "user", "content": SECOND},
            ]
            again = await alice.responses.create(model="agent-lite", input=own)
            assert again.output_text == "two"
            await alice.close()
            await bob.close()
