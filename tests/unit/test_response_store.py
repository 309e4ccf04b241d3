"""``accounting/response_store.py``: the memory and SQLite stores, their TTL, owners and
bounds, on a clock the test moves; which store a config gets."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from trio_gateway.accounting.response_store import (
    RESPONSES_FILE,
    MemoryResponseStore,
    ResponseStore,
    SQLiteResponseStore,
    open_response_store,
)
from trio_gateway.config.load import parse_config
from trio_gateway.config.schema import ConfigError

PROVIDER = (
    '[[aliases.a.providers]]\nname = "p"\ntype = "openai_compatible"\n'
    'base_url = "http://x/v1"\nmodel = "m"\n'
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stores(tmp_path: Path, clock: Clock) -> list[ResponseStore]:
    return [
        MemoryResponseStore(60.0, 100, clock),
        SQLiteResponseStore(str(tmp_path / "r.sqlite3"), 60.0, clock),
    ]


@pytest.mark.parametrize("kind", [0, 1], ids=["memory", "sqlite"])
async def test_owner_ttl_and_delete(tmp_path: Path, kind: int) -> None:
    clock = Clock()
    store = stores(tmp_path, clock)[kind]
    await store.put("alice", "r1", {"response": {"id": "r1"}, "items": []})
    assert await store.get("alice", "r1") == {"response": {"id": "r1"}, "items": []}
    assert await store.get("bob", "r1") is None
    assert not await store.delete("bob", "r1")
    clock.now += 59.0
    assert await store.get("alice", "r1") is not None
    clock.now += 1.0
    assert await store.get("alice", "r1") is None
    assert not await store.delete("alice", "r1")
    await store.put("alice", "r2", {"n": 2})
    assert await store.delete("alice", "r2")
    assert await store.get("alice", "r2") is None
    if isinstance(store, SQLiteResponseStore):
        await store.aclose()


async def test_a_stored_record_is_a_copy() -> None:
    store = MemoryResponseStore(60.0, 10)
    record: dict[str, object] = {"items": [1]}
    await store.put("", "r", record)
    record["items"] = [2]
    assert await store.get("", "r") == {"items": [1]}


async def test_memory_keeps_the_newest() -> None:
    store = MemoryResponseStore(60.0, 3)
    for i in range(5):
        await store.put("", f"r{i}", {"i": i})
    assert [await store.get("", f"r{i}") for i in range(5)] == [
        None,
        None,
        {"i": 2},
        {"i": 3},
        {"i": 4},
    ]


def test_the_store_a_config_gets(tmp_path: Path) -> None:
    provider = PROVIDER
    ledger = tmp_path / "d" / "u.sqlite3"
    with_file = parse_config(f'[usage]\nledger = "{ledger}"\n' + provider, source="t.toml")
    store = open_response_store(with_file, str(ledger), None)
    assert isinstance(store, SQLiteResponseStore)
    assert store.path == str(ledger.parent / RESPONSES_FILE)
    plain = parse_config("[responses]\nmemory_max_responses = 5\n" + provider, source="t.toml")
    assert isinstance(open_response_store(plain, ":memory:", None), MemoryResponseStore)
    assert isinstance(open_response_store(plain, None, None), MemoryResponseStore)


@pytest.mark.parametrize(
    ("toml", "environ", "problem"),
    [
        ('[responses]\nseal_key_env = "SEAL"\n', {}, "environment variable 'SEAL' is not set"),
        ('[responses]\nseal_key_env = "SEAL"\n', {"SEAL": "short"}, "does not hold a Fernet key"),
        ("[responses]\nstore_ttl_s = 0\n", {}, "responses.store_ttl_s: must be greater than 0"),
        ("[responses]\nmemory_max_responses = 0\n", {}, "must be at least 1"),
    ],
)
def test_responses_config_problems(toml: str, environ: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(toml + PROVIDER, source="t.toml", environ=environ)
    assert any(problem in p for p in refused.value.problems), refused.value.problems


def test_a_seal_key_and_builtin_tools_from_the_config() -> None:
    key = Fernet.generate_key().decode()
    text = '[responses]\nseal_key_env = "SEAL"\n' + PROVIDER + 'builtin_tools = "refuse"\n'
    text = text.replace(
        "[[aliases.a.providers]]", '[aliases.a]\nbuiltin_tools = "refuse"\n[[aliases.a.providers]]'
    )
    text = text.removesuffix('builtin_tools = "refuse"\n')
    config = parse_config(text, source="t.toml", environ={"SEAL": key})
    assert config.seal_key is not None and config.seal_key.value == key
    assert config.aliases["a"].builtin_tools == "refuse"
    with pytest.raises(ConfigError) as refused:
        parse_config(text.replace('"refuse"', '"maybe"'), source="t.toml", environ={"SEAL": key})
    assert "builtin_tools" in str(refused.value.problems)
