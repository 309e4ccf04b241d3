"""The real Claude Code CLI (``claude -p``) against the gateway routed to the simulator as vLLM:
a turn, and a tool-using task. The CLI is installed from npm, its version pinned, into the
gateway's cache (``~/.cache/trio-gateway/npm``, or under ``TRIO_GATEWAY_CACHE``) on first use;
without npm these tests are skipped (marker ``cli``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from tests.e2e.harness import (
    FAST_SIM,
    Stack,
    gateway_config,
    provider_toml,
    running_gateway,
    running_sim,
    script,
)

CLAUDE_CODE_VERSION = "2.1.328"
PACKAGE = "@anthropic-ai/claude-code"
NPM = shutil.which("npm")
NODE = shutil.which("node")

pytestmark = [
    pytest.mark.cli,
    pytest.mark.skipif(NPM is None or NODE is None, reason="needs npm and node"),
]


def install_dir() -> Path:
    root = os.environ.get("TRIO_GATEWAY_CACHE") or str(Path.home() / ".cache" / "trio-gateway")
    return Path(root) / "npm" / f"claude-code-{CLAUDE_CODE_VERSION}"


def claude_command() -> list[str]:
    """The pinned CLI, installed once. npm 11 runs no install scripts it was not told to, so
    the package's own wrapper starts the platform's native binary (an optional dependency)."""
    where = install_dir()
    wrapper = where / "node_modules" / PACKAGE / "cli-wrapper.cjs"
    stamp = where / ".installed"
    if not stamp.exists():
        where.mkdir(parents=True, exist_ok=True)
        assert NPM is not None
        spec = f"{PACKAGE}@{CLAUDE_CODE_VERSION}"
        subprocess.run(
            [NPM, "install", "--no-audit", "--no-fund", "--prefix", str(where), spec],
            check=True,
            capture_output=True,
            timeout=600,
        )
        stamp.write_text(CLAUDE_CODE_VERSION)
    assert NODE is not None and wrapper.exists(), wrapper
    return [NODE, str(wrapper)]


@pytest.fixture(scope="module")
def claude() -> list[str]:
    return claude_command()


def environment(home: Path, base_url: str) -> dict[str, str]:
    """What a user exports (docs/api.md), in a home of its own, with nothing sent elsewhere."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "tgw-unused",
        "ANTHROPIC_MODEL": "agent-lite",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "agent-lite",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }


async def run_claude(
    claude: list[str], home: Path, stack: Stack, prompt: str, *extra: str
) -> tuple[int, dict[str, Any]]:
    command = [*claude, "-p", prompt, "--output-format", "json", *extra]
    with trio.fail_after(120):
        done = await trio.run_process(
            command,
            env=environment(home, stack.gateway.base_url),
            cwd=home,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    result: dict[str, Any] = json.loads(done.stdout)
    return done.returncode, result


async def bodies(stack: Stack) -> list[dict[str, Any]]:
    return list((await stack.sim_stats())["last_request_bodies"])


def refusals(stack: Stack) -> float | None:
    return stack.gateway.router.metrics.registry.get_sample_value(
        "gateway_http_requests_total", {"route": "/v1/messages", "status": "400"}
    )


@pytest.fixture
async def roomy() -> Any:
    """Claude Code's system prompt and tools are some 13,000 tokens: a vLLM with room for them,
    whose provider says how much output it takes (Claude Code asks for 32000)."""
    async with running_sim(attrs.evolve(FAST_SIM, max_model_len=200_000)) as sim:
        extra = "max_output_tokens = 32000"
        config = gateway_config(provider_toml("sim-a", sim.base_url, extra=extra))
        async with running_gateway(config) as gateway:
            yield Stack(sim=sim, gateway=gateway)


async def test_claude_p_completes_a_turn(claude: list[str], roomy: Stack, tmp_path: Path) -> None:
    code, result = await run_claude(claude, tmp_path, roomy, script({"text": "Hello from vLLM"}))
    assert code == 0, result
    assert (result["is_error"], result["result"]) == (False, "Hello from vLLM")
    assert result["usage"]["output_tokens"] > 0
    (sent,) = await bodies(roomy)
    assert sent["max_tokens"] == 32000 and sent["stream"] is True
    # Served the first time: Claude Code sends a request again without what was refused.
    assert refusals(roomy) is None
    assert len(sent["tools"]) >= 10  # Claude Code's own tools, as function tools


async def test_claude_p_runs_a_tool_the_model_called(
    claude: list[str], roomy: Stack, tmp_path: Path
) -> None:
    call = {"name": "Bash", "arguments": {"command": "touch made-by-claude", "description": "x"}}
    prompt = "Make the file. " + script({"tool_call": call})
    # The simulator's script answers every turn of the conversation the same (a tool call), so
    # the task ends at the turn limit, after the tool ran and its result went back.
    code, result = await run_claude(
        claude, tmp_path, roomy, prompt, "--allowedTools", "Bash(touch:*)", "--max-turns", "2"
    )
    assert (tmp_path / "made-by-claude").exists(), result
    assert result["permission_denials"] == [] and result["terminal_reason"] == "max_turns"
    assert code == 1
    first, second = await bodies(roomy)
    assert [m["role"] for m in first["messages"]] == ["system", "user", "system"]
    called = second["messages"][-2]
    assert called["tool_calls"][0]["function"]["name"] == "Bash"
    assert refusals(roomy) is None
    result_message = second["messages"][-1]
    assert result_message["role"] == "tool"
    assert result_message["tool_call_id"] == called["tool_calls"][0]["id"]
