"""Config loading beyond one key's value: the files a config names (read from its directory),
a provider named by several aliases (defined once), what is not the file's to say, and the
suggestion for a misspelt key."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from trio_gateway.config import schema
from trio_gateway.config.load import load_config, parse_config
from trio_gateway.config.schema import PROVIDER_PATH_KEYS, ConfigError, GatewayConfig

PROVIDER = """
[[aliases.a.providers]]
name = "v"
type = "openai_compatible"
base_url = "http://127.0.0.1:9/v1"
model = "m"
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="gw.toml", environ={})
    return info.value.problems


def test_every_file_path_key_of_the_schema_is_read_from_the_config_s_directory(
    tmp_path: Path,
) -> None:
    # A key added to the schema that names a file must be resolved too (load.resolve_paths).
    file_keys = {
        f"{cls.__name__}.{field.name}"
        for cls in vars(schema).values()
        if isinstance(cls, type) and attrs.has(cls)
        for field in attrs.fields(cls)
        if field.name.endswith("_file") or field.name in ("ledger", "path")
    }
    resolved = {"AuthConfig.keys_file", "UsageConfig.ledger", "RedisConfig.ca_file"} | {
        f"ProviderConfig.{key}" for key in PROVIDER_PATH_KEYS
    }
    assert file_keys == resolved
    folder = tmp_path / "etc"
    folder.mkdir()
    (folder / "keys.toml").write_text("")
    (folder / "key.txt").write_text("k")
    config = folder / "gateway.toml"
    config.write_text(
        '[auth]\nkeys_file = "keys.toml"\n[usage]\nledger = "u.db"\n'
        + PROVIDER
        + 'api_key_file = "key.txt"\n'
        + '[[aliases.a.providers]]\nname = "g"\ntype = "vertex"\nproject = "p"\n'
        'location = "global"\nmodel = "m"\ncredentials_file = "/abs/sa.json"\nprobe = false\n'
    )
    with pytest.raises(ConfigError) as info:
        load_config(config)
    # Absolute paths are kept; the vertex file is missing, and said with its full path.
    assert info.value.problems == [
        "aliases.a.providers[1].credentials_file: cannot read /abs/sa.json: No such file or "
        "directory"
    ]
    config.write_text(config.read_text().split('[[aliases.a.providers]]\nname = "g"')[0])
    loaded = load_config(config)
    assert (loaded.auth.keys_file, loaded.usage.ledger) == (
        str(folder / "keys.toml"),
        str(folder / "u.db"),
    )
    assert loaded.providers()["v"].api_key_file == str(folder / "key.txt")


def test_a_config_from_text_keeps_its_paths_as_written() -> None:
    config = parse_config('[usage]\nledger = "none"\n' + PROVIDER)
    assert config.usage.ledger == "none"


def test_an_alias_may_name_a_provider_another_alias_defines() -> None:
    config = parse_config(
        PROVIDER + 'max_inflight = 3\n[aliases.b]\nproviders = ["v"]\non_saturated = "queue"\n'
    )
    assert config.aliases["b"].providers == config.aliases["a"].providers
    assert config.aliases["b"].on_saturated == "queue"
    assert list(config.providers()) == ["v"]


def test_a_named_provider_s_problems_are_said_once_at_its_definition() -> None:
    found = problems(PROVIDER + 'max_inflight = "3"\n[aliases.b]\nproviders = ["v", "w"]\n')
    assert found == [
        "aliases.b.providers[1]: no alias defines a provider named 'w' (defined: v)",
        "aliases.a.providers[0].max_inflight: expected an integer, got '3'",
    ]
    found = problems(PROVIDER + 'max_inflight = 0\n[aliases.b]\nproviders = ["v"]\n')
    assert found == ["aliases.a.providers[0].max_inflight: must be at least 1"]


def test_two_different_definitions_say_how_to_define_it_once() -> None:
    other = PROVIDER.replace("aliases.a", "aliases.b") + "max_inflight = 16\n"
    [found] = problems(PROVIDER + other)
    assert found == (
        "aliases.b.providers[0].name: provider 'v' is also defined, differently, at "
        "aliases.a.providers[0] (define it once, and name it in the other aliases: "
        'providers = ["v"])'
    )


@pytest.mark.parametrize("key", ["source", "warnings", "listen_origin", "api_keys", "seal_key"])
def test_what_load_fills_in_is_not_the_file_s_to_say(key: str) -> None:
    assert key in {f.name for f in attrs.fields(GatewayConfig)}
    assert problems(f'{key} = "x"\n' + PROVIDER) == [f"(top level): unknown key '{key}'"]


def test_an_unknown_key_gets_the_nearest_known_one() -> None:
    found = problems("[servr]\n" + PROVIDER + "wieght = 3\nzzz = 1\n")
    assert found == [
        "aliases.a.providers[0]: unknown keys 'wieght' (did you mean 'weight'?), 'zzz'",
        "(top level): unknown key 'servr' (did you mean 'server'?)",
    ]
    found = problems(PROVIDER + '[simulators.s]\nlisen = "127.0.0.1:0"\n')
    assert found[-1] == "simulators.s: unknown key 'lisen' (did you mean 'listen'?)"


def test_a_provider_s_ca_file_is_read_from_the_config_s_directory_and_checked(
    tmp_path: Path,
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(PROVIDER + 'ca_file = "corp-ca.pem"\n')
    with pytest.raises(ConfigError) as info:
        load_config(config)
    assert info.value.problems == [
        f"aliases.a.providers[0].ca_file: cannot read {tmp_path / 'corp-ca.pem'}: No such file "
        "or directory"
    ]
    (tmp_path / "corp-ca.pem").write_text("not a certificate")
    with pytest.raises(ConfigError) as info:
        load_config(config)
    assert info.value.problems[0].startswith(
        f"aliases.a.providers[0].ca_file: {tmp_path / 'corp-ca.pem'} holds no PEM certificate"
    )
