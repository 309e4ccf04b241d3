"""The status page's last minutes: bounded buckets that forget what is older than the window."""

from __future__ import annotations

from trio_gateway.ops.metrics import ProviderGauges
from trio_gateway.ops.status import BUCKET_S, WINDOW_S, RecentStats, status_document


def test_requests_errors_spills_and_ttft_over_the_window() -> None:
    recent = RecentStats(["a", "b"])
    recent.request("a", 1000.0, error=False, ttft_s=0.1)
    recent.request("a", 1005.0, error=True, ttft_s=None)
    recent.request("a", 1100.0, error=False, ttft_s=0.3)
    recent.spill("a", 1100.0)
    recent.request("nobody", 1100.0, error=True, ttft_s=1.0)  # not configured: ignored
    assert recent.summary("a", 1100.0) == {
        "requests": 3,
        "errors": 1,
        "spills": 1,
        "ttft_avg_ms": 200.0,
        "ttft_max_ms": 300.0,
    }
    assert recent.summary("b", 1100.0)["requests"] == 0
    assert recent.summary("b", 1100.0)["ttft_avg_ms"] is None
    # Once the window has passed the first two, only the third is left.
    later = 1000.0 + WINDOW_S + BUCKET_S
    assert recent.summary("a", later)["requests"] == 1
    # And a bucket reused by a later slice of time starts from zero.
    recent.request("a", 1000.0 + WINDOW_S, error=False, ttft_s=None)
    assert recent.summary("a", 1000.0 + WINDOW_S)["requests"] == 2
    assert recent.summary("a", 1100.0 + WINDOW_S + BUCKET_S)["requests"] == 1


def test_the_document_the_page_reads() -> None:
    gauges = [
        ProviderGauges(
            provider="a",
            in_flight=3,
            queued=1,
            max_inflight=8,
            state="unreachable",
            cooling_down=False,
            upstream_load=5,
            last_error="probe failed: cannot connect (Connection refused)",
        )
    ]
    doc = status_document(
        aliases={"agent-lite": ["a"]},
        gauges=gauges,
        recent=RecentStats(["a"]),
        now=0.0,
        ready=True,
        draining=True,
    )
    assert doc["status"] == "draining"
    assert doc["providers"] == {
        "a": {
            "state": "unreachable",
            "cooling_down": False,
            "in_flight": 3,
            "max_inflight": 8,
            "queued": 1,
            "upstream_load": 5,
            "last_error": "probe failed: cannot connect (Connection refused)",
            "requests": 0,
            "errors": 0,
            "spills": 0,
            "ttft_avg_ms": None,
            "ttft_max_ms": None,
        }
    }
