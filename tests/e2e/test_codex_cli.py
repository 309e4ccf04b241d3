"""The real Codex CLI (``@openai/codex``, pinned) against the gateway routed to the simulator:
``codex exec`` with a ``model_providers`` entry whose ``base_url`` is the gateway and whose
``wire_api`` is ``"responses"`` completes a turn, and a tool-using task (it runs a command
whose output the model then answers from: the simulator reads a script in a closing tool
result).

The CLI is installed from the npm registry on first use into a cache directory
(``$TRIO_GATEWAY_TEST_CACHE``, else ``~/.cache/trio-gateway-tests``); without npm the tests
skip."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio

from tests.clients.node_clients import installed
from tests.e2e.harness import (
    FAST_SIM,
    Stack,
    gateway_config,
    provider_toml,
    running_gateway,
    running_sim,
    script,
)
from tests.e2e.test_cloud_providers import ENV, KEYS, MODELS, provider
from trio_gateway.config.load import parse_config

CODEX_VERSION = "0.169.0"
# Codex's instructions and tools are some 10,000 tokens: more than the usual test model holds.
ROOMY_SIM = attrs.evolve(FAST_SIM, max_model_len=262144)
RUN_TIMEOUT_S = 120


@pytest.fixture(scope="session")
def codex() -> Path:
    cache = Path(
        os.environ.get("TRIO_GATEWAY_TEST_CACHE") or Path.home() / ".cache/trio-gateway-tests"
    )
    prefix = cache / f"codex-{CODEX_VERSION}"
    if not prefix.exists():
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip("npm is not installed: the Codex CLI comes from the npm registry")

        def install(into: Path) -> None:
            spec = f"@openai/codex@{CODEX_VERSION}"
            subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--prefix", str(into), spec],
                check=True,
                timeout=600,
                capture_output=True,
            )

        # Installed beside and renamed into place: two test processes (pytest-xdist) that
        # both need it never share a half-filled directory.
        installed(prefix, install)
    binary = prefix / "node_modules" / ".bin" / "codex"
    assert binary.exists(), f"{prefix} holds no codex: remove it to install again"
    return binary


async def codex_exec(
    codex: Path, stack: Stack, home: Path, prompt: str, *, websockets: bool = False
) -> subprocess.CompletedProcess[bytes]:
    """``codex exec`` with the gateway as its model provider; ``websockets``: over the
    Responses API's WebSocket mode (``supports_websockets``), else ``POST /v1/responses``."""
    await trio.Path(home).mkdir(exist_ok=True)
    await trio.Path(home / "config.toml").write_text(
        'model = "agent-lite"\n'
        'model_provider = "gateway"\n'
        'model_reasoning_effort = "low"\n'
        'model_reasoning_summary = "auto"\n'
        "[model_providers.gateway]\n"
        'name = "trio-gateway"\n'
        f'base_url = "{stack.v1}"\n'
        'wire_api = "responses"\n'
        'env_key = "TRIO_GATEWAY_KEY"\n' + ("supports_websockets = true\n" if websockets else "")
    )
    env = {**os.environ, "CODEX_HOME": str(home), "TRIO_GATEWAY_KEY": "unused"}
    command = [
        str(codex),
        "exec",
        "--skip-git-repo-check",
        # The test's machine may have no user namespaces for Codex's sandbox; the one command
        # it runs is an echo.
        "--dangerously-bypass-approvals-and-sandbox",
        prompt,
    ]
    with trio.fail_after(RUN_TIMEOUT_S):
        return await trio.run_process(
            command,
            env=env,
            cwd=str(home),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            stdin=b"",
        )


async def test_codex_exec_completes_a_turn(codex: Path, tmp_path: Path) -> None:
    async with (
        running_sim(ROOMY_SIM) as sim,
        running_gateway(gateway_config(provider_toml("sim-a", sim.base_url))) as gateway,
    ):
        stack = Stack(sim=sim, gateway=gateway)
        prompt = script({"reasoning": "a greeting"}, {"text": "hello from the gateway"})
        done = await codex_exec(codex, stack, tmp_path / "home", prompt)
        sent = (await stack.sim_stats())["last_request_body"]
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert "hello from the gateway" in done.stdout.decode()
    # Codex's request reached vLLM as chat: its instructions first, its session as the key.
    assert sent["messages"][0]["role"] == "system"
    assert sent["prompt_cache_key"]


@asynccontextmanager
async def vendor_stack(vendor: str) -> AsyncIterator[Stack]:
    """The gateway with one provider: the vendor's simulator, with room for Codex's prompt."""
    sim_config = attrs.evolve(
        ROOMY_SIM,
        dialect="vllm" if vendor == "vllm" else vendor,
        api_key=KEYS[vendor],
        served_model_name=MODELS[vendor],
    )
    async with running_sim(sim_config) as sim:
        text = '[server]\nlisten = "127.0.0.1:0"\n[aliases.agent-lite]\n' + provider(
            vendor, sim, weight=100, vision=False
        )
        async with running_gateway(parse_config(text, source="t.toml", environ=ENV)) as gateway:
            yield Stack(sim=sim, gateway=gateway)


@pytest.mark.parametrize("vendor", ["vllm", "anthropic"])
async def test_codex_exec_runs_a_tool_and_answers_from_its_output(
    codex: Path, tmp_path: Path, vendor: str
) -> None:
    # The command prints a script the prompt must not hold as one (the simulator would read
    # the prompt's first "</sim>" as its end): the tag's name comes from a shell variable.
    steps = json.dumps({"steps": [{"text": "the command said so"}]})
    command = 't=sim; echo "<$t>"\'' + steps + '\'"</$t>"'
    prompt = script(
        {"reasoning": "I should run it"},
        {"tool_call": {"name": "exec_command", "arguments": {"cmd": command}}},
    )
    async with vendor_stack(vendor) as stack:
        done = await codex_exec(codex, stack, tmp_path / "home", prompt)
        stats = await stack.sim_stats()
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert "the command said so" in done.stdout.decode()
    assert stats["requests"] == 2
    sent = stats["last_request_body"]
    if vendor == "anthropic":
        # Codex sent the reasoning item back sealed, as it got it (store: false): Anthropic
        # got its signed thinking back, or its simulator would have refused the turn.
        turn = sent["messages"][-2]
        assert turn["role"] == "assistant"
        thinking, call = turn["content"][0], turn["content"][-1]
        assert thinking["type"] == "thinking" and thinking["signature"]
        assert thinking["thinking"] == "I should run it"
        assert call["type"] == "tool_use" and call["input"] == {"cmd": command}
        return
    assistant, result = sent["messages"][-2:]
    call = assistant["tool_calls"][0]
    assert call["function"]["name"] == "exec_command"
    assert json.loads(call["function"]["arguments"]) == {"cmd": command}
    assert result["role"] == "tool" and result["tool_call_id"] == call["id"]
    assert "the command said so" in result["content"]
