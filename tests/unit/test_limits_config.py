"""[redis], [limits], [usage] sink and the provider prices: read strictly, every problem named."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_config import GOOD, problems
from trio_gateway.accounting.ledger import ledger_path
from trio_gateway.config.load import parse_config
from trio_gateway.config.schema import GatewayConfig
from trio_gateway.redis.url import RedisAddress, parse_redis_url


def parse(text: str) -> GatewayConfig:
    return parse_config(text, source="gw.toml", environ={"VLLM_API_KEY": "k"})


def test_defaults_run_in_process() -> None:
    config = parse(GOOD)
    assert config.redis is None and config.usage.sink == "sqlite"
    assert config.limits.hold_ttl_s == 900.0
    provider = config.providers()["vllm-a"]
    assert provider.price_input_per_mtok == provider.price_output_per_mtok == 0.0


def test_redis_and_prices_parse() -> None:
    text = GOOD.replace("weight = 100", "weight = 100\nprice_input_per_mtok = 0.5\n") + (
        '[redis]\nurl = "redis://10.0.0.9:6380/2"\ntimeout_s = 0.1\non_error = "fail_closed"\n'
        '[usage]\nsink = "redis_stream"\nstream_maxlen = 100\n[limits]\nhold_ttl_s = 60\n'
    )
    config = parse(text)
    assert config.redis is not None and config.redis.on_error == "fail_closed"
    assert config.providers()["vllm-a"].price_input_per_mtok == 0.5
    assert config.usage.sink == "redis_stream" and ledger_path(config) is None


def test_every_problem_is_named() -> None:
    text = GOOD.replace("weight = 100", "weight = 100\nprice_output_per_mtok = -1.0\n") + (
        '[redis]\nurl = "http://x"\ntimeout_s = 0\non_error = "fail_sideways"\n'
        "[limits]\nhold_ttl_s = 0\n"
    )
    found = problems(text)
    assert any("redis.on_error: unknown policy 'fail_sideways'" in p for p in found), found
    text = text.replace('on_error = "fail_sideways"', 'on_error = "fail_open"')
    found = problems(text)
    assert "providers.vllm-a.price_output_per_mtok: must be at least 0" in found
    assert "redis.url: expected redis://HOST:PORT/DB or rediss://HOST:PORT/DB (TLS)" in found
    assert "redis.timeout_s: must be greater than 0" in found
    assert "limits.hold_ttl_s: must be greater than 0" in found


def test_a_redis_stream_needs_redis() -> None:
    assert problems(GOOD + '[usage]\nsink = "redis_stream"\n') == [
        'usage.sink: "redis_stream" needs a [redis] table'
    ]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://10.0.0.9:6380/2", RedisAddress(host="10.0.0.9", port=6380, db=2)),
        ("redis://cache", RedisAddress(host="cache", port=6379, db=0)),
        (
            "redis://billing:p%40ss@cache:6379/1",
            RedisAddress(host="cache", port=6379, db=1, username="billing", password="p@ss"),
        ),
        ("redis://:secret@cache/3", RedisAddress(host="cache", port=6379, db=3, password="secret")),
        # TLS (a managed Redis): the same parts, and the server's certificate checked.
        (
            "rediss://:secret@cache:6380",
            RedisAddress(host="cache", port=6380, db=0, password="secret", tls=True),
        ),
    ],
)
def test_redis_urls(url: str, expected: RedisAddress) -> None:
    address = parse_redis_url(url)
    assert address == expected
    # Logged as this: the password never appears.
    assert "secret" not in address.display() and "p@ss" not in address.display()
    assert "secret" not in repr(address)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://cache", "expected redis://HOST:PORT/DB or rediss://HOST:PORT/DB (TLS)"),
        ("redis:///0", "expected redis://HOST:PORT/DB"),
        ("redis://cache/zero", "database 'zero' is not a number"),
        ("redis://cache:99999/0", "port: "),
    ],
)
def test_bad_redis_urls_are_named(url: str, message: str) -> None:
    text = GOOD + f'[redis]\nurl = "{url}"\n'
    assert any(p.startswith(f"redis.url: {message}") for p in problems(text)), problems(text)


def test_a_redis_ca_file_must_be_read_and_needs_tls(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-ca.pem"
    bad.write_text("hello")
    text = GOOD + f'[redis]\nurl = "rediss://cache"\nca_file = "{bad}"\n'
    assert any(p.startswith(f"redis.ca_file: {bad} holds no PEM") for p in problems(text))
    text = GOOD + f'[redis]\nurl = "redis://cache"\nca_file = "{bad}"\n'
    assert problems(text) == ["redis.ca_file: only for a rediss:// url (TLS)"]


@pytest.mark.parametrize(
    ("prefix", "ok"),
    [("tgw:", True), ("{tgw}:", True), ("a}b:", True), ("t{:", False), ("t{}:", False)],
)
def test_a_key_prefix_keeps_each_script_s_keys_in_one_slot(prefix: str, ok: bool) -> None:
    text = GOOD + f'[redis]\nurl = "redis://cache"\nkey_prefix = "{prefix}"\n'
    if ok:
        assert parse_config(text, environ={"VLLM_API_KEY": "k"}).redis is not None
    else:
        found = [p for p in problems(text) if p.startswith("redis.key_prefix")]
        assert found and "hash tag" in found[0], found


def test_a_redis_cluster_has_only_database_0() -> None:
    text = GOOD + '[redis]\nurl = "redis://node1:6379/2"\ncluster = true\n'
    assert "redis.url: a Redis Cluster has only database 0" in problems(text)
