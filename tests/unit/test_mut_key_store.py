"""The keys file's store and parser, to the letter: what the log lines say, what a config
reload leaves behind, what a problem names (mutation testing, docs/testing.md)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from tests.unit.test_auth import ALICE, BOB, FakeClock, entry
from trio_gateway.accounting.key_store import KeyStore
from trio_gateway.core.errors import Unauthorized
from trio_gateway.core.keys import KeyRing, KeysFileError, parse_keys
from trio_gateway.core.usage import NULL_SINK, UsageRecord

CAROL = "tgw-carol-secret"


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def test_a_reload_logs_how_many_keys_from_which_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(entry("alice", ALICE))
    clock = FakeClock()
    keys = KeyStore(str(path), clock=clock)
    path.write_text(entry("alice", ALICE) + entry("bob", BOB))
    clock.now += 1
    with caplog.at_level(logging.INFO, logger="trio_gateway"):
        keys.ring()
    assert messages(caplog) == [f"auth: 2 keys from {path} (reloaded)"]
    assert caplog.records[0].levelno == logging.INFO


def test_a_bad_file_logs_each_problem_with_its_path_then_the_keys_it_broke(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(entry("alice", ALICE))
    clock = FakeClock()
    keys = KeyStore(str(path), clock=clock)
    path.write_text(entry("bob", BOB, 'rpm = "x"') + entry("carol", CAROL, "tpm = 0"))
    clock.now += 1
    with caplog.at_level(logging.ERROR, logger="trio_gateway"):
        assert keys.ring().lookup(ALICE) is not None
    assert messages(caplog) == [
        f"keys file {path}: keys.bob.rpm: expected an integer, got 'x'",
        f"keys file {path}: keys.carol.tpm: must be at least 1",
        f"keys file {path}: not reloaded: keys 'bob', 'carol' invalid (2 problems); still "
        "using the 1 key loaded before, so a key added since gets 401 until the file is fixed",
    ]


def test_an_unreadable_file_says_why_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(entry("alice", ALICE))
    clock = FakeClock()
    keys = KeyStore(str(path), clock=clock)
    os.unlink(path)
    clock.now += 1
    with caplog.at_level(logging.ERROR, logger="trio_gateway"):
        keys.ring()
        clock.now += 1
        keys.ring()  # still missing: not said again
    assert messages(caplog) == [
        f"keys file {path}: cannot read: No such file or directory",
        f"keys file {path}: not reloaded: 1 problem; still using the 1 key loaded before, "
        "so a key added since gets 401 until the file is fixed",
    ]


def test_a_config_reload_takes_the_new_path_aliases_and_stamp(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = tmp_path / "a.toml", tmp_path / "b.toml"
    first.write_text(entry("alice", ALICE))
    second.write_text(entry("bob", BOB, 'aliases = ["new"]'))
    clock = FakeClock()
    keys = KeyStore(str(first), known_aliases={"old"}, clock=clock)
    ring = parse_keys(second.read_text(), known_aliases={"new"})
    keys.replace(str(second), ring, known_aliases={"new"})
    assert keys.path == str(second)
    # The file it was read from is unchanged: no reload, no log line.
    clock.now += 1
    with caplog.at_level(logging.INFO, logger="trio_gateway"):
        assert keys.ring() is ring
    assert caplog.records == []
    # The new aliases are the ones a reloaded file is checked against.
    second.write_text(entry("bob", BOB, 'aliases = ["old"]'))
    clock.now += 1
    with caplog.at_level(logging.ERROR, logger="trio_gateway"):
        assert keys.ring() is ring
    assert "keys.bob.aliases[0]: unknown alias 'old' (known: new)" in messages(caplog)[0]
    # Within the interval after replace, the file is not looked at.
    keys.replace(str(first), KeyRing(), known_aliases=())
    first.write_text(entry("carol", CAROL))
    assert keys.ring().lookup(CAROL) is None


def test_a_config_reload_onto_a_missing_file_reloads_when_it_appears(tmp_path: Path) -> None:
    first, missing = tmp_path / "a.toml", tmp_path / "later.toml"
    first.write_text(entry("alice", ALICE))
    clock = FakeClock()
    keys = KeyStore(str(first), clock=clock)
    keys.replace(str(missing), KeyRing(), known_aliases=())
    missing.write_text(entry("bob", BOB))
    clock.now += 1
    assert keys.ring().lookup(BOB) is not None


def test_a_keys_file_error_says_every_problem_on_its_own_line() -> None:
    error = KeysFileError("k.toml", ["one", "two"], ["a"])
    assert str(error) == "k.toml: one\nk.toml: two"
    assert error.keys == ("a",) and error.source == "k.toml"


def test_a_wrong_type_is_named_not_quoted() -> None:
    with pytest.raises(KeysFileError) as caught:
        parse_keys('[keys.a]\nsha256 = ["x"]\n[keys.b]\nsha256 = {x = 1}\n')
    assert caught.value.problems == [
        "keys.a.sha256: expected a string, got list",
        "keys.b.sha256: expected a string, got dict",
    ]


def test_the_null_sink_takes_every_record() -> None:
    record = UsageRecord(
        request_id="r", key=None, alias=None, provider=None, outcome="refused", started_at=0.0
    )
    assert NULL_SINK.offer(record) is True


def test_the_401_messages_word_for_word(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(entry("alice", ALICE))
    keys = KeyStore(str(path), clock=FakeClock())
    with pytest.raises(Unauthorized) as missing:
        keys.authenticate(None)
    assert missing.value.message == (
        "missing API key: send it as 'Authorization: Bearer <key>' (on a WebSocket also as "
        "the subprotocol 'bearer.<key>' or '?access_token=<key>')"
    )
    with pytest.raises(Unauthorized) as wrong:
        keys.authenticate(BOB)
    assert wrong.value.message == "invalid API key"
