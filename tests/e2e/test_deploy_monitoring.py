"""deploy/grafana/ and deploy/prometheus/: the dashboard and the alert rules are valid PromQL,
well formed, and name only metrics that a running gateway exports."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import promql_parser
import trio
import yaml

from tests.e2e.deploy_files import ALERTS, DASHBOARD
from tests.e2e.deploy_fleet import fleet
from tests.e2e.harness import FAST_SIM, chat, script

# Metrics the dashboard reads from elsewhere (the kubelet's cAdvisor), not from the gateway.
FOREIGN_METRICS = frozenset({"container_cpu_usage_seconds_total"})
GATEWAY_METRIC = re.compile(r"(?<![A-Za-z0-9_])gateway_[a-z0-9_]+")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
TIMEOUT_S = 20


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    assert exprs
    return exprs


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    rules: list[dict[str, Any]] = [rule for group in groups for rule in group["rules"]]
    assert rules
    return rules


def promql(expr: str) -> promql_parser.Expr:
    """Parsed, with Grafana's interval variables replaced by a duration (the label variables
    sit in quoted matchers, already valid PromQL)."""
    return promql_parser.parse(re.sub(r"\$__(rate_interval|interval|range)", "5m", expr))


def selectors(expr: promql_parser.Expr) -> set[str]:
    names: set[str] = set()

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)

    promql_parser.walk(expr, visit)
    return names


def test_dashboard_and_alerts_are_valid_promql() -> None:
    for expr in [*dashboard_expressions(), *(rule["expr"] for rule in alert_rules())]:
        names = selectors(promql(expr))
        assert names, expr
        # Every metric is the gateway's (checked against /metrics below) or a known other one:
        # a misspelt name would otherwise just draw an empty panel.
        assert all(GATEWAY_METRIC.fullmatch(n) or n in FOREIGN_METRICS for n in names), names


def test_alert_rules_are_complete() -> None:
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_dashboard_panels_are_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            refs = [t["refId"] for t in panel["targets"]]
            assert len(refs) == len(set(refs)), panel["title"]


def exposed_families(page: str) -> dict[str, str]:
    """Metric family names (as exposed: counters with `_total`) and their types."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", page, flags=re.MULTILINE))


def used_metrics() -> set[str]:
    used: set[str] = set()
    for path in (DASHBOARD, ALERTS):
        used |= set(GATEWAY_METRIC.findall(path.read_text()))
    return used


async def test_every_metric_used_exists_in_a_running_gateway() -> None:
    used = used_metrics()
    assert len(used) > 20, used
    with trio.fail_after(TIMEOUT_S):
        async with fleet(FAST_SIM, probe=True) as (gateway, _, _), httpx.AsyncClient() as client:
            metrics_url = gateway.base_url + "/metrics"

            async def page() -> str:
                return (await client.get(metrics_url)).text

            # Both replicas probed and scraped: the per-replica and scraped families have
            # samples, not only names.
            text = ""
            while text.count("gateway_upstream_kv_cache_usage{") < 2:
                text = await page()
                await trio.sleep(0.05)
            # Requests (a long prompt twice, so the prefix cache hits), so counters and
            # histograms have samples too.
            long_prompt = " ".join(f"word{i}" for i in range(300))
            for _ in range(2):
                response = await client.post(
                    gateway.base_url + "/v1/chat/completions",
                    json=chat(long_prompt + script({"text": "ok"}), stream=True),
                    headers={"x-session-id": "metrics"},
                )
                assert response.status_code == 200
            while "gateway_prefix_cache_hit_ratio{" not in text or (
                "gateway_time_to_first_token_seconds_bucket{" not in text
            ):
                text = await page()
                await trio.sleep(0.05)
    families = exposed_families(text)
    missing = set()
    for name in used:
        family = name
        for suffix in HISTOGRAM_SUFFIXES:
            if name.endswith(suffix) and families.get(name.removesuffix(suffix)) == "histogram":
                family = name.removesuffix(suffix)
        if family not in families:
            missing.add(name)
    assert not missing, f"used in deploy/ but not exported: {sorted(missing)}"
