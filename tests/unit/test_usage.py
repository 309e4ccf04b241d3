"""Usage so far in every parser, one record per outcome, and the ledger's queue and batches."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

from tests.unit.fixtures import transcript
from trio_gateway.accounting.ledger import (
    DEFAULT_LEDGER_NAME,
    LEDGER_MEMORY,
    SQLiteLedger,
    ledger_path,
    serve_ledger,
)
from trio_gateway.config.load import parse_config
from trio_gateway.config.schema import UsageConfig
from trio_gateway.core.events import Usage
from trio_gateway.core.sse import SSEDecoder, SSEEvent
from trio_gateway.core.usage import (
    PartialUsage,
    UsageRecord,
    estimate_prompt_tokens,
    estimate_tokens,
    refused_record,
    usage_record,
)
from trio_gateway.providers.anthropic.dialect import AnthropicStreamParser
from trio_gateway.providers.gemini.dialect import GeminiStreamParser
from trio_gateway.providers.openai_compatible.dialect import ChunkParser


def sse_events(raw: bytes) -> list[SSEEvent]:
    decoder = SSEDecoder()
    return [e for e in decoder.feed(raw) + decoder.close() if e.data]


# --- openai_compatible: continuous usage ---------------------------------------------------------


def test_the_parser_keeps_the_latest_cumulative_usage_of_every_chunk() -> None:
    _, raw = transcript("b_stream_continuous_usage.sse")
    events = sse_events(raw)
    parser = ChunkParser("vllm")
    assert parser.usage_so_far() is None  # nothing streamed, nothing billed
    emitted_usage = []
    for event in events[:-2]:  # cut before the closing usage chunk and [DONE]
        chunk = json.loads(event.data)
        emitted_usage += [e for e in parser.feed(event) if isinstance(e, Usage)]
        expected = chunk["usage"]
        assert parser.usage_so_far() == PartialUsage(
            Usage(expected["prompt_tokens"], expected["completion_tokens"], 0, None),
            estimated=False,
        )
    assert emitted_usage == []  # per-chunk usage is kept, never emitted
    assert [e for e in parser.feed(events[-2]) if isinstance(e, Usage)] == [Usage(23, 8, 0, None)]


def test_without_continuous_usage_a_cut_stream_counts_its_fragments() -> None:
    _, raw = transcript("b_stream_include_usage_true.sse")
    events = sse_events(raw)
    parser = ChunkParser("openai")
    fragments = 0
    for event in events[:4]:
        fragments += sum(1 for e in parser.feed(event) if type(e).__name__ == "TextDelta")
    partial = parser.usage_so_far()
    assert partial is not None and partial.estimated
    assert partial.usage == Usage(0, fragments)
    assert fragments >= 2


def test_fragments_after_the_last_usage_are_added_to_it() -> None:
    parser = ChunkParser("vllm")
    chunk: dict[str, Any] = {"choices": [{"delta": {"content": "a"}}]}
    parser.feed_data(
        json.dumps({**chunk, "usage": {"prompt_tokens": 5, "completion_tokens": 1}}).encode()
    )
    parser.feed_data(json.dumps(chunk).encode())
    parser.feed_data(json.dumps(chunk).encode())
    assert parser.usage_so_far() == PartialUsage(Usage(5, 3), estimated=True)


# --- anthropic ---------------------------------------------------------------------------------


def anthropic(kind: str, **data: Any) -> SSEEvent:
    return SSEEvent(event=kind, data=json.dumps({"type": kind, **data}).encode())


def test_anthropic_cut_before_message_delta_is_estimated_from_characters() -> None:
    parser = AnthropicStreamParser("claude")
    usage = {"input_tokens": 10, "cache_read_input_tokens": 4, "output_tokens": 1}
    parser.feed(anthropic("message_start", message={"usage": usage}))
    parser.feed(anthropic("content_block_start", index=0, content_block={"type": "text"}))
    parser.feed(
        anthropic("content_block_delta", index=0, delta={"type": "text_delta", "text": "x" * 41})
    )
    partial = parser.usage_so_far()
    assert partial == PartialUsage(Usage(14, 11, None, 4), estimated=True)  # ceil(41 / 4)
    parser.feed(
        anthropic("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 9})
    )
    assert parser.usage_so_far() == PartialUsage(Usage(14, 9, None, 4), estimated=False)


def test_anthropic_before_message_start_has_no_usage() -> None:
    assert AnthropicStreamParser("claude").usage_so_far() is None


# --- gemini ------------------------------------------------------------------------------------


def gemini(text: str, usage: dict[str, int] | None) -> SSEEvent:
    payload: dict[str, Any] = {"candidates": [{"content": {"parts": [{"text": text}]}}]}
    if usage is not None:
        payload["usageMetadata"] = usage
    return SSEEvent(event=None, data=json.dumps(payload).encode())


def test_gemini_usage_metadata_on_the_last_chunk_is_exact() -> None:
    parser = GeminiStreamParser("gem")
    parser.feed(gemini("hello", {"promptTokenCount": 7, "candidatesTokenCount": 2}))
    assert parser.usage_so_far() == PartialUsage(Usage(7, 2), estimated=False)


def test_gemini_chunks_without_usage_metadata_are_estimated() -> None:
    parser = GeminiStreamParser("gem")
    parser.feed(gemini("hello", {"promptTokenCount": 7, "candidatesTokenCount": 2}))
    parser.feed(gemini("y" * 9, None))
    assert parser.usage_so_far() == PartialUsage(Usage(7, 2 + 3), estimated=True)


# --- records -----------------------------------------------------------------------------------


def record(**overrides: Any) -> UsageRecord:
    fields: dict[str, Any] = {
        "request_id": "r1",
        "key": None,
        "alias": "agent-lite",
        "provider": "vllm",
        "cancelled": None,
        "error_code": None,
        "emitted": True,
        "usage": Usage(10, 5, 2, 3),
        "partial": PartialUsage(Usage(10, 4), estimated=False),
        "prompt_estimate": lambda: estimate_prompt_tokens([{"role": "user", "content": "hi"}]),
        "ttft_s": 0.1,
        "duration_s": 1.0,
        "started_at": 1_700_000_000.0,
    }
    return usage_record(**(fields | overrides))


def test_a_completed_request_uses_the_vendors_final_count() -> None:
    r = record()
    assert (r.outcome, r.error_code, r.estimated) == ("completed", None, False)
    assert (r.prompt_tokens, r.completion_tokens, r.reasoning_tokens, r.cached_tokens) == (
        10,
        5,
        2,
        3,
    )


def test_a_cancelled_request_uses_the_usage_so_far() -> None:
    r = record(cancelled="client_gone", usage=None)
    assert (r.outcome, r.error_code, r.completion_tokens, r.estimated) == (
        "cancelled",
        "client_gone",
        4,
        False,
    )


def test_an_upstream_failure_is_failed_with_what_streamed() -> None:
    r = record(error_code="upstream_error", usage=None)
    assert (r.outcome, r.completion_tokens) == ("failed", 4)


def test_an_overloaded_request_is_a_refusal_with_zero_tokens() -> None:
    r = record(error_code="overloaded", emitted=False, usage=None, partial=None, provider=None)
    assert (r.outcome, r.prompt_tokens, r.completion_tokens, r.estimated) == (
        "refused",
        0,
        0,
        False,
    )


def test_an_estimated_count_without_a_prompt_estimates_the_prompt() -> None:
    messages = [{"role": "user", "content": "x" * 400}]
    r = record(
        cancelled="client_gone",
        usage=None,
        partial=PartialUsage(Usage(0, 7), estimated=True),
        prompt_estimate=lambda: estimate_prompt_tokens(messages),
    )
    assert r.estimated
    assert r.completion_tokens == 7
    assert r.prompt_tokens == estimate_tokens(len(json.dumps(messages))) > 100


def test_a_refused_record_has_no_provider_and_no_tokens() -> None:
    r = refused_record(
        request_id="r", key=None, alias=None, error_code="invalid_json", started_at=1.0
    )
    assert (r.outcome, r.provider, r.prompt_tokens, r.completion_tokens) == ("refused", None, 0, 0)


# --- the ledger --------------------------------------------------------------------------------


def test_ledger_path_defaults_next_to_the_config_file(tmp_path: Path) -> None:
    toml = (
        '[aliases.a]\n[[aliases.a.providers]]\nname = "p"\ntype = "openai_compatible"\n'
        'base_url = "http://x/v1"\nmodel = "m"\n'
    )
    file = tmp_path / "gateway.toml"
    file.write_text(toml)
    assert ledger_path(parse_config(toml, source=str(file))) == str(tmp_path / DEFAULT_LEDGER_NAME)
    assert ledger_path(parse_config(toml, source="<config>")) == LEDGER_MEMORY
    off = parse_config('[usage]\nledger = "none"\n' + toml, source=str(file))
    assert ledger_path(off) is None
    relative = parse_config('[usage]\nledger = "data/u.db"\n' + toml, source=str(file))
    assert ledger_path(relative) == str(tmp_path / "data" / "u.db")
    with pytest.raises(Exception, match=r"usage\.queue_size"):
        parse_config("[usage]\nqueue_size = 0\n" + toml)


def one(i: int) -> UsageRecord:
    return refused_record(
        request_id=f"r{i}", key=None, alias="a", error_code="invalid_json", started_at=float(i)
    )


def rows(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT request_id FROM usage ORDER BY id")]
    finally:
        conn.close()


async def test_a_full_queue_drops_without_blocking_and_logs_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A real clock: writes run in a worker thread, and a jumping clock would pass the close
    # deadline while one is under way.
    path = tmp_path / "u.sqlite3"
    ledger = SQLiteLedger(str(path), UsageConfig(queue_size=3, batch_max=2, flush_interval_s=0.5))
    caplog.set_level(logging.WARNING, "trio_gateway")
    # No service yet: the queue fills, and every offer past it returns at once.
    accepted = [ledger.offer(one(i)) for i in range(10)]
    assert accepted == [True] * 3 + [False] * 7
    assert ledger.statistics().dropped_queue_full == 7
    assert len([r for r in caplog.records if "queue full" in r.message]) == 1
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_ledger, ledger)
        try:
            # Once the service has taken the queue in, there is room again.
            for _ in range(1000):
                if not ledger.statistics().queued:
                    break
                await trio.sleep(0.01)
            assert [ledger.offer(one(i)) for i in range(10, 13)] == [True] * 3
        finally:
            # The service is shielded until close(): without it a failed assert would hang.
            ledger.close()
    assert rows(path) == [f"r{i}" for i in (0, 1, 2, 10, 11, 12)]
    assert ledger.statistics().written == 6
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        indexes = [r[1] for r in conn.execute("PRAGMA index_list(usage)")]
        assert "usage_started_at" in indexes
    finally:
        conn.close()


async def test_batches_are_written_by_size_or_by_time(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = tmp_path / "u.sqlite3"
    ledger = SQLiteLedger(str(path), UsageConfig(queue_size=100, batch_max=4, flush_interval_s=1.0))
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_ledger, ledger)
        for i in range(4):
            ledger.offer(one(i))
        # A full batch goes at once: spinning lets no (virtual) time pass, yet it is written.
        start = trio.current_time()
        while ledger.statistics().written < 4:
            await trio.lowlevel.checkpoint()
        assert trio.current_time() == start
        ledger.offer(one(4))
        # A partial batch waits for the interval, and no longer.
        for _ in range(100_000):
            if ledger.statistics().written == 5:
                break
            await trio.sleep(0.01)
        assert ledger.statistics().written == 5
        assert trio.current_time() - start >= 1.0
        nursery.cancel_scope.cancel()  # a cancelled server still writes out its queue
        ledger.offer(one(5))
        ledger.close()
    assert rows(path) == [f"r{i}" for i in range(6)]


async def _written(ledger: SQLiteLedger, count: int) -> None:
    for _ in range(100_000):  # the writes run in a worker thread: nothing to wait on
        if ledger.statistics().written >= count:
            return
        await trio.sleep(0.01)
    raise AssertionError(f"{ledger.statistics().written} records written, not {count}")


async def test_records_that_trickle_in_are_one_batch_and_a_burst_is_cut_at_batch_max(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trio_gateway.accounting.ledger as ledger_module

    sizes: list[int] = []
    write = ledger_module.write_batch

    def counted(conn: sqlite3.Connection, records: list[UsageRecord]) -> None:
        sizes.append(len(records))
        write(conn, records)

    monkeypatch.setattr(ledger_module, "write_batch", counted)
    path = tmp_path / "u.sqlite3"
    ledger = SQLiteLedger(str(path), UsageConfig(queue_size=100, batch_max=4, flush_interval_s=1.0))
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_ledger, ledger)
        for i in range(3):  # one every 0.2 s: all within the interval of the first
            ledger.offer(one(i))
            await trio.sleep(0.2)
        await _written(ledger, 3)
        assert sizes == [3]
        for i in range(3, 13):  # a burst: cut at batch_max, the rest when the interval ends
            ledger.offer(one(i))
        await _written(ledger, 13)
        nursery.cancel_scope.cancel()
        ledger.close()
    assert sizes == [3, 4, 4, 2]
    assert rows(path) == [f"r{i}" for i in range(13)]
