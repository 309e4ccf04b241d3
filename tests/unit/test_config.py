"""Strict config: what a platform engineer sees for every mistake, all at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_gateway.cli.main import main
from trio_gateway.config.load import load_config, parse_config
from trio_gateway.config.schema import ConfigError
from trio_gateway.core.capability import Capability

REPO = Path(__file__).resolve().parents[2]

GOOD = """
[server]
listen = "127.0.0.1:8080"

[aliases.agent-lite]
[[aliases.agent-lite.providers]]
name = "vllm-a"
type = "openai_compatible"
base_url = "http://127.0.0.1:8000/v1"
model = "qwen3-32b"
api_key_env = "VLLM_API_KEY"
max_inflight = 32
capabilities = ["tools", "reasoning", "json_schema"]
weight = 100
"""


def problems(text: str, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(
            text, source="gw.toml", environ={"VLLM_API_KEY": "k"} if environ is None else environ
        )
    assert str(info.value).startswith("gw.toml: ")
    return info.value.problems


def test_the_issue_example_parses() -> None:
    config = parse_config(GOOD, environ={"VLLM_API_KEY": "sekrit"})
    [provider] = config.aliases["agent-lite"].providers
    assert provider.max_inflight == 32
    assert provider.capabilities == {Capability.TOOLS, Capability.REASONING, Capability.JSON_SCHEMA}
    assert config.api_keys["vllm-a"].value == "sekrit"
    assert "sekrit" not in repr(config)
    # Defaults for what the file leaves out.
    assert provider.connect_timeout_s == 5.0
    assert config.server.client_stall_timeout_s == 30.0


def test_repo_default_config_is_valid() -> None:
    config = load_config(REPO / "gateway.toml", environ={})
    assert "agent-lite" in config.aliases
    assert config.simulators


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            ("max_inflight = 32", 'max_inflight = "8"'),
            "providers[0].max_inflight: expected an integer, got '8'",
        ),
        (("max_inflight = 32", "max_inflight = 8.7"), "max_inflight: expected an integer, got 8.7"),
        (
            ("max_inflight = 32", "max_inflight = true"),
            "max_inflight: expected an integer, got True",
        ),
        (('model = "qwen3-32b"', "model = 123"), "providers[0].model: expected a string, got 123"),
        (("weight = 100", "weight = 100\nwieght = 3"), "providers[0]: unknown key 'wieght'"),
        (('"tools", ', '"tools", "telepathy", '), "unknown capability 'telepathy'"),
        (("openai_compatible", "openai_compat"), "unknown provider type 'openai_compat'"),
        (
            ('model = "qwen3-32b"\n', ""),
            "aliases.agent-lite.providers[0].model: required field missing",
        ),
        (("max_inflight = 32", "max_inflight = 0"), "max_inflight: must be at least 1"),
        (("weight = 100", "weight = -1"), "weight: must be 0 or more"),
        (
            ("weight = 100", "weight = 100\nmax_output_tokens = 0"),
            "providers[0].max_output_tokens: must be at least 1",
        ),
        (
            ("weight = 100", 'weight = 100\nmax_output_tokens = "64k"'),
            "max_output_tokens: expected an integer",
        ),
        (
            ("http://127.0.0.1:8000/v1", "127.0.0.1:8000"),
            "base_url: expected an http:// or https:// URL",
        ),
        (('listen = "127.0.0.1:8080"', 'listen = "8080"'), "server.listen: expected HOST:PORT"),
        (
            ('listen = "127.0.0.1:8080"', 'listen = "127.0.0.1:8080"\nport = 1'),
            "server: unknown key 'port'",
        ),
        (
            ('listen = "127.0.0.1:8080"', 'listen = "127.0.0.1:8080"\nworkers = 0'),
            "server.workers: must be from 1 to 64",
        ),
        (
            ('listen = "127.0.0.1:8080"', 'listen = "127.0.0.1:8080"\nworkers = 65'),
            "server.workers: must be from 1 to 64",
        ),
        (
            ('listen = "127.0.0.1:8080"', 'listen = "127.0.0.1:8080"\nworkers = "2"'),
            "server.workers: expected a number of workers or \"auto\", got '2'",
        ),
        (
            ("[server]", '[redis]\nurl = "redis://h"\nlease_ttl_s = 0.5\n[server]'),
            "redis.lease_ttl_s: must be at least 3 x redis.timeout_s (0.75)",
        ),
        (
            ("[server]", '[redis]\nurl = "redis://h"\non_lease_error = "wait"\n[server]'),
            "on_lease_error",
        ),
        (
            ("[server]", '[redis]\nurl = "redis://h"\nleases = "yes"\n[server]'),
            "redis.leases: expected",
        ),
    ],
)
def test_each_mistake_is_named_with_its_path(change: tuple[str, str], expected: str) -> None:
    old, new = change
    assert old in GOOD
    found = problems(GOOD.replace(old, new, 1))
    assert any(expected in p for p in found), found


def test_missing_api_key_env_is_reported() -> None:
    found = problems(GOOD, environ={})
    where = "aliases.agent-lite.providers[0].api_key_env"
    assert found == [f"{where}: environment variable 'VLLM_API_KEY' is not set"]


def test_missing_secrets_are_reported_along_with_type_errors() -> None:
    found = problems(GOOD.replace("max_inflight = 32", 'max_inflight = "8"'), environ={})
    assert len(found) == 2, found
    assert any("VLLM_API_KEY" in p for p in found)


def test_all_type_errors_are_reported_together() -> None:
    text = (
        GOOD.replace("max_inflight = 32", 'max_inflight = "8"')
        .replace("weight = 100", "weight = 100\nbogus = 1")
        .replace('"tools", ', '"tools", "telepathy", ')
    )
    found = problems(text)
    assert len(found) == 3, found


def test_duplicate_provider_names_in_an_alias() -> None:
    block = GOOD[GOOD.index("[[aliases") :]
    found = problems(GOOD + block)
    assert any("duplicate provider name 'vllm-a'" in p for p in found), found


def test_a_shared_provider_must_be_defined_the_same() -> None:
    other = (
        GOOD[GOOD.index("[aliases") :]
        .replace("agent-lite", "other")
        .replace("max_inflight = 32", "max_inflight = 4")
    )
    found = problems(GOOD + other)
    assert any("also defined, differently" in p for p in found), found
    same = GOOD[GOOD.index("[aliases") :].replace("agent-lite", "other")
    config = parse_config(GOOD + same, environ={"VLLM_API_KEY": "k"})
    assert list(config.providers()) == ["vllm-a"]


def test_not_toml() -> None:
    assert problems("[server\n")[0].startswith("not valid TOML")


def test_check_command_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        GOOD.replace("max_inflight = 32", 'max_inflight = "8"').replace(
            "weight = 100", "weight = -2"
        )
    )
    assert main(["check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: aliases.agent-lite.providers[0].max_inflight: expected an integer" in err
    assert "Traceback" not in err
    assert main(["check", str(tmp_path / "missing.toml")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["check", str(REPO / "gateway.toml")]) == 0
    assert "ok" in capsys.readouterr().out


def test_simulator_section_is_strict() -> None:
    text = GOOD + '\n[simulators.s]\nlisten = "127.0.0.1:0"\nmax_num_seqs = "4"\nfoo = 1\n'
    found = problems(text)
    assert any("simulators.s" in p and "max_num_seqs" in p for p in found), found
    assert any("simulators.s" in p and "foo" in p for p in found), found


def documented_examples() -> list[str]:
    text = (REPO / "docs" / "configuration.md").read_text()
    return [block.split("```")[0] for block in text.split("```toml\n")[1:]]


def test_the_documented_example_parses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    [example] = [e for e in documented_examples() if "prompt-enhance" in e and "[server]" in e]
    # It listens on 0.0.0.0, so it names a keys file, which must exist.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keys.toml").write_text("")
    config = parse_config(example, environ={"VLLM_API_KEY": "k"})
    assert config.auth.keys_file == "keys.toml"
    assert set(config.aliases) == {"agent-lite", "prompt-enhance"}
    assert config.aliases["prompt-enhance"].on_saturated == "queue"
    assert list(config.providers()) == ["vllm-a", "vllm-b"]


def test_the_documented_error_output_is_what_check_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "gateway.toml"
    bad.write_text(
        GOOD.replace("max_inflight = 32", 'max_inflight = "8"')
        .replace("weight = 100", "weight = 100\nwieght = 3")
        .replace('"tools", ', '"tools", "reasoning", "telepathy", ', 1)
        .replace('"reasoning", "json_schema"', '"json_schema"')
    )
    monkeypatch.setenv("VLLM_API_KEY", "k")
    assert main(["check", str(bad)]) == 2
    err = capsys.readouterr().err.replace(str(tmp_path) + "/", "")
    documented = (REPO / "docs" / "configuration.md").read_text()
    for line in err.strip().splitlines():
        assert line in documented, line


def cloud(kind: str, **keys: str) -> str:
    lines = "".join(f"{k} = {v}\n" for k, v in keys.items())
    return f"""
