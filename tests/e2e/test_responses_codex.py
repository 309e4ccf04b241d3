"""What Codex CLI sends to ``POST /v1/responses``, as it sends it (issue 32, item 3: captured
from Codex 0.169.0): ``store: false``, ``stream: true``, ``include:
["reasoning.encrypted_content"]``, ``reasoning.summary``, ``parallel_tool_calls``,
``prompt_cache_key``, ``client_metadata``, developer messages, function tools, a ``namespace``
tool and ``web_search``. A raw HTTP client, as Codex is one; two turns of a tool loop."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.e2e.harness import Stack, script

INSTRUCTIONS = "You are Codex, based on GPT-5. You are running as a coding agent in the Codex CLI."
SHELL: Any = {
    "type": "function",
    "name": "shell",
    "description": "Runs a shell command and returns its output.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {
            "command": {"type": "array", "items": {"type": "string"}},
            "workdir": {"type": "string"},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
}
FILES: Any = {
    "type": "namespace",
    "name": "mcp__files__",
    "description": "Tools of the MCP server 'files'.",
    "tools": [
        {
            "type": "function",
            "name": "read",
            "description": "Read a file.",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        }
    ],
}
CALL = script(
    {"reasoning": "I need the file"},
    {"tool_call": {"name": "mcp__files__read", "arguments": {"path": "README.md"}}},
)


def codex_body(items: list[Any]) -> dict[str, Any]:
    return {
        "model": "agent-lite",
        "instructions": INSTRUCTIONS,
        "input": items,
        "tools": [SHELL, FILES, {"type": "web_search", "external_web_access": False}],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
        "text": {"verbosity": "medium"},
        "client_metadata": {"originator": "codex_cli_rs", "version": "0.169.0"},
    }


FIRST_TURN: list[Any] = [
    {
        "type": "message",
        "role": "developer",
        "content": [
            {
                "type": "input_text",
                "text": "<permissions instructions>sandbox</permissions instructions>",
            }
        ],
    },
    {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "<environment_context>cwd</environment_context>"}
        ],
    },
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": CALL}]},
]


def events_of(body: bytes) -> list[dict[str, Any]]:
    events = []
    for block in body.decode().split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: ") :]))
    return events


async def test_codex_s_request_as_it_is(stack: Stack) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        answer = await client.post(stack.v1 + "/responses", json=codex_body(FIRST_TURN))
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"].startswith("text/event-stream")
        assert answer.headers["x-gateway-dropped-tools"] == "web_search"
        events = events_of(answer.content)
        done = events[-1]
        assert done["type"] == "response.completed"
        output = done["response"]["output"]
        reasoning, call = output
        # A summary was asked for: the thinking is the reasoning item's summary.
        assert reasoning["summary"] == [{"type": "summary_text", "text": "I need the file"}]
        # include asked for it: sealed, though vLLM signs nothing (it comes back next turn).
        assert reasoning["encrypted_content"].startswith("tgw1.")
        # The namespace's function, named back as Codex declared it.
        assert (call["namespace"], call["name"]) == ("mcp__files__", "read")
        assert json.loads(call["arguments"]) == {"path": "README.md"}
        sent = (await stack.sim_stats())["last_request_body"]
        assert [t["function"]["name"] for t in sent["tools"]] == ["shell", "mcp__files__read"]
        assert sent["messages"][:2] == [
            {"role": "system", "content": INSTRUCTIONS},
            {
                "role": "system",
                "content": "<permissions instructions>sandbox</permissions instructions>",
            },
        ]
        for field in ("include", "client_metadata", "store", "text", "reasoning"):
            assert field not in sent

        # The next turn: Codex's history (the answer's items, with their ids) and the output.
        second = [
            *FIRST_TURN,
            *output,
            {"type": "function_call_output", "call_id": call["call_id"], "output": "# Title"},
        ]
        answer = await client.post(stack.v1 + "/responses", json=codex_body(second))
        assert answer.status_code == 200, answer.text
        assert events_of(answer.content)[-1]["type"] == "response.completed"
        sent = (await stack.sim_stats())["last_request_body"]
        assistant, tool = sent["messages"][-2:]
        assert assistant["tool_calls"][0]["function"] == {
            "name": "mcp__files__read",
            "arguments": call["arguments"],
        }
        assert tool == {"role": "tool", "tool_call_id": call["call_id"], "content": "# Title"}
        metrics = (await client.get(stack.gateway.base_url + "/metrics")).text
    for field in ("client_metadata", "text.verbosity", "tool:web_search"):
        line = f'gateway_front_dropped_fields_total{{field="{field}",front="responses"}} 2.0'
        assert line in metrics
    # The one include the gateway serves, and the sealed reasoning sent back: neither dropped.
    assert 'field="include"' not in metrics
    assert 'field="reasoning_unopened"' not in metrics


async def test_builtin_tools_refused_where_the_alias_says_so() -> None:
    from tests.e2e.harness import gateway_config, provider_toml, running_gateway, running_sim

    async with running_sim() as sim:
        toml = provider_toml("sim-a", sim.base_url).replace(
            "[[aliases.agent-lite.providers]]",
            'builtin_tools = "refuse"\n[[aliases.agent-lite.providers]]',
            1,
        )
        async with running_gateway(gateway_config(toml)) as gateway, httpx.AsyncClient() as client:
            answer = await client.post(
                gateway.base_url + "/v1/responses", json=codex_body(FIRST_TURN)
            )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("unsupported_parameter", "tools[2].type")


async def test_prompt_cache_key_is_the_session_for_replica_affinity() -> None:
    from tests.e2e.harness import gateway_config, running_gateway
    from tests.e2e.test_replicas import finished, fleet_of, replicas_toml, sessions_split, two_sims

    async with two_sims() as (a, b):
        config = gateway_config(replicas_toml(a.base_url, b.base_url, routing="affinity"))
        async with running_gateway(config) as gateway, httpx.AsyncClient(timeout=10) as client:
            sessions = sessions_split(fleet_of(gateway), per_replica=3)
            homes: dict[str, int] = {}
            for _ in range(2):
                for session in sessions:
                    before = finished(a)
                    body = {"model": "agent-lite", "input": "hi", "prompt_cache_key": session}
                    answer = await client.post(gateway.base_url + "/v1/responses", json=body)
                    assert answer.status_code == 200, answer.text
                    home = 0 if finished(a) > before else 1
                    assert homes.setdefault(session, home) == home
    # The ring's owner of each session answered it, turn after turn (a's three first).
    assert [homes[s] for s in sessions] == [0] * 3 + [1] * 3
