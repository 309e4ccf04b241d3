"""What each cloud vendor refuses, and what the gateway does so that a client's request is not
refused for it: each vendor a simulator that refuses what that vendor refuses, in its words."""

from __future__ import annotations

import httpx

from tests.e2e.harness import chat, script
from tests.e2e.test_cloud_providers import fleet, only


async def test_a_whitespace_only_stop_sequence_is_not_sent_to_anthropic() -> None:
    """Anthropic answers 400 to ``stop_sequences: ["\\n"]``: the gateway drops it, keeps the
    others, and the client gets its answer."""
    async with fleet(only("anthropic")) as f, httpx.AsyncClient(timeout=10) as client:
        for stop, sent in ((["\n"], None), (["\n", "END"], ["END"])):
            body = chat(script({"text": "one line"}), stop=stop)
            answer = await client.post(f.v1 + "/chat/completions", json=body)
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["message"]["content"] == "one line"
            assert (await f.last_body("anthropic")).get("stop_sequences") == sent
