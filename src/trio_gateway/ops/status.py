"""The status page: what an operator looks at instead of Prometheus text.

``GET /`` and ``GET /status`` serve one static HTML page (no build step, one small script) that
reads ``GET /status.json`` every two seconds. The JSON holds, per provider, its probe state and
gate (in flight / max_inflight, queued) as of now, and requests, errors, spills and time to
first token over the last :data:`WINDOW_S` seconds, from :class:`RecentStats`.

:class:`RecentStats` is fed once per request (``relay.record``) and once per spill
(``pipeline``), never per chunk, and keeps a bounded ring of buckets per provider.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from trio_gateway.core.budget_period import period_of
from trio_gateway.ops.metrics import ProviderGauges

BUCKET_S = 10.0
WINDOW_S = 300.0
_BUCKETS = int(WINDOW_S // BUCKET_S)


@attrs.define
class _Bucket:
    index: int = -1  # which BUCKET_S slice of time it holds; -1: none yet
    requests: int = 0
    errors: int = 0
    spills_out: int = 0
    ttft_sum_s: float = 0.0
    ttft_count: int = 0
    ttft_max_s: float = 0.0


class RecentStats:
    """Per provider, a ring of :data:`_BUCKETS` buckets: memory is bounded by the number of
    providers in the config (a name not configured is ignored)."""

    def __init__(self, providers: Iterable[str]) -> None:
        self._rings = {name: [_Bucket() for _ in range(_BUCKETS)] for name in providers}

    def keeping(self, providers: Iterable[str]) -> RecentStats:
        """The stats of a reloaded config: a provider that stays keeps its minutes."""
        out = RecentStats(())
        out._rings = {
            name: self._rings.get(name) or [_Bucket() for _ in range(_BUCKETS)]
            for name in providers
        }
        return out

    def _bucket(self, provider: str, now: float) -> _Bucket | None:
        ring = self._rings.get(provider)
        if ring is None:
            return None
        index = int(now // BUCKET_S)
        bucket = ring[index % _BUCKETS]
        if bucket.index != index:
            bucket = ring[index % _BUCKETS] = _Bucket(index=index)
        return bucket

    def request(self, provider: str, now: float, *, error: bool, ttft_s: float | None) -> None:
        bucket = self._bucket(provider, now)
        if bucket is None:
            return
        bucket.requests += 1
        bucket.errors += int(error)
        if ttft_s is not None:
            bucket.ttft_sum_s += ttft_s
            bucket.ttft_count += 1
            bucket.ttft_max_s = max(bucket.ttft_max_s, ttft_s)

    def spill(self, provider: str, now: float) -> None:
        """A request moved on from ``provider`` (saturated)."""
        if (bucket := self._bucket(provider, now)) is not None:
            bucket.spills_out += 1

    def summary(self, provider: str, now: float) -> dict[str, object]:
        first = int(now // BUCKET_S) - _BUCKETS + 1
        live = [b for b in self._rings.get(provider, []) if b.index >= first]
        count = sum(b.ttft_count for b in live)
        return {
            "requests": sum(b.requests for b in live),
            "errors": sum(b.errors for b in live),
            "spills": sum(b.spills_out for b in live),
            "ttft_avg_ms": None
            if count == 0
            else round(sum(b.ttft_sum_s for b in live) / count * 1000, 1),
            "ttft_max_ms": None if count == 0 else round(max(b.ttft_max_s for b in live) * 1000, 1),
        }


# Keys whose cost today is kept (a key of the keys file; the file is bounded, this bounds it
# against a file of very many keys): past it, a new key is not counted until tomorrow.
MAX_KEYS_TODAY = 10_000


class TodaySpend:
    """Each key's cost on the current UTC day, for the status page's top keys: fed once per
    request (``relay.record``), seeded at start from the ledger, renewed at midnight UTC."""

    def __init__(self) -> None:
        self.day = ""  # the UTC day's period id ("day:2026-12-03")
        self._by_key: dict[str, int] = {}

    def _today(self, at: float) -> bool:
        """Move to ``at``'s day if it is a later one; False for an earlier day (a request
        that started yesterday and ended today counts for yesterday)."""
        day = period_of("day", at).id
        if day > self.day:
            self.day, self._by_key = day, {}
        return day == self.day

    def seed(self, at: float, by_key: Mapping[str, int]) -> None:
        """The ledger's costs of ``at``'s day (before this process, and records of it)."""
        if self._today(at):
            for key, cost in list(by_key.items())[:MAX_KEYS_TODAY]:
                self._by_key[key] = self._by_key.get(key, 0) + cost

    def add(self, key: str, cost: int, started_at: float) -> None:
        if not self._today(started_at):
            return
        if key in self._by_key or len(self._by_key) < MAX_KEYS_TODAY:
            self._by_key[key] = self._by_key.get(key, 0) + cost

    def top(self, now: float, count: int) -> list[tuple[str, int]]:
        """The ``count`` keys that cost most today, dearest first (by name among equals)."""
        if not self._today(now):
            return []
        ranked = sorted(self._by_key.items(), key=lambda item: (-item[1], item[0]))
        return ranked[:count]


@attrs.frozen(kw_only=True)
class BudgetLine:
    """One key with a budget, as the keys panel shows it (amounts in nanos)."""

    name: str
    budget: int
    period: str  # day, week, month, none
    spent: int | None  # None: where spend lives did not answer
    renews_at: str | None  # ISO 8601 UTC; None: never (a budget for the key's life)


def _units(amount_nanos: int) -> float:
    return round(amount_nanos / 1e9, 9)


def keys_panel(
    lines: Iterable[BudgetLine],
    top_today: Iterable[tuple[str, int]],
    *,
    where: str,
    problem: str | None,
) -> dict[str, object]:
    """The status page's keys: each budget's spend in its period (the most spent share first),
    and today's dearest keys."""

    def share(line: BudgetLine) -> float:
        return -1.0 if line.spent is None else line.spent / max(line.budget, 1)

    return {
        "spend_lives": where,
        "problem": problem,
        "budgets": [
            {
                "name": line.name,
                "budget": _units(line.budget),
                "period": line.period,
                "spent": None if line.spent is None else _units(line.spent),
                "remaining": None
                if line.spent is None
                else _units(max(line.budget - line.spent, 0)),
                "renews_at": line.renews_at,
            }
            for line in sorted(lines, key=lambda line: (-share(line), line.name))
        ],
        "top_today": [{"name": name, "cost": _units(cost)} for name, cost in top_today],
    }


