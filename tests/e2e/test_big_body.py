"""A big body delays no one (issue 39, item 4): while a 4 MiB body of 130,000 parts is read
and refused (again and again, for two seconds), or 4 MiB of text is scanned by an input
filter, ``/healthz`` polled from another process answers within 100 ms at the 99th
percentile. The body is read, checked and screened in a worker thread (fronts/off_loop.py), in
pieces (core/body.py); before, the event loop did it all, and every request waited
(docs/benchmarks.md, 2026-12-07: a p99 of 1.8 to 6.1 s).

The gateway is ``trio-gateway serve`` in a process of its own, as in production (its
collector's settings included); ``bench/big_body.py`` has the bodies and the measure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from bench.big_body import (
    TINY_PARTS,
    chat_body,
    filtered_body,
    filtered_gateway,
    messages_body,
    percentile,
    sent_while_polled,
    tiny_parts,
)

from trio_gateway.core.body import MAX_CONTENT_PARTS

P99_BOUND_S = 0.100


@pytest.fixture(scope="module")
def gateway_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    folder = tmp_path_factory.mktemp("big-body")
    with filtered_gateway(folder) as port:
        yield port
    assert "Traceback" not in (folder / "gateway.log").read_text()


@pytest.mark.parametrize(
    ("path", "make", "senders"),
    [("/v1/chat/completions", chat_body, 1), ("/v1/messages", messages_body, 1)],
    ids=["chat", "messages"],
)
def test_a_body_of_130000_parts_is_refused_and_healthz_stays_fast(
    gateway_port: int, path: str, make: Callable[[list[dict[str, str]]], bytes], senders: int
) -> None:
    raw = make(tiny_parts(TINY_PARTS))
    assert len(raw) > 3_500_000
    run = sent_while_polled(gateway_port, path, raw, senders=senders)
    for answer in run.answers:
        assert answer.status_code == 400, answer.text
        assert "MAX_CONTENT_PARTS" in answer.text
        assert f"messages[0].content[{MAX_CONTENT_PARTS - 1}]" in answer.text
    # Enough polls that their 99th percentile is not simply the slowest one.
    assert len(run.latencies) >= 100, (len(run.latencies), run.seconds)
    p99 = percentile(run.latencies, 0.99)
    assert p99 < P99_BOUND_S, (p99, max(run.latencies), run.seconds)


def test_an_input_filter_scans_4_mib_and_healthz_stays_fast(gateway_port: int) -> None:
    raw = filtered_body()
    assert len(raw) > 3_900_000
    run = sent_while_polled(gateway_port, "/v1/chat/completions", raw)
    for answer in run.answers:
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == "content_filtered"
    assert len(run.latencies) >= 100, (len(run.latencies), run.seconds)
    p99 = percentile(run.latencies, 0.99)
    assert p99 < P99_BOUND_S, (p99, max(run.latencies), run.seconds)
