"""Each benchmark scenario (docs/benchmarks.md) runs end to end with tiny sizes, in all its
modes (direct, naive proxy, gateway; A and B nginx too, A the gateway with two workers), so
the suite does not rot between full runs. Where /usr/sbin/nginx is missing (``make test``
installs it) A and B run without their nginx mode, and say so in their JSON.

The scenarios' entry points are called in this process (their own child processes are real:
the simulator, the naive proxy, ``trio-gateway serve``); each writes its JSON to a temporary
directory, and the assertions read it back. No plots (no matplotlib needed). The assertions are
about the run having happened and measured something, plus the behaviour each scenario exists
to show where it is cheap to check: the gateway propagates a cancellation and the naive proxy
does not, the gateway drops a stalled client. They are not about performance targets.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from bench import (
    cancellation,
    fleet,
    nginx_proxy,
    overhead,
    priority,
    scale,
    slow_clients,
    stream_memory,
    stream_timing,
    ws_rollout,
)

pytestmark = pytest.mark.slow
MODES = ["direct", "naive", "gateway"]
NGINX_MISSING = nginx_proxy.missing()
# The nginx mode where it can run; else the scenario leaves it out and records why.
NGINX = [] if NGINX_MISSING else ["nginx"]


def run(
    main: Callable[[Sequence[str]], int],
    tmp_path: Path,
    scenario: str,
    more: Sequence[str] = (),
) -> dict[str, Any]:
    code = main(["--smoke", "--no-plots", "--results-dir", str(tmp_path), *more])
    assert code == 0
    (path,) = tmp_path.glob(f"{scenario}-*.json")
    result: dict[str, Any] = json.loads(path.read_text())
    assert result["machine"]["cpus"] >= 1
    assert len(result["loadavg_before"]) == 3
    assert result["targets"], "every scenario states its targets"
    for target in result["targets"]:
        assert {"target", "value", "met"} <= target.keys()
    return result


def rows_by_mode(
    result: dict[str, Any], key: str = "rows", modes: Sequence[str] = MODES
) -> dict[str, dict[str, Any]]:
    rows = {row["mode"]: row for row in result[key]}
    assert sorted(rows) == sorted(modes)
    for row in rows.values():
        assert len(row["loadavg_before"]) == 3
    return rows


def check_middle(row: dict[str, Any], cpu_may_be_nil: bool = False) -> None:
    """The proxy's or the gateway's process was sampled from outside. ``cpu_may_be_nil``: the
    work may take less than one clock tick (10 ms), which /proc counts in."""
    proc = row["process"]
    assert proc["cpu_s"] >= 0 if cpu_may_be_nil else proc["cpu_s"] > 0
    assert proc["rss_kib_before"] > 0
    assert proc["rss_kib_peak"] >= proc["rss_kib_before"]
    assert proc["rss_kib_after"] > 0
    assert proc["series"]


def check_skipped(result: dict[str, Any]) -> None:
    expected = {} if NGINX_MISSING is None else {"nginx": NGINX_MISSING}
    assert result["skipped_modes"] == expected


def check_tree(row: dict[str, Any], processes: int) -> None:
    """A middle of several processes was measured whole; its root (nginx's master, the
    gateway's supervisor) does next to none of the work."""
    proc = row["process"]
    assert proc["processes_peak"] == processes
    assert 0 <= proc["cpu_s_root"] < proc["cpu_s"] / 2


def test_overhead_smoke(tmp_path: Path) -> None:
    # The default modes: the three, nginx where installed, and the gateway with two workers.
    result = run(overhead.main, tmp_path, "overhead")
    rows = rows_by_mode(result, modes=[*MODES, *NGINX, "gateway-w2"])
    check_skipped(result)
    for mode, row in rows.items():
        assert row["requests"] > 0 and row["requests_per_s"] > 0, mode
        assert row["failures"] == {} and row["bad_answers"] == 0, mode
        assert 0 < row["latency_p50_s"] <= row["latency_p99_s"], mode
    assert rows["direct"]["process"] is None
    for mode in ("naive", *NGINX, "gateway", "gateway-w2"):
        check_middle(rows[mode])
        assert rows[mode]["cpu_ms_per_request"] > 0
    check_tree(rows["gateway-w2"], 3)  # the supervisor and its two workers
    assert result["variants"]["gateway-w2"]["server_extra"].split() == ["workers", "=", "2"]
    if NGINX:
        check_tree(rows["nginx"], 2)  # the master and its worker


def test_a_scenario_with_the_gateways_spans_on(tmp_path: Path) -> None:
    """``--gateway-tracing``: the gateway serves with [tracing], exporting to a sink of its own
    (bench/otlp_sink.py), and answers as usual."""
    result = run(
        overhead.main, tmp_path, "overhead", ["--modes", "gateway", "--gateway-tracing", "1.0"]
    )
    row = rows_by_mode(result, modes=["gateway"])["gateway"]
    assert row["requests"] > 0 and row["failures"] == {}
    (logs,) = tmp_path.glob("overhead-*-logs")
    gateway_log = (logs / "gateway.log").read_text()
    assert "tracing: spans to http://127.0.0.1:" in gateway_log
    assert (logs / "otlp-sink.log").exists()


def test_stream_timing_smoke(tmp_path: Path) -> None:
    # With the filtered gateway too: a fourth mode, in the same run.
    result = run(stream_timing.main, tmp_path, "stream_timing", ["--filter-patterns", "50"])
    streams = result["config"]["streams"]
    modes = [*MODES, *NGINX, "gateway+filter"]
    rows = rows_by_mode(result, modes=modes)
    check_skipped(result)
    for mode, row in rows.items():
        assert row["completed"] == streams and row["failures"] == {}, mode
        assert 0 < row["ttft_p50_s"] <= row["ttft_p99_s"], mode
        assert row["gap_p99_s"] > 0 and row["events"] > streams * 2, mode
    for mode in ("naive", "gateway", "gateway+filter"):
        row = rows[mode]
        check_middle(row)
        assert row["cpu_us_per_chunk"] > 0
    if NGINX:
        # The smoke's 184 chunks cost nginx ~30 µs each: about half a tick, often none.
        check_middle(rows["nginx"], cpu_may_be_nil=True)
        assert rows["nginx"]["process"]["processes_peak"] == 2
    assert rows["gateway+filter"]["filter_patterns"] == 50
    assert any("filter ≤ 10 µs" in t["target"] for t in result["targets"])


def test_cancellation_smoke(tmp_path: Path) -> None:
    # The default modes, and the Responses WebSocket's two (asked for by name).
    ws = ["gateway-ws", "gateway-ws-close"]
    result = run(cancellation.main, tmp_path, "cancellation", ["--modes", ",".join([*MODES, *ws])])
    rows = rows_by_mode(result, "runs", [*MODES, *ws])
    for mode, row in rows.items():
        assert row["errors"] == [], mode
        assert row["stayers_complete"] == row["stayers"] > 0, mode
        assert row["leavers_left"] == row["leavers"] > 0, mode
    # What the scenario is about: the gateway passes each leave on, the naive proxy never does;
    # nor does a socket that is dropped or closed go unnoticed.
    for mode in ("gateway", *ws):
        assert rows[mode]["aborts"] == rows[mode]["leavers"], mode
        check_middle(rows[mode])
    assert rows["naive"]["aborts"] == 0
    assert rows["naive"]["generated_minus_delivered"] > rows["gateway"]["generated_minus_delivered"]
    assert any("beyond gateway" in t["target"] for t in result["targets"])


def test_scale_smoke(tmp_path: Path) -> None:
    result = run(scale.main, tmp_path, "scale")
    streams = result["config"]["streams"]
    rows = rows_by_mode(result)
    for mode, row in rows.items():
        assert row["completed"] == streams and row["failures"] == {}, mode
        assert row["max_open_streams"] >= streams, mode
        assert row["ttft_p99_s"] > 0 and row["leave_t_s"] is not None, mode
        assert row["leaver_tokens_before_leaving"] >= 1, mode
    # The leaver's close reaches the simulator directly and through the gateway, not through
    # the naive proxy; the time is measured across processes, so it is positive.
    assert rows["direct"]["cancel_to_abort_ms"] > 0
    assert rows["gateway"]["cancel_to_abort_ms"] > 0
    assert rows["naive"]["cancel_to_abort_ms"] is None
    for mode in ("naive", "gateway"):
        check_middle(rows[mode])
        assert rows[mode]["kib_per_open_stream"] is not None
        assert rows[mode]["process"]["fds_after"] > 0
        assert set(rows[mode]["connections_after"]) >= {"clients", "upstream"}


def test_slow_clients_smoke(tmp_path: Path) -> None:
    result = run(slow_clients.main, tmp_path, "slow_clients")
    cfg = result["config"]
    rows = rows_by_mode(result)
    for mode, row in rows.items():
        for phase in ("baseline", "mixed"):
            assert row[phase]["completed"] == cfg["normal"], (mode, phase)
            assert row[phase]["gap_p99_s"] > 0, (mode, phase)
        assert sum(row["slow_outcomes"].values()) == cfg["slow"], mode
    # The gateway drops its stalled clients and closes their upstreams; the naive proxy never
    # closes an upstream whose client stalled.
    gateway = rows["gateway"]
    assert gateway["gateway_client_stall_cancellations"] >= 1
    assert gateway["upstream_aborts"] >= 1
    assert rows["naive"]["upstream_aborts"] == 0
    check_middle(gateway)


def test_fleet_smoke(tmp_path: Path) -> None:
    # Its own runs instead of the three modes: one per routing policy, the ideal single
    # replica, and affinity with a replica killed and restarted (bench/fleet.py).
    result = run(fleet.main, tmp_path, "fleet")
    cfg = result["config"]
    rows = {row["run"]: row for row in result["rows"]}
    assert sorted(rows) == sorted(cfg["runs"])
    total = cfg["sessions"] * cfg["turns"]
    for name, row in rows.items():
        assert len(row["loadavg_before"]) == 3, name
        assert row["turns_completed"] == total and row["sessions_given_up"] == 0, name
        assert 0 < row["hit_rate"] < 1, name
        assert 0 < row["ttft_p50_s"] <= row["ttft_p99_s"], name
        assert row["load"]["samples"] > 0 and row["load"]["peak"] >= 1, name
        assert len(row["per_replica"]) == row["spec"]["replicas"], name
        if name != "affinity_kill":
            assert row["failures"] == {}, name
            # Every token the simulators served from cache reached a client's usage, and the
            # gateway's /metrics (scraped after the run) counts the same: exact, since probes
            # add queries but never hits.
            assert row["gateway_scraped_after"], name
            assert row["prompt_tokens_hit"] == row["client_cached_tokens"] > 0, name
            assert row["gateway_hits"] == row["prompt_tokens_hit"], name
    # The kill: the gateway takes the replica out of rotation and back, and every turn still
    # completes (a stream cut by the kill is retried by its client, as an agent would).
    kill = rows["affinity_kill"]["kill"]
    assert kill["kill_t_s"] < kill["out_of_rotation_t_s"]
    assert kill["ready_t_s"] < kill["back_in_rotation_t_s"]
    assert set(kill["errors_by_when"]) <= {"in flight at the kill"}


def test_stream_memory_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    # The tool behind D's memory analysis: the gateway under tracemalloc, held streams.
    assert stream_memory.main(["--streams", "5", "--top", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    head = out[0].split()
    assert head[:3] == ["5", "streams", "open;"] and float(head[4]) > 1.0  # KiB per stream
    assert len(out) == 4 and all("B/stream" in line for line in out[1:])


def test_priority_smoke(tmp_path: Path) -> None:
    result = run(priority.main, tmp_path, "priority")
    rows = {(row["config"], row["class"]): row for row in result["rows"]}
    assert ("idle", "high") in rows
    for config in ("off", "gateway", "gateway+vllm", "reserved"):
        for cls in ("high", "low"):
            row = rows[(config, cls)]
            assert row["requests"] > 0 and row["failures"] == {}, (config, cls)
            assert row["completed"] == row["requests"], (config, cls)
            assert 0 < row["ttft_p50_s"] <= row["ttft_p99_s"], (config, cls)


def test_ws_rollout_smoke(tmp_path: Path) -> None:
    # Scenario H (issue 41): rollouts over HTTP and over the Responses WebSocket, each mode
    # twice, alternating; every rollout completes, and the socket sends far fewer bytes.
    result = run(ws_rollout.main, tmp_path, "ws_rollout")
    rows = result["rows"]
    assert [row["mode"] for row in rows] == ["http", "ws", "http", "ws"]
    for row in rows:
        assert row["completed"] == row["rollouts"] and not row["errors"], row["errors"]
        assert row["turns"] == row["rollouts"] * 4  # three calls and the answer
        assert row["ttft_p50_s"] > 0 and row["cpu_s"] is not None
        check_middle(row, cpu_may_be_nil=True)
    sent = {row["mode"]: row["sent_kib_per_rollout"] for row in rows}
    assert sent["ws"] < sent["http"]
