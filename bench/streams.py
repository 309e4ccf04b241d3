"""Streamed-request load shared by scenarios B, D and E: the request, the runners, the summary."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from typing import Any

import trio

from bench import harness
from bench.rawhttp import StreamResult, post_bytes, stream_chat

HOST = "127.0.0.1"


def chat_request(port: int, model: str, max_tokens: int, tag: str) -> bytes:
    """Exactly ``max_tokens`` content tokens (``ignore_eos``, thinking off: every token is a
    content chunk), usage at the end as the gateway always asks for it. ``tag`` makes each
    prompt distinct."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"{tag} tell me a story"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    return post_bytes(HOST, port, harness.CHAT_PATH, body)


async def closed_loop(
    port: int, requests: Sequence[bytes], concurrency: int, connect_timeout_s: float
) -> list[StreamResult]:
    """``concurrency`` clients, each taking the next request when its stream ends, one
    connection per stream, until every request ran."""
    results = [StreamResult(index=i) for i in range(len(requests))]
    indexes = iter(range(len(requests)))

    async def client() -> None:
        for i in indexes:  # shared iterator: each index goes to one client
            await stream_chat(
                results[i], HOST, port, requests[i], connect_timeout_s=connect_timeout_s
            )

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(client)
    return results


def completed(result: StreamResult, max_tokens: int) -> bool:
    return (
        result.error is None
        and result.done
        and result.tokens == max_tokens
        and result.finish_reason == "length"
    )


def summarize(results: Sequence[StreamResult], max_tokens: int) -> dict[str, Any]:
    """TTFT and inter-chunk gaps (all gaps of all streams pooled), completions, failures."""
    ttfts = [r.ttft_s for r in results if r.ttft_s is not None]
    gaps = list(itertools.chain.from_iterable(r.gaps_s for r in results))
    failures = Counter(r.error for r in results if r.error is not None)
    incomplete = sum(1 for r in results if r.error is None and not completed(r, max_tokens))
    return {
        "streams": len(results),
        "completed": sum(1 for r in results if completed(r, max_tokens)),
        "incomplete_without_error": incomplete,
        "failures": dict(failures),
        "failure_examples": {
            kind: next((r.detail for r in results if r.error == kind), None) for kind in failures
        },
        "ttft_p50_s": harness.percentile(ttfts, 0.5),
        "ttft_p99_s": harness.percentile(ttfts, 0.99),
        "ttft_max_s": max(ttfts, default=None),
        "gap_p50_s": harness.percentile(gaps, 0.5),
        "gap_p99_s": harness.percentile(gaps, 0.99),
        "gap_max_s": max(gaps, default=None),
        "tokens": sum(r.tokens for r in results),
        "events": sum(r.events for r in results),
    }


def failures_text(failures: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(failures.items())) or "0"