[aliases.a]
[[aliases.a.providers]]
name = "p"
type = "{kind}"
model = "m"
{lines}"""


@pytest.mark.parametrize(
    ("kind", "keys", "endpoint"),
    [
        ("openai", {"api_key_env": '"K"'}, "https://api.openai.com/v1"),
        ("anthropic", {"api_key_env": '"K"'}, "https://api.anthropic.com"),
        ("gemini", {"api_key_env": '"K"'}, "https://generativelanguage.googleapis.com"),
        (
            "vertex",
            {"api_key_env": '"K"', "project": '"pr"', "location": '"europe-west4"'},
            "https://europe-west4-aiplatform.googleapis.com",
        ),
        (
            "vertex",
            {"api_key_env": '"K"', "project": '"pr"', "location": '"global"'},
            "https://aiplatform.googleapis.com",
        ),
        ("anthropic", {"api_key_env": '"K"', "base_url": '"http://sim:1/"'}, "http://sim:1"),
    ],
)
def test_cloud_types_default_to_the_vendors_endpoint(
    kind: str, keys: dict[str, str], endpoint: str
) -> None:
    config = parse_config(cloud(kind, **keys), environ={"K": "secret-value"})
    [provider] = config.aliases["a"].providers
    assert provider.endpoint == endpoint
    assert "secret-value" not in repr(config)


@pytest.mark.parametrize(
    ("kind", "keys", "expected"),
    [
        ("openai", {}, "aliases.a.providers[0]: type 'openai' needs a credential"),
        ("openai_compatible", {}, "aliases.a.providers[0].base_url: required"),
        ("vertex", {"api_key_env": '"K"'}, "aliases.a.providers[0].project: required"),
        ("gemini", {"api_key_env": '"K"', "project": '"x"'}, "project: only for type 'vertex'"),
        (
            "anthropic",
            {"api_key_env": '"K"', "api_key_file": '"/k"'},
            "give one of api_key_env, api_key_file, not several",
        ),
        ("anthropic", {"credentials_file": '"/x"'}, "credentials_file: only for type 'vertex'"),
        ("anthropic", {"api_key_file": '"/no/such/file"'}, "api_key_file: cannot read"),
        ("mistral", {}, "unknown provider type 'mistral'"),
        (
            "vertex",
            {"api_key_env": '"K"', "project": '"p"', "location": '"EU West"'},
            "location: expected a region name",
        ),
        (
            "openai",
            {"api_key_env": '"K"', "model_family": '"gpt-5.3"'},
            "model_family: unknown openai family 'gpt-5.3' (known: gpt-4.1, gpt-4o, gpt-5,",
        ),
        (
            "gemini",
            {"api_key_env": '"K"', "model_family": '"gpt-5"'},
            "model_family: unknown gemini family 'gpt-5'",
        ),
        (
            "openai_compatible",
            {"base_url": '"http://v/v1"', "model_family": '"gpt-5"'},
            "model_family: only for the cloud vendors' types",
        ),
        (
            "openai",
            {"api_key_env": '"K"', "reasoning_off": '"minimal"'},
            "unknown reasoning_off 'minimal' (known: refuse, lowest)",
        ),
    ],
)
def test_cloud_type_mistakes_are_named(kind: str, keys: dict[str, str], expected: str) -> None:
    found = problems(cloud(kind, **keys), environ={"K": "k"})
    assert any(expected in p for p in found), found


def test_a_model_family_and_reasoning_off_are_read() -> None:
    keys = {"api_key_env": '"K"', "model_family": '"gpt-5.1"', "reasoning_off": '"lowest"'}
    [provider] = parse_config(cloud("openai", **keys), environ={"K": "k"}).aliases["a"].providers
    assert (provider.model_family, provider.reasoning_off) == ("gpt-5.1", "lowest")


def test_messages_without_thinking_is_read_and_checked() -> None:
    alias = GOOD.replace("[aliases.agent-lite]\n", "[aliases.agent-lite]\n{line}", 1)
    assert "{line}" in alias
    config = parse_config(alias.format(line=""), environ={"VLLM_API_KEY": "k"})
    assert config.aliases["agent-lite"].messages_without_thinking == "model_default"
    off = parse_config(
        alias.format(line='messages_without_thinking = "off"\n'), environ={"VLLM_API_KEY": "k"}
    )
    assert off.aliases["agent-lite"].messages_without_thinking == "off"
    assert problems(alias.format(line="messages_without_thinking = false\n")) == [
        "aliases.agent-lite.messages_without_thinking: unknown messages_without_thinking False"
        " (known: model_default, off)"
    ]


def test_a_service_account_file_is_checked_without_quoting_it(tmp_path: Path) -> None:
    bad = tmp_path / "sa.json"
    bad.write_text('{"private_key": "-----BEGIN PRIVATE KEY-----TOPSECRET"}')
    keys = {"credentials_file": f'"{bad}"', "project": '"p"', "location": '"us-central1"'}
    [problem] = problems(cloud("vertex", **keys), environ={})
    assert "not a service-account JSON file (no client_email)" in problem
    assert "TOPSECRET" not in problem


def test_the_documented_cloud_deployment_parses(tmp_path: Path) -> None:
    [example] = [e for e in documented_examples() if 'type = "vertex"' in e]
    account = tmp_path / "vertex-sa.json"
    account.write_text('{"client_email": "gw@p.iam.gserviceaccount.com", "private_key": "x"}')
    example = example.replace("/etc/trio-gateway/vertex-sa.json", str(account))
    config = parse_config(example, environ={"VLLM_API_KEY": "k"})
    providers = config.providers()
    assert [p.type for p in providers.values()] == ["openai_compatible", "vertex"]
    vllm, cloud = providers.values()
    assert Capability.VISION not in vllm.capabilities
    assert Capability.VISION in cloud.capabilities
    assert (vllm.weight, cloud.weight) == (100, 0)
