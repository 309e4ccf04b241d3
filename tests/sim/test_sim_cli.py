from __future__ import annotations

import subprocess
import sys

import attrs
import httpx
import pytest
import trio

from trio_gateway.sim import SimConfig
from trio_gateway.sim.cli import parse_args


def test_every_config_field_has_a_flag() -> None:
    argv = [
        "--listen", "0.0.0.0:9000",
        "--dialect", "anthropic",
        "--served-model-name", "m",
        "--model", "org/m",
        "--max-num-seqs", "48",
        "--max-output-tokens", "8192",
        "--max-model-len", "32768",
        "--api-key", "k",
        "--no-reasoning-parser",
        "--no-tool-call-parser",
        "--prefill-s-per-token", "0",
        "--decode-step-s", "0.02",
        "--decode-step-s-per-seq", "0.001",
        "--default-reasoning-tokens", "0",
        "--default-text-tokens", "3",
        "--prefix-cache-blocks", "10",
        "--enable-prompt-tokens-details",
        "--client-lead-tokens", "0",
        "--no-abort-on-disconnect",
        "--oauth-public-key-pem", "PEM",
        "--oauth-token-lifetime-s", "60",
        "--vertex-require-token",
        "--access-log",
        "--runner", "pooling",
        "--embedding-dimensions", "16",
        "--scheduling-policy", "priority",
        "--num-gpu-blocks-override", "64",
    ]  # fmt: skip
    config, host, port = parse_args(argv)
    assert (host, port) == ("0.0.0.0", 9000)
    assert config == SimConfig(
        dialect="anthropic",
        served_model_name="m",
        model="org/m",
        max_num_seqs=48,
        max_output_tokens=8192,
        max_model_len=32768,
        api_key="k",
        reasoning_parser=False,
        tool_call_parser=False,
        prefill_s_per_token=0.0,
        decode_step_s=0.02,
        decode_step_s_per_seq=0.001,
        default_reasoning_tokens=0,
        default_text_tokens=3,
        prefix_cache_blocks=10,
        enable_prompt_tokens_details=True,
        client_lead_tokens=0,
        abort_on_disconnect=False,
        oauth_public_key_pem="PEM",
        oauth_token_lifetime_s=60,
        vertex_require_token=True,
        access_log=True,
        runner="pooling",
        embedding_dimensions=16,
        scheduling_policy="priority",
        num_gpu_blocks_override=64,
    )
    flags = {a for a in argv if a.startswith("--")} - {"--listen"}
    assert len(flags) == len(attrs.fields(SimConfig))


def test_defaults_are_simconfigs() -> None:
    assert parse_args([]) == (SimConfig(), "127.0.0.1", 8000)
    assert parse_args(["--listen", "[::1]:0"])[1:] == ("::1", 0)
    assert "<SECRET>" in repr(parse_args(["--api-key", "hunter2"])[0])


@pytest.mark.parametrize(
    "argv",
    [
        ["--max-num-seqs", "0"],
        ["--max-num-seqs", "x"],
        ["--listen", "nope"],
        ["--colour", "red"],
        ["--dialect", "cohere"],
    ],
)
def test_bad_flags_exit_with_usage(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2
    assert "usage:" in capsys.readouterr().err


async def test_python_dash_m_serves() -> None:
    argv = [sys.executable, "-m", "trio_gateway.sim", "--listen", "127.0.0.1:0"]
    argv += ["--served-model-name", "cli-model", "--api-key", "k"]
    process = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None
        with trio.fail_after(15):
            line = b""
            while not line.endswith(b"\n"):
                line += await process.stdout.receive_some(1)
        base_url = line.decode().split(" on ")[1].strip().removesuffix("/v1")
        async with httpx.AsyncClient(base_url=base_url) as client:
            assert (await client.get("/health")).status_code == 200
            models = await client.get("/v1/models", headers={"Authorization": "Bearer k"})
            assert models.json()["data"][0]["id"] == "cli-model"
    finally:
        process.terminate()
        with trio.fail_after(5):
            # SIGTERM is a clean stop: exit status 0, not -15.
            assert await process.wait() == 0
