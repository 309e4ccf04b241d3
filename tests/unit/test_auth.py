"""The keys file, the key ring, its reload, and where the fronts find a key."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from pathlib import Path

import pytest

from trio_gateway.accounting.key_store import KeyStore
from trio_gateway.config.checks import is_loopback
from trio_gateway.config.load import parse_config
from trio_gateway.config.schema import ConfigError
from trio_gateway.core import keys as key_file
from trio_gateway.core.errors import Forbidden, InvalidRequest, Unauthorized
from trio_gateway.core.keys import (
    KEY_PREFIX,
    KeyRing,
    KeysFileError,
    bearer_token,
    hash_key,
    new_key,
    parse_keys,
)
from trio_gateway.core.request import validate_chat_body
from trio_gateway.fronts.auth import authorize, http_key, websocket_handshake

ALICE = "tgw-alice-secret"
BOB = "tgw-bob-secret"


def entry(name: str, key: str, extra: str = "") -> str:
    return f'[keys.{name}]\nsha256 = "{hash_key(key)}"\n{extra}\n'


def problems(text: str, **kwargs: object) -> list[str]:
    with pytest.raises(KeysFileError) as caught:
        parse_keys(text, source="keys.toml", **kwargs)  # type: ignore[arg-type]
    return caught.value.problems


def test_a_full_entry_parses() -> None:
    ring = parse_keys(
        entry("alice", ALICE, 'aliases = ["agent-lite", "prompt-enhance"]\nrpm = 60\ntpm = 1000\n')
        + "budget = 2\n"
        + entry("bob", BOB)
    )
    alice = ring.lookup(ALICE)
    assert alice is not None
    assert (alice.name, alice.aliases, alice.rpm, alice.tpm) == (
        "alice",
        ("agent-lite", "prompt-enhance"),
        60,
        1000,
    )
    assert alice.budget == 2.0 and type(alice.budget) is float
    bob = ring.lookup(BOB)
    assert bob is not None and bob.aliases == () and bob.rpm is None and bob.budget is None
    assert len(ring) == 2


def test_an_empty_file_is_an_empty_ring() -> None:
    ring = parse_keys("")
    assert len(ring) == 0 and ring.lookup(ALICE) is None


def test_every_problem_is_reported_with_its_path() -> None:
    text = (
        "owner = 'me'\n"
        "[keys.alice]\n"
        'sha256 = "ABC"\n'
        'aliases = "agent-lite"\n'
        'rpm = "60"\n'
        "tpm = 0\n"
        "budget = true\n"
        "colour = 1\n"
        "[keys.bob]\n"
        'aliases = ["agent-lite", 3, "agent-lite", "nope"]\n'
        "budget = -1.5\n"
        "rpm = 1.0\n"
        "[keys.'bad name']\n"
        f'sha256 = "{hash_key(BOB)}"\n'
    )
    assert problems(text, known_aliases={"agent-lite"}) == [
        "(top level): unknown key 'owner'",
        "keys.alice: unknown key 'colour'",
        "keys.alice.sha256: expected 64 lowercase hex digits (a SHA-256)",
        "keys.alice.aliases: expected a list of strings, got 'agent-lite'",
        "keys.alice.rpm: expected an integer, got '60'",
        "keys.alice.tpm: must be at least 1",
        "keys.alice.budget: expected a number, got True",
        "keys.bob.sha256: required field missing",
        "keys.bob.aliases[1]: expected a string, got 3",
        "keys.bob.aliases[2]: 'agent-lite' is listed twice",
        "keys.bob.aliases[3]: unknown alias 'nope' (known: agent-lite)",
        "keys.bob.rpm: expected an integer, got 1.0",
        "keys.bob.budget: must be a finite number, 0 or more",
        "keys.bad name: a key's name is 1 to 64 of A-Z a-z 0-9 _ -",
    ]


def test_structural_problems() -> None:
    assert problems("keys = 3\n") == ["keys: expected a table, got 3"]
    assert problems("[keys]\nalice = 3\n") == ["keys.alice: expected a table, got 3"]
    assert problems("[keys\n")[0].startswith("not valid TOML: ")
    twice = entry("alice", ALICE) + entry("alias", ALICE)
    assert problems(twice) == ["keys.alias.sha256: the same key as keys.alice"]


def test_a_problem_never_quotes_a_key_pasted_as_the_hash() -> None:
    text = f'[keys.alice]\nsha256 = "{ALICE}"\n'
    assert not any(ALICE in p for p in problems(text))


def test_unknown_aliases_are_only_checked_when_known_ones_are_given() -> None:
    text = entry("alice", ALICE, 'aliases = ["nope"]')
    assert parse_keys(text).lookup(ALICE) is not None
    assert problems(text, known_aliases=["agent-lite"]) == [
        "keys.alice.aliases[0]: unknown alias 'nope' (known: agent-lite)"
    ]


def test_keys_are_random_prefixed_and_hashed_as_sha256() -> None:
    key = new_key()
    assert key.startswith(KEY_PREFIX) and len(key) == len(KEY_PREFIX) + 43
    assert key != new_key()
    assert hash_key(key) == hashlib.sha256(key.encode()).hexdigest()


def test_lookup_compares_every_stored_digest_in_constant_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ring = parse_keys(entry("alice", ALICE) + entry("bob", BOB) + entry("carol", "tgw-carol"))
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)
    found = ring.lookup(ALICE)
    assert found is not None and found.name == "alice"
    presented = hashlib.sha256(ALICE.encode()).digest()
    # Not the key itself: its digest, against all three, though the first one matched.
    assert [b for _, b in calls] == [presented] * 3
    assert {a for a, _ in calls} == {hashlib.sha256(k.encode()).digest() for k in (ALICE, BOB)} | {
        hashlib.sha256(b"tgw-carol").digest()
    }
    calls.clear()
    assert ring.lookup("tgw-nobody") is None
    assert len(calls) == 3


def test_bearer_token() -> None:
    assert bearer_token(b"Bearer abc") == "abc"
    assert bearer_token(b"bearer   abc  ") == "abc"
    assert bearer_token(None) is None
    assert bearer_token(b"Basic abc") is None
    assert bearer_token(b"Bearer ") is None
    assert bearer_token(b"Bearer") is None


def test_alias_checks_and_the_key_name_on_the_request() -> None:
    ring = parse_keys(entry("alice", ALICE, 'aliases = ["prompt-enhance"]') + entry("bob", BOB))
    alice, bob = ring.lookup(ALICE), ring.lookup(BOB)
    assert alice is not None and bob is not None
    request = validate_chat_body(
        {"model": "agent-lite", "messages": [{"role": "user", "content": "hi"}]}
    )
    with pytest.raises(Forbidden) as caught:
        authorize(request, alice)
    assert caught.value.code == "alias_not_allowed" and caught.value.status == 403
    assert caught.value.param == "model"
    assert "prompt-enhance" in caught.value.message
    assert authorize(request, bob).key_name == "bob"
    assert authorize(request, None) is request and request.key_name is None


def test_the_401_error_says_bearer() -> None:
    error = Unauthorized("invalid API key")
    assert error.status == 401
    assert error.to_body()["error"]["type"] == "invalid_request_error"
    assert error.to_body()["error"]["code"] == "invalid_api_key"
    assert (b"www-authenticate", b'Bearer realm="trio-gateway"') in error.headers()


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def store(path: Path, clock: FakeClock) -> KeyStore:
    return KeyStore(str(path), known_aliases={"agent-lite"}, clock=clock)


def test_the_store_authenticates_and_never_quotes_the_key(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(entry("alice", ALICE))
    keys = store(path, FakeClock())
    assert keys.authenticate(ALICE).name == "alice"
    with pytest.raises(Unauthorized) as missing:
        keys.authenticate(None)
    assert "Authorization: Bearer" in missing.value.message
    with pytest.raises(Unauthorized) as wrong:
        keys.authenticate(BOB)
    assert BOB not in wrong.value.message


def test_a_changed_file_is_reloaded_after_the_check_interval(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(entry("alice", ALICE))
    clock = FakeClock()
    keys = store(path, clock)
    path.write_text(entry("bob", BOB))
    clock.now += 0.5
    assert keys.ring().lookup(ALICE) is not None  # not checked yet: within the interval
    clock.now += 0.5
    assert keys.ring().lookup(ALICE) is None
    assert keys.ring().lookup(BOB) is not None


def test_an_unchanged_file_is_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(entry("alice", ALICE))
    clock = FakeClock()
    keys = store(path, clock)
    reads: list[str] = []

    def read(path: str | Path) -> str:
        reads.append(str(path))
        return ""

    monkeypatch.setattr(key_file, "read_keys_file", read)
    clock.now += 5
    assert keys.ring().lookup(ALICE) is not None
    assert reads == []


def test_a_bad_new_file_keeps_the_old_ring_and_logs_every_problem(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(entry("alice", ALICE))
    clock = FakeClock()
    keys = store(path, clock)
    path.write_text(entry("bob", BOB, 'rpm = "x"\naliases = ["nope"]'))
    clock.now += 1
    with caplog.at_level(logging.ERROR, logger="trio_gateway"):
        assert keys.ring().lookup(ALICE) is not None
    messages = [r.getMessage() for r in caplog.records]
    assert any("keys.bob.rpm: expected an integer" in m for m in messages)
    assert any("keys.bob.aliases[0]: unknown alias 'nope'" in m for m in messages)
    # The last line names the key that broke the file, and what its callers meet.
    assert messages[-1].endswith(
        "keys.toml: not reloaded: key 'bob' invalid (2 problems); still using the 1 key loaded "
        "before, so a key added since gets 401 until the file is fixed"
    )
    assert caplog.records[-1].levelno == logging.ERROR
    # Said once per change, not once per check.
    caplog.clear()
    clock.now += 1
    with caplog.at_level(logging.ERROR, logger="trio_gateway"):
        assert keys.ring().lookup(ALICE) is not None
    assert caplog.records == []
    # Fixed: the new file is taken.
    path.write_text(entry("bob", BOB))
    clock.now += 1
    assert keys.ring().lookup(BOB) is not None and keys.ring().lookup(ALICE) is None


def test_a_removed_file_keeps_the_old_ring(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(entry("alice", ALICE))
    clock = FakeClock()
    keys = store(path, clock)
    os.unlink(path)
    clock.now += 1
    with caplog.at_level(logging.ERROR, logger="trio_gateway"):
        assert keys.ring().lookup(ALICE) is not None
    assert any("cannot read" in r.getMessage() for r in caplog.records)
    path.write_text(entry("bob", BOB))
    clock.now += 1
    assert keys.ring().lookup(BOB) is not None


def test_a_store_on_a_bad_file_does_not_start(tmp_path: Path) -> None:
    with pytest.raises(KeysFileError):
        KeyStore(str(tmp_path / "missing.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("[keys.a]\n")
    with pytest.raises(KeysFileError):
        KeyStore(str(bad))


def scope(
    *,
    headers: tuple[tuple[bytes, bytes], ...] | list[tuple[bytes, bytes]] = (),
    subprotocols: tuple[str, ...] | list[str] = (),
    query: bytes = b"",
) -> dict[str, object]:
    return {"headers": list(headers), "subprotocols": list(subprotocols), "query_string": query}


def test_the_websocket_key_comes_from_the_header_a_subprotocol_or_the_query() -> None:
    header = websocket_handshake(scope(headers=[(b"authorization", b"Bearer h")]))
    assert (header.key, header.subprotocol) == ("h", None)
    offered = websocket_handshake(scope(subprotocols=["trio-gateway", "bearer.s"]))
    assert (offered.key, offered.subprotocol) == ("s", "trio-gateway")
    query = websocket_handshake(scope(query=b"x=1&access_token=q"))
    assert (query.key, query.subprotocol) == ("q", None)
    first = websocket_handshake(
        scope(
            headers=[(b"authorization", b"Bearer h")],
            subprotocols=["bearer.s", "trio-gateway"],
            query=b"access_token=q",
        )
    )
    assert (first.key, first.subprotocol) == ("h", "trio-gateway")
    nothing = websocket_handshake(scope(subprotocols=["other"]))
    assert (nothing.key, nothing.subprotocol) == (None, None)


def test_a_bearer_subprotocol_alone_is_refused_never_echoed() -> None:
    with pytest.raises(InvalidRequest) as caught:
        websocket_handshake(scope(subprotocols=["bearer.secret"]))
    assert "secret" not in caught.value.message


def test_a_ring_iterates_its_keys_whose_repr_hides_the_digest() -> None:
    ring = KeyRing(parse_keys(entry("alice", ALICE)))
    assert [k.name for k in ring] == ["alice"]
    assert "digest" not in repr(next(iter(ring)))


CONFIG = """
[server]
listen = "{listen}"
{auth}
[aliases.agent-lite]
[[aliases.agent-lite.providers]]
name = "p"
type = "openai_compatible"
base_url = "http://127.0.0.1:9/v1"
model = "m"
"""


def config_problems(listen: str, auth_toml: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(CONFIG.format(listen=listen, auth=auth_toml), environ={})
    return caught.value.problems


def test_auth_config(tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(entry("alice", ALICE))
    on = parse_config(
        CONFIG.format(listen="0.0.0.0:8080", auth=f'[auth]\nkeys_file = "{keys}"'), environ={}
    )
    assert on.auth.keys_file == str(keys)
    assert parse_config(CONFIG.format(listen="127.0.0.1:1", auth=""), environ={}).auth.open is None
    explicit = CONFIG.format(listen="0.0.0.0:8080", auth="[auth]\nopen = true")
    assert parse_config(explicit, environ={}).auth.open is True
    assert config_problems("0.0.0.0:8080", "")[0].startswith(
        "auth: server.listen '0.0.0.0:8080' is not a loopback address"
    )
    assert config_problems("127.0.0.1:1", f'[auth]\nkeys_file = "{keys}"\nopen = true') == [
        "auth: give keys_file (keys required) or open (no keys), not both"
    ]
    assert config_problems("127.0.0.1:1", "[auth]\nopen = false") == [
        "auth.open: false requires keys; give keys_file = PATH instead"
    ]
    assert config_problems("127.0.0.1:1", "[auth]\nopen = 1") == [
        "auth.open: expected true or false, got 1"
    ]
    bad = tmp_path / "bad.toml"
    bad.write_text(entry("alice", ALICE, 'aliases = ["nope"]\nrpm = 0'))
    assert config_problems("127.0.0.1:1", f'[auth]\nkeys_file = "{bad}"') == [
        f"auth.keys_file: {bad}: keys.alice.aliases[0]: unknown alias 'nope' (known: agent-lite)",
        f"auth.keys_file: {bad}: keys.alice.rpm: must be at least 1",
    ]
    missing = tmp_path / "missing.toml"
    assert config_problems("127.0.0.1:1", f'[auth]\nkeys_file = "{missing}"') == [
        f"auth.keys_file: {missing}: cannot read: No such file or directory"
    ]


@pytest.mark.parametrize(
    ("listen", "loopback"),
    [
        ("127.0.0.1:8080", True),
        ("127.1.2.3:80", True),
        ("[::1]:8080", True),
        ("localhost:8080", True),
        ("0.0.0.0:8080", False),
        ("[::]:8080", False),
        ("10.0.0.5:8080", False),
        ("gateway.internal:8080", False),
    ],
)
def test_loopback(listen: str, loopback: bool) -> None:
    assert is_loopback(listen) is loopback


def test_http_key_reads_a_bearer_token_or_anthropics_x_api_key(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(entry("alice", ALICE) + entry("bob", BOB))
    keys = store(path, FakeClock())

    def scope(*headers: tuple[bytes, bytes]) -> dict[str, object]:
        return {"headers": list(headers)}

    assert http_key(scope((b"x-api-key", ALICE.encode())), keys).name == "alice"  # type: ignore[union-attr]
    both = scope((b"authorization", f"Bearer {BOB}".encode()), (b"x-api-key", ALICE.encode()))
    assert http_key(both, keys).name == "bob"  # type: ignore[union-attr]
    with pytest.raises(Unauthorized):
        http_key(scope((b"x-api-key", b"  ")), keys)
    assert http_key(scope(), None) is None
