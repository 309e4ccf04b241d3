"""Codex CLI (0.169.0, the npm install of ``test_codex_cli.py``) over the Responses API's
WebSocket mode: a provider with ``supports_websockets = true`` completes a tool-using ``codex
exec``, and the gateway's metrics prove the socket carried it. Codex falls back to HTTPS after
refused handshakes, so a completed answer alone proves nothing: no ``POST /v1/responses``
may have come, one socket was opened (a ``previous_response_not_found`` makes Codex open
another and resend everything), its warm-up was remembered (``generate: false``), its turns
answered, and no create was refused."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.e2e.harness import (
    Stack,
    gateway_config,
    provider_toml,
    running_gateway,
    running_sim,
    script,
)
from tests.e2e.responses_socket import http_posts, metric, socket_creates
from tests.e2e.test_codex_cli import ROOMY_SIM, codex, codex_exec

__all__ = ["codex"]  # the fixture: installs the CLI once per session


async def test_codex_exec_runs_a_tool_over_the_socket(
    codex: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="trio_gateway")
    steps = '{"steps": [{"text": "the command said so"}]}'
    command = 't=sim; echo "<$t>"\'' + steps + '\'"</$t>"'
    prompt = script(
        {"reasoning": "I should run it"},
        {"tool_call": {"name": "exec_command", "arguments": {"cmd": command}}},
    )
    async with running_sim(ROOMY_SIM) as sim:
        config = gateway_config(provider_toml("sim-a", sim.base_url))
        async with running_gateway(config) as gateway:
            stack = Stack(sim=sim, gateway=gateway)
            done = await codex_exec(codex, stack, tmp_path / "home", prompt, websockets=True)
            stats = await stack.sim_stats()
            assert done.returncode == 0, done.stderr.decode()[-3000:]
            assert "the command said so" in done.stdout.decode()
            # The tool call, then the answer from its output: two generations, both over the
            # one socket, after the warm-up it remembered.
            assert stats["requests"] == 2
            assert http_posts(gateway) == 0
            assert metric(gateway, "gateway_responses_sockets_opened_total") == 1
            assert socket_creates(gateway, "remembered") >= 1
            assert socket_creates(gateway, "answered") == 2
            assert socket_creates(gateway, "refused") == 0
            # Each turn continued the previous response and sent only its new items: the
            # simulator's last request holds the whole conversation all the same.
            sent = stats["last_request_body"]["messages"]
            assert sent[0]["role"] == "system"
            assert sent[-1]["role"] == "tool" and "the command said so" in sent[-1]["content"]
    # What each create was (the gateway's debug line): a warm-up with no answer, then turns
    # that each continue the last response with only their new items; a tool turn sends
    # only the call's output.
    creates = [
        dict(pair.split("=", 1) for pair in r.getMessage().split(": create ", 1)[1].split())
        for r in caplog.records
        if r.getMessage().startswith("responses socket: create ")
    ]
    assert [c["generate"] for c in creates] == ["False", "True", "True"]
    assert creates[0]["previous"] == "-"
    assert all(c["previous"].startswith("resp_") for c in creates[1:])
    assert creates[1]["previous"] != creates[2]["previous"]
    assert creates[2]["input_items"] == "1"
