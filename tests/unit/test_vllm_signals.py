"""Reading vLLM's /metrics text for the few series routing and reporting use, and the
prefix-cache hit rate across scrapes (a replica restart included)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_gateway.providers.openai_compatible.signals import (
    PrefixCacheRate,
    ReplicaSignals,
    parse_vllm_metrics,
)
from trio_gateway.sim.wire import metrics_text

# The shape vLLM 0.32 exposes (one engine; HELP/TYPE lines, histograms around the series).
VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen3-32b"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen3-32b"} 5.0
vllm:kv_cache_usage_perc{engine="0",model_name="qwen3-32b"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="qwen3-32b"} 1024.0
vllm:prefix_cache_hits_total{engine="0",model_name="qwen3-32b"} 512.0
vllm:num_requests_running_created{engine="0",model_name="qwen3-32b"} 1.7e9
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="qwen3-32b"} 0.0
vllm:prefix_cache_queries_created{engine="0",model_name="qwen3-32b"} 1.7e9
"""


def test_the_series_of_one_engine() -> None:
    assert parse_vllm_metrics(VLLM_TEXT) == ReplicaSignals(
        running=3,
        waiting=5,
        kv_cache_usage=0.25,
        prefix_cache_queries=1024.0,
        prefix_cache_hits=512.0,
    )


def test_engines_are_summed_and_kv_usage_averaged() -> None:
    text = VLLM_TEXT + VLLM_TEXT.replace('engine="0"', 'engine="1"').replace(" 0.25", " 0.75")
    signals = parse_vllm_metrics(text)
    assert (signals.running, signals.waiting) == (6, 10)
    assert signals.kv_cache_usage == pytest.approx(0.5)
    assert (signals.prefix_cache_queries, signals.prefix_cache_hits) == (2048.0, 1024.0)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not metrics at all\n",
        "vllm:num_requests_running{} nan\nvllm:num_requests_waiting{} -1\n",
        'vllm:num_requests_running\nvllm:num_requests_waiting{x="1"} many\n',
        "vllm:num_requests_running_total{} 4\n",  # another series sharing a prefix
    ],
)
def test_what_is_not_said_stays_unknown(text: str) -> None:
    assert parse_vllm_metrics(text) == ReplicaSignals()


def test_the_simulator_speaks_the_same() -> None:
    values = {
        "vllm:num_requests_running": 2,
        "vllm:num_requests_waiting": 1,
        "vllm:kv_cache_usage_perc": 0.5,
        "vllm:prefix_cache_queries_total": 64,
        "vllm:prefix_cache_hits_total": 48,
    }
    signals = parse_vllm_metrics(metrics_text("m", values))
    assert signals == ReplicaSignals(
        running=2, waiting=1, kv_cache_usage=0.5, prefix_cache_queries=64, prefix_cache_hits=48
    )


def test_usage_over_one_is_read_as_full() -> None:
    assert parse_vllm_metrics("vllm:kv_cache_usage_perc{} 1.5\n").kv_cache_usage == 1.0


def reading(queries: float, hits: float) -> ReplicaSignals:
    return ReplicaSignals(prefix_cache_queries=queries, prefix_cache_hits=hits)


def test_the_rate_counts_from_the_first_reading() -> None:
    rate = PrefixCacheRate()
    rate.update(reading(1000, 900))  # what the replica did before the gateway watched
    assert rate.ratio is None
    rate.update(reading(1100, 950))
    assert (rate.queries, rate.hits) == (100, 50)
    assert rate.ratio == 0.5
    rate.update(ReplicaSignals())  # a failed scrape changes nothing
    assert rate.ratio == 0.5


def test_a_restart_counts_all_the_new_counter_says() -> None:
    rate = PrefixCacheRate()
    rate.update(reading(1000, 900))
    rate.update(reading(1100, 950))
    rate.update(reading(40, 30))  # restarted from zero: 40 queries since
    assert (rate.queries, rate.hits) == (140, 80)


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), max_size=30))
def test_the_rate_is_always_a_ratio(steps: list[tuple[int, int]]) -> None:
    rate = PrefixCacheRate()
    for queries, hits in steps:
        rate.update(reading(queries, min(hits, queries)))
        assert rate.queries >= 0 and rate.hits >= 0
        assert rate.ratio is None or 0.0 <= rate.ratio <= 1.0


def test_unchanged_counters_are_no_restart() -> None:
    """Equal is not "went back": a quiet replica (or only its hits unchanged) adds nothing."""
    rate = PrefixCacheRate()
    rate.update(reading(1000, 900))
    rate.update(reading(1000, 900))
    assert (rate.queries, rate.hits) == (0, 0)
    rate.update(reading(1100, 900))  # misses only
    assert (rate.queries, rate.hits) == (100, 0)


def test_label_values_with_spaces_and_braces_and_a_bad_line_first() -> None:
    """Label values are the operator's (a model name with a space or a brace), and a series
    may have no labels; a line the parser cannot read is skipped, and the lines after it
    still count."""
    text = (
        'vllm:num_requests_running{engine="0",model_name="qwen 3 {32b}"} garbage\n'
        'vllm:num_requests_waiting{engine="0",model_name="x"} -1\n'
        'vllm:num_requests_running{engine="0",model_name="qwen 3 {32b}"} 4.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="qwen 3 {32b}"} 2.0\n'
        # No labels at all: valid exposition too.
        "vllm:kv_cache_usage_perc 0.5\n"
    )
    assert parse_vllm_metrics(text) == ReplicaSignals(running=4, waiting=2, kv_cache_usage=0.5)
