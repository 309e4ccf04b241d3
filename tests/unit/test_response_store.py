"""The stores of the Responses front (``accounting/response_*.py``), memory and SQLite on a
clock the test moves (Redis: ``tests/e2e/test_response_store_redis.py``): a record per turn,
owners apart, the TTL from a record's last use, the per-key quota and the memory bound (oldest
use first out), the chain walk and its bounds, item lookup, a chain across two stores (a
WebSocket's own in front of the shared one), and a file of the first layout migrated."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from cryptography.fernet import Fernet
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_gateway.accounting.response_memory import MemoryResponseStore
from trio_gateway.accounting.response_records import (
    ChainBounds,
    Record,
    ResponseStore,
    Stored,
    conversation,
    dumps,
    find_items,
    item_response_id,
)
from trio_gateway.accounting.response_sqlite import SCHEMA_VERSION, SQLiteResponseStore
from trio_gateway.accounting.response_store import RESPONSES_FILE, open_response_store
from trio_gateway.config.load import parse_config
from trio_gateway.config.schema import ConfigError
from trio_gateway.core.errors import ConversationTooLong, ResponseNotFound

PROVIDER = (
    '[[aliases.a.providers]]\nname = "p"\ntype = "openai_compatible"\n'
    'base_url = "http://x/v1"\nmodel = "m"\n'
)
WIDE = ChainBounds(max_turns=1000, max_bytes=10**9)
TTL_S = 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def rid(n: int) -> str:
    return f"resp_{n:032x}"


def turn(n: int, previous: int | None = None, text: str = "x") -> Stored:
    """Response ``n``: one user message in, one message out (``msg_<its hex>_0``)."""
    output = [
        {
            "id": f"msg_{n:032x}_0",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": f"answer {n}"}],
        }
    ]
    record = Record(
        id=rid(n),
        previous=rid(previous) if previous is not None else None,
        response={"id": rid(n), "object": "response", "output": output},
        input=[{"type": "message", "role": "user", "content": text}],
    )
    return Stored.of(record)


@asynccontextmanager
async def a_store(
    kind: str, tmp_path: Path, clock: Clock, quota: int = 10**9
) -> AsyncIterator[ResponseStore]:
    if kind == "memory":
        yield MemoryResponseStore(ttl_s=TTL_S, max_bytes=10**9, key_quota_bytes=quota, clock=clock)
        return
    store = SQLiteResponseStore(
        str(tmp_path / "r.sqlite3"), ttl_s=TTL_S, key_quota_bytes=quota, clock=clock
    )
    try:
        yield store
    finally:
        await store.aclose()


KINDS = ["memory", "sqlite"]


@pytest.mark.parametrize("kind", KINDS)
async def test_owners_ttl_and_delete(tmp_path: Path, kind: str) -> None:
    clock = Clock()
    async with a_store(kind, tmp_path, clock) as store:
        await store.put("alice", turn(1))
        got = await store.get("alice", rid(1))
        assert got is not None and got.response["id"] == rid(1) and got.previous is None
        assert got.items()[0]["content"] == "x"
        assert await store.get("bob", rid(1)) is None
        assert (await store.chain("bob", rid(1), WIDE)).records == ()
        assert not await store.delete("bob", rid(1))
        assert await find_items([store], "bob", ["msg_" + f"{1:032x}_0"], WIDE) == {}
        clock.now += TTL_S - 1
        assert await store.get("alice", rid(1)) is not None
        clock.now += 1
        assert await store.get("alice", rid(1)) is None
        assert not await store.delete("alice", rid(1))
        await store.put("alice", turn(2))
        assert await store.delete("alice", rid(2))
        assert await store.get("alice", rid(2)) is None


@pytest.mark.parametrize("kind", KINDS)
async def test_a_chain_is_walked_back_and_each_read_starts_its_ttl_over(
    tmp_path: Path, kind: str
) -> None:
    clock = Clock()
    async with a_store(kind, tmp_path, clock) as store:
        await store.put("", turn(1))
        clock.now += 30
        await store.put("", turn(2, 1))
        clock.now += 20
        await store.put("", turn(3, 2))
        walked = await conversation([store], "", rid(3), WIDE)
        assert [r.id for r in walked] == [rid(1), rid(2), rid(3)]
        # Past the first turn's own TTL: the walk at 50 s started it over.
        clock.now += 50
        assert [r.id for r in await conversation([store], "", rid(3), WIDE)] == [
            rid(1),
            rid(2),
            rid(3),
        ]
        part = await store.chain("", rid(2), WIDE)
        assert [r.id for r in part.records] == [rid(2), rid(1)] and part.next is None
        assert part.size == turn(1).size + turn(2, 1).size


@pytest.mark.parametrize("kind", KINDS)
async def test_a_walk_past_its_bounds_is_refused_not_cut(tmp_path: Path, kind: str) -> None:
    async with a_store(kind, tmp_path, Clock()) as store:
        for n in range(1, 6):
            await store.put("", turn(n, n - 1 if n > 1 else None))
        assert len(await conversation([store], "", rid(5), WIDE)) == 5
        size = sum(turn(n, n - 1 if n > 1 else None).size for n in range(1, 6))
        for bounds in (
            ChainBounds(max_turns=4, max_bytes=10**9),
            ChainBounds(max_turns=1000, max_bytes=size - 1),
        ):
            with pytest.raises(ConversationTooLong) as refused:
                await conversation([store], "", rid(5), bounds)
            assert refused.value.param == "previous_response_id"
        exact = ChainBounds(max_turns=5, max_bytes=size)
        assert len(await conversation([store], "", rid(5), exact)) == 5


@pytest.mark.parametrize("kind", KINDS)
async def test_a_missing_turn_or_response_is_not_found(tmp_path: Path, kind: str) -> None:
    async with a_store(kind, tmp_path, Clock()) as store:
        await store.put("", turn(1))
        await store.put("", turn(2, 1))
        await store.delete("", rid(1))
        with pytest.raises(ResponseNotFound) as broken:
            await conversation([store], "", rid(2), WIDE)
        assert rid(1) in broken.value.message and "no longer stored" in broken.value.message
        with pytest.raises(ResponseNotFound) as unknown:
            await conversation([store], "", rid(9), WIDE)
        assert unknown.value.message == f"Previous response with id '{rid(9)}' not found."


@pytest.mark.parametrize("kind", KINDS)
async def test_a_key_s_quota_drops_its_oldest_use_first(tmp_path: Path, kind: str) -> None:
    clock = Clock()
    size = turn(1).size
    async with a_store(kind, tmp_path, clock, quota=3 * size) as store:
        await store.put("bob", turn(100))
        for n in range(1, 4):
            clock.now += 1
            await store.put("alice", turn(n))
        clock.now += 1
        await store.chain("alice", rid(1), WIDE)  # used again: now the newest use
        clock.now += 1
        await store.put("alice", turn(4))
        present = [n for n in range(1, 5) if await store.get("alice", rid(n)) is not None]
        assert present == [1, 3, 4]
        assert await store.get("bob", rid(100)) is not None  # another key's quota
        if isinstance(store, SQLiteResponseStore):
            assert await store.owner_bytes("alice") == 3 * size
        else:
            assert isinstance(store, MemoryResponseStore)
            assert store.owner_bytes("alice") == 3 * size


async def test_memory_is_bounded_in_bytes_and_count_for_every_owner() -> None:
    size = turn(1).size
    by_bytes = MemoryResponseStore(ttl_s=TTL_S, max_bytes=3 * size, key_quota_bytes=10**9)
    by_count = MemoryResponseStore(
        ttl_s=TTL_S, max_bytes=10**9, key_quota_bytes=10**9, max_responses=2
    )
    for store in (by_bytes, by_count):
        for n in range(1, 6):
            await store.put(f"key{n % 2}", turn(n))
    assert [n for n in range(1, 6) if await by_bytes.get(f"key{n % 2}", rid(n))] == [3, 4, 5]
    assert by_bytes.bytes == 3 * size and len(by_bytes) == 3
    assert [n for n in range(1, 6) if await by_count.get(f"key{n % 2}", rid(n))] == [4, 5]


async def test_a_stored_record_is_a_copy() -> None:
    store = MemoryResponseStore(ttl_s=TTL_S, max_bytes=10**9, key_quota_bytes=10**9)
    record = Record(id="r", previous=None, response={"output": []}, input=[{"n": 1}])
    await store.put("", Stored.of(record))
    record.input[0]["n"] = 2
    got = await store.get("", "r")
    assert got is not None and got.input == [{"n": 1}]


async def test_a_chain_runs_across_a_socket_s_store_and_the_shared_one(tmp_path: Path) -> None:
    """Issue 41's shape: a WebSocket's recent responses (a small memory store) in front of the
    shared store; a chain whose turns are some in each is read whole, in order."""
    clock = Clock()
    async with a_store("sqlite", tmp_path, clock) as shared:
        socket = MemoryResponseStore(ttl_s=TTL_S, max_bytes=64 * 1024, key_quota_bytes=64 * 1024)
        await shared.put("", turn(1))
        await socket.put("", turn(2, 1))  # store: false, kept by the socket only
        await shared.put("", turn(3, 2))
        await socket.put("", turn(4, 3))
        walked = await conversation([socket, shared], "", rid(4), WIDE)
        assert [r.id for r in walked] == [rid(n) for n in range(1, 5)]
        with pytest.raises(ResponseNotFound):
            await conversation([shared], "", rid(3), WIDE)  # the socket's turn is missing
        with pytest.raises(ConversationTooLong):
            await conversation(
                [socket, shared], "", rid(4), ChainBounds(max_turns=3, max_bytes=10**9)
            )
        found = await find_items([socket, shared], "", [f"msg_{2:032x}_0", f"msg_{3:032x}_0"], WIDE)
        assert [item["content"][0]["text"] for item in found.values()] == ["answer 2", "answer 3"]


def test_an_item_s_response_is_read_off_its_id() -> None:
    base = "0123456789abcdef" * 2
    assert item_response_id(f"rs_{base}_0") == f"resp_{base}"
    assert item_response_id(f"msg_{base}_12") == f"resp_{base}"
    assert item_response_id(f"fc_{base}_3") == f"resp_{base}"
    for other in ("rs_abc_0", f"ws_{base}_0", f"rs_{base}", f"rs_{base.upper()}_0", "nope"):
        assert item_response_id(other) is None


async def test_items_past_their_bounds_are_refused(tmp_path: Path) -> None:
    store = MemoryResponseStore(ttl_s=TTL_S, max_bytes=10**9, key_quota_bytes=10**9)
    for n in range(1, 4):
        await store.put("", turn(n))
    ids = [f"msg_{n:032x}_0" for n in range(1, 4)]
    assert len(await find_items([store], "", ids, WIDE)) == 3
    for bounds in (
        ChainBounds(max_turns=2, max_bytes=10**9),
        ChainBounds(max_turns=9, max_bytes=200),
    ):
        with pytest.raises(ConversationTooLong) as refused:
            await find_items([store], "", ids, bounds)
        assert refused.value.param == "input"


async def test_a_file_of_the_first_layout_is_migrated_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE responses (owner TEXT NOT NULL, id TEXT NOT NULL, "
        "expires_at REAL NOT NULL, body TEXT NOT NULL, PRIMARY KEY (owner, id))"
    )
    output = [{"id": f"msg_{7:032x}_0", "type": "message", "role": "assistant", "content": []}]
    items: list[Any] = [
        {"type": "message", "role": "user", "content": "one"},
        {"type": "message", "role": "assistant", "content": "a"},
        {"type": "message", "role": "user", "content": "two"},
        *output,
    ]
    old = {"response": {"id": rid(7), "output": output}, "items": items}
    rows = [("alice", rid(7), 5000.0, json.dumps(old)), ("alice", rid(8), 10.0, json.dumps(old))]
    conn.executemany("INSERT INTO responses VALUES (?, ?, ?, ?)", rows)
    conn.commit()
    conn.close()

    store = SQLiteResponseStore(str(path), ttl_s=TTL_S, key_quota_bytes=10**9, clock=Clock())
    walked = await conversation([store], "alice", rid(7), WIDE)
    # Its whole conversation is now its input: read back as it was, continued as any other.
    assert [item["content"] for item in walked[0].items()] == ["one", "a", "two", []]
    assert walked[0].previous is None
    assert await store.get("alice", rid(8)) is None  # expired: not carried over
    await store.put("alice", turn(9, 7))
    assert len(await conversation([store], "alice", rid(9), WIDE)) == 2
    await store.aclose()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "responses" not in tables
    conn.close()


def test_the_store_a_config_gets(tmp_path: Path) -> None:
    ledger = tmp_path / "d" / "u.sqlite3"
    with_file = parse_config(f'[usage]\nledger = "{ledger}"\n' + PROVIDER, source="t.toml")
    store = open_response_store(with_file, str(ledger), None)
    assert isinstance(store, SQLiteResponseStore)
    assert store.path == str(ledger.parent / RESPONSES_FILE)
    plain = parse_config("[responses]\nmemory_max_bytes = 5000000\n" + PROVIDER, source="t.toml")
    assert isinstance(open_response_store(plain, ":memory:", None), MemoryResponseStore)
    assert isinstance(open_response_store(plain, None, None), MemoryResponseStore)
    # Seven days from the last use, unless the config says otherwise.
    assert plain.responses.store_ttl_s == 7 * 24 * 3600


@pytest.mark.parametrize(
    ("toml", "environ", "problem"),
    [
        ('[responses]\nseal_key_env = "SEAL"\n', {}, "environment variable 'SEAL' is not set"),
        ('[responses]\nseal_key_env = "SEAL"\n', {"SEAL": "short"}, "does not hold a Fernet key"),
        ("[responses]\nstore_ttl_s = 0\n", {}, "responses.store_ttl_s: must be greater than 0"),
        ("[responses]\nmemory_max_responses = 0\n", {}, "must be at least 1"),
        ("[responses]\nmax_chain_turns = 0\n", {}, "responses.max_chain_turns: must be at"),
        (
            "[responses]\nmax_record_bytes = 2000\nkey_quota_bytes = 1000\n",
            {},
            "responses.key_quota_bytes: must be at least max_record_bytes (2000)",
        ),
        (
            "[responses]\nmemory_max_bytes = 10\n",
            {},
            "responses.memory_max_bytes: must be at least max_record_bytes",
        ),
    ],
)
def test_responses_config_problems(toml: str, environ: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(toml + PROVIDER, source="t.toml", environ=environ)
    assert any(problem in p for p in refused.value.problems), refused.value.problems


def test_a_seal_key_and_builtin_tools_from_the_config() -> None:
    key = Fernet.generate_key().decode()
    text = '[responses]\nseal_key_env = "SEAL"\n' + PROVIDER
    text = text.replace(
        "[[aliases.a.providers]]", '[aliases.a]\nbuiltin_tools = "refuse"\n[[aliases.a.providers]]'
    )
    config = parse_config(text, source="t.toml", environ={"SEAL": key})
    assert config.seal_key is not None and config.seal_key.value == key
    assert config.aliases["a"].builtin_tools == "refuse"
    with pytest.raises(ConfigError) as refused:
        parse_config(text.replace('"refuse"', '"maybe"'), source="t.toml", environ={"SEAL": key})
    assert "builtin_tools" in str(refused.value.problems)


# One step of a memory store's life: (what, owner, response number, seconds passing).
STEPS = st.lists(
    st.tuples(
        st.sampled_from(["put", "chain", "delete"]),
        st.sampled_from(["alice", "bob", ""]),
        st.integers(1, 12),
        st.sampled_from([0.0, 1.0, 30.0]),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(STEPS, st.integers(1, 8), st.integers(1, 8))
def test_memory_bounds_hold_whatever_happens(
    steps: list[tuple[str, str, int, float]], quota_turns: int, max_turns: int
) -> None:
    """Whatever is put, walked, deleted, or left to expire: the store never holds more than
    its bounds, and its byte counts are what it holds."""
    size = turn(12).size  # the largest
    clock = Clock()
    store = MemoryResponseStore(
        ttl_s=TTL_S,
        max_bytes=max_turns * size,
        key_quota_bytes=quota_turns * size,
        clock=clock,
    )

    async def run() -> None:
        for what, owner, n, passing in steps:
            clock.now += passing
            if what == "put":
                await store.put(owner, turn(n))
            elif what == "chain":
                await store.chain(owner, rid(n), WIDE)
            else:
                await store.delete(owner, rid(n))
            live = {
                (o, r): e.stored.size
                for (o, r), e in store._entries.items()
                if e.expires_at > clock.now
            }
            assert store.bytes == sum(e.stored.size for e in store._entries.values())
            assert store.bytes <= max_turns * size
            for one in ("alice", "bob", ""):
                held = sum(s for (o, _), s in live.items() if o == one)
                assert held <= quota_turns * size
                assert store.owner_bytes(one) == sum(
                    e.stored.size for (o, _), e in store._entries.items() if o == one
                )

    trio.run(run)


async def test_workers_writing_one_file_at_once_keep_its_counts(tmp_path: Path) -> None:
    """Two stores on one file (two worker processes' worth), 40 chained conversations written
    and walked at once under a quota: each owner's count is what its records hold, and every
    chain the quota left whole reads back."""
    path = str(tmp_path / RESPONSES_FILE)
    size = turn(1, 0).size
    stores = [SQLiteResponseStore(path, ttl_s=TTL_S, key_quota_bytes=60 * size) for _ in range(2)]

    async def conversation_of(k: int) -> None:
        store = stores[k % 2]
        owner = f"key{k % 4}"
        previous = None
        for step in range(5):
            n = k * 100 + step
            await store.put(owner, turn(n, previous))
            previous = n
            # Its start may have gone to the quota: other conversations' turns came after.
            with contextlib.suppress(ResponseNotFound):
                await conversation([store], owner, rid(n), WIDE)

    async with trio.open_nursery() as nursery:
        for k in range(40):
            nursery.start_soon(conversation_of, k)
    conn = sqlite3.connect(path)
    held = dict(conn.execute("SELECT owner, bytes FROM response_owners").fetchall())
    actual = dict(
        conn.execute("SELECT owner, SUM(bytes) FROM response_records GROUP BY owner").fetchall()
    )
    conn.close()
    assert held == actual and len(actual) == 4
    assert all(total <= 60 * size for total in actual.values())
    for store in stores:
        await store.aclose()


def test_a_record_s_size_is_its_input_s_and_its_response_s() -> None:
    """What the front measures before a stream's last event (the turn without its response,
    then the response alone) is the stored record's size, to the byte."""
    response: dict[str, Any] = {"id": "r", "output": [{"type": "message", "text": "é" * 10}]}
    record = Record(id="r", previous="p", response=response, input=[{"content": "ü" * 7}])
    without = Stored.of(attrs.evolve(record, response={})).size - len(dumps({}))
    assert Stored.of(record).size == without + len(dumps(response).encode())