def status_document(
    *,
    aliases: Mapping[str, list[str]],
    gauges: Iterable[ProviderGauges],
    recent: RecentStats,
    now: float,
    ready: bool,
    draining: bool,
) -> dict[str, object]:
    providers = {}
    for g in gauges:
        providers[g.provider] = {
            "state": g.state,
            "cooling_down": g.cooling_down,
            "in_flight": g.in_flight,
            "max_inflight": g.max_inflight,
            "queued": g.queued,
            "upstream_load": g.upstream_load,
            "last_error": g.last_error,
            **recent.summary(g.provider, now),
        }
    return {
        "status": "draining" if draining else "ready" if ready else "not_ready",
        "window_s": WINDOW_S,
        "aliases": {alias: list(names) for alias, names in aliases.items()},
        "providers": providers,
    }


# One page, one small script; readable on a phone (it reflows to one column). It holds no data:
# it reads status.json, with the admin key the operator typed, kept in this tab's sessionStorage
# (gone when the tab closes; never in a cookie, so never sent with anything else).
PAGE = b"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>trio-gateway status</title>
<style>
body{font:15px/1.4 system-ui,sans-serif;margin:1rem;color:#222;background:#fafafa}
h1{font-size:1.3rem;margin:0 0 .5rem} .muted{color:#777;font-size:.85rem}
table{border-collapse:collapse;width:100%;margin:.5rem 0 1.5rem;background:#fff}
th,td{padding:.35rem .5rem;border-bottom:1px solid #ddd;text-align:left}
th{font-size:.8rem;color:#555;text-transform:uppercase}
.state-healthy{color:#176f2c;font-weight:600} .state-unhealthy{color:#b00020;font-weight:600}
.state-starting{color:#8a6d00;font-weight:600} .state-unreachable{color:#b00020;font-weight:600}
.bar{height:.5rem;background:#e3e3e3;border-radius:.25rem;min-width:4rem}
.bar>span{display:block;height:100%;background:#3b6fd8;border-radius:.25rem}
.bar.spent>span{background:#d8823b}
#overall.draining,#overall.not_ready{color:#b00020} #overall.ready{color:#176f2c}
#login{background:#fff;border:1px solid #ddd;padding:1rem;max-width:30rem}
#login input{width:100%;box-sizing:border-box;padding:.4rem;margin:.5rem 0}
@media (max-width:600px){thead{display:none}tr{display:block;border-bottom:2px solid #ccc}
td{display:flex;justify-content:space-between;border:0}td::before{content:attr(data-label);
color:#555;font-size:.8rem;text-transform:uppercase;margin-right:1rem}}
</style></head><body>
<h1>trio-gateway <span id="overall">&hellip;</span></h1>
<form id="login" hidden><label for="key">Admin key</label>
<input id="key" type="password" autocomplete="off" placeholder="tgw-...">
<button type="submit">Show status</button><p id="login-why" class="muted"></p>
<p class="muted">Kept in this tab only (sessionStorage), until the tab closes.</p></form>
<div class="muted" id="legend" hidden>in flight and queued: now; requests, errors, spills, TTFT:
last <span id="window">5</span> minutes. <span id="updated"></span>
<a href="#" id="forget" hidden>forget the key</a></div>
<div id="aliases"></div>
<div id="keys"></div>
<script>
const STORE = "trio-gateway-admin-key";
const login = document.getElementById("login"), input = document.getElementById("key");
function cell(row, label, text, cls) {
  const td = row.insertCell(); td.dataset.label = label; td.textContent = text;
  if (cls) td.className = cls; return td;
}
function bar(used, cls) {
  const outer = document.createElement("div"), fill = document.createElement("span");
  outer.className = "bar" + (cls ? " " + cls : "");
  fill.style.width = Math.max(0, Math.min(100, used)) + "%"; outer.append(fill); return outer;
}
function table(root, heads) {
  const t = document.createElement("table");
  t.createTHead().innerHTML = "<tr>" + heads.map(h => "<th>" + h + "</th>").join("") + "</tr>";
  root.append(t); return t.createTBody();
}
function askForKey(why) {
  login.hidden = false; document.getElementById("legend").hidden = true;
  document.getElementById("login-why").textContent = why;
  document.getElementById("aliases").replaceChildren();
  document.getElementById("keys").replaceChildren();
}
login.addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(STORE, input.value.trim()); input.value = ""; refresh();
});
document.getElementById("forget").addEventListener("click", (event) => {
  event.preventDefault(); sessionStorage.removeItem(STORE); askForKey("");
});
async function refresh() {
  const key = sessionStorage.getItem(STORE);
  const headers = key ? {authorization: "Bearer " + key} : {};
  let response;
  try { response = await fetch("status.json", {cache: "no-store", headers: headers}); }
  catch (e) { document.getElementById("updated").textContent = "gateway unreachable"; return; }
  if (response.status === 401 || response.status === 403) {
    const said = (await response.json()).error.message;
    askForKey(key ? said : "This gateway shows its status to an admin key (admin = true).");
    return;
  }
  const doc = await response.json();
  login.hidden = true; document.getElementById("legend").hidden = false;
  document.getElementById("forget").hidden = !key;
  render(doc);
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
}
function render(doc) {
  const overall = document.getElementById("overall");
  overall.textContent = doc.status; overall.className = doc.status;
  document.getElementById("window").textContent = Math.round(doc.window_s / 60);
  const root = document.getElementById("aliases"); root.replaceChildren();
  for (const [alias, names] of Object.entries(doc.aliases)) {
    const h = document.createElement("h2"); h.textContent = alias; root.append(h);
    const body = table(root, ["provider", "state", "in flight", "", "queued", "requests",
                              "errors", "spills", "TTFT avg / max"]);
    for (const name of names) {
      const p = doc.providers[name], row = body.insertRow();
      row.dataset.provider = name;
      cell(row, "provider", name);
      const state = p.state + (p.cooling_down ? " (cooling down)" : "");
      const stateCell = cell(row, "state", state, "state state-" + p.state);
      if (p.last_error && p.state !== "healthy") stateCell.title = p.last_error;
      cell(row, "in flight", p.in_flight + " / " + p.max_inflight, "in-flight");
      cell(row, "load", "").append(bar(100 * p.in_flight / Math.max(1, p.max_inflight)));
      cell(row, "queued", p.queued);
      cell(row, "requests", p.requests);
      cell(row, "errors", p.errors);
      cell(row, "spills", p.spills);
      const ttft = p.ttft_avg_ms === null ? "-" : p.ttft_avg_ms + " / " + p.ttft_max_ms + " ms";
      cell(row, "TTFT", ttft);
    }
  }
  const keys = document.getElementById("keys"); keys.replaceChildren();
  if (!doc.keys) return;
  const h = document.createElement("h2"); h.textContent = "Keys"; keys.append(h);
  const where = document.createElement("div"); where.className = "muted";
  where.textContent = "spend lives in " + doc.keys.spend_lives +
    (doc.keys.problem ? " (not readable now: " + doc.keys.problem + ")" : "");
  keys.append(where);
  const budgets = table(keys, ["key", "period", "spent", "", "budget", "remaining", "renews"]);
  for (const b of doc.keys.budgets) {
    const row = budgets.insertRow(); row.dataset.key = b.name;
    cell(row, "key", b.name);
    cell(row, "period", b.period);
    cell(row, "spent", b.spent === null ? "?" : b.spent.toFixed(6));
    cell(row, "share", "").append(bar(100 * (b.spent || 0) / Math.max(b.budget, 1e-9), "spent"));
    cell(row, "budget", b.budget);
    cell(row, "remaining", b.remaining === null ? "?" : b.remaining.toFixed(6));
    cell(row, "renews", b.renews_at || "never");
  }
  const top = document.createElement("h3"); top.textContent = "Top keys by cost today (UTC)";
  keys.append(top);
  const today = table(keys, ["key", "cost"]);
  for (const t of doc.keys.top_today) {
    const row = today.insertRow(); row.dataset.topKey = t.name;
    cell(row, "key", t.name); cell(row, "cost", t.cost.toFixed(6));
  }
}
refresh(); setInterval(refresh, 2000);
</script></body></html>
"""
