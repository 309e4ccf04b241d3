"""What a reload may change (reload.py) and which processes `trio-gateway reload` signals."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from trio_gateway.cli.reload import serve_config
from trio_gateway.config.load import parse_config
from trio_gateway.config.reload_plan import Change, fixed_changes, plan_reload, provider_change
from trio_gateway.config.schema import ProviderConfig

BASE = ProviderConfig(name="vllm", type="openai_compatible", model="m", base_url="http://a/v1")


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, Change.SAME),
        ({"weight": 0}, Change.RESIZED),
        ({"max_inflight": 4}, Change.RESIZED),
        ({"queue_timeout_s": 9.0}, Change.RESIZED),
        ({"weight": 5, "max_inflight": 64, "queue_timeout_s": 0.5}, Change.RESIZED),
        ({"base_url": "http://b/v1"}, Change.REPLACED),
        ({"model": "other"}, Change.REPLACED),
        ({"idle_timeout_s": 1.0}, Change.REPLACED),
        ({"weight": 5, "probe": False}, Change.REPLACED),
        ({"endpoints": ("http://a/v1", "http://c/v1"), "base_url": None}, Change.REPLACED),
    ],
)
def test_provider_change(changes: dict[str, Any], expected: Change) -> None:
    assert provider_change(BASE, attrs.evolve(BASE, **changes)) is expected


def test_plan_sorts_every_provider_into_one_case() -> None:
    def named(name: str, **changes: Any) -> ProviderConfig:
        return attrs.evolve(BASE, name=name, **changes)

    old = {n: named(n) for n in ("same", "resized", "replaced", "removed")}
    new = {
        "same": named("same"),
        "resized": named("resized", weight=1),
        "replaced": named("replaced", model="x"),
        "added": named("added"),
    }
    plan = plan_reload(old, new)
    assert plan.same == ("same",)
    assert plan.resized == ("resized",)
    assert plan.replaced == ("replaced",)
    assert plan.added == ("added",)
    assert plan.removed == ("removed",)
    assert plan.summary() == (
        "1 added (added), 1 removed (removed), 1 replaced (replaced), 1 resized (resized), "
        "1 unchanged"
    )


ALIAS = """
[aliases.a]
[[aliases.a.providers]]
name = "p"
type = "openai_compatible"
base_url = "http://h/v1"
model = "m"
"""


def config(head: str = "", alias: str = ALIAS) -> object:
    return parse_config(head + alias, source="t.toml", environ={})


@pytest.mark.parametrize(
    ("head", "problems"),
    [
        ("", []),
        (
            '[server]\nlisten = "127.0.0.1:9"\n',
            ["server.listen: changed ('127.0.0.1:8080' -> '127.0.0.1:9'); a restart applies it"],
        ),
        (
            "[server]\ndrain_timeout_s = 5.0\nmax_body_bytes = 10\n",
            [
                "server.max_body_bytes: changed (4194304 -> 10); a restart applies it",
                "server.drain_timeout_s: changed (30.0 -> 5.0); a restart applies it",
            ],
        ),
        (
            "[websocket]\nmax_sockets = 3\n",
            ["websocket.max_sockets: changed (1000 -> 3); a restart applies it"],
        ),
        # A Redis URL may hold a password: named, never shown.
        (
            '[redis]\nurl = "redis://:hunter2@h:6379/0"\n',
            ["redis: changed; a restart applies it"],
        ),
        (
            "[auth]\nopen = true\n",
            [
                "auth: changed between keys and open; a restart applies it (a keys file's "
                "content and path reload)"
            ],
        ),
    ],
)
def test_fixed_changes_name_each_path(head: str, problems: list[str]) -> None:
    old, new = config(), config(head)
    assert fixed_changes(old, new) == problems  # type: ignore[arg-type]


def test_alias_changes_are_not_fixed() -> None:
    other = ALIAS.replace('model = "m"', 'model = "n"\nweight = 3') + ALIAS.replace(
        "aliases.a", "aliases.b"
    ).replace('name = "p"', 'name = "q"')
    assert fixed_changes(config(), config(alias=other)) == []  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["/srv/.venv/bin/trio-gateway", "serve"], "gateway.toml"),
        (
            ["/srv/.venv/bin/python", "/srv/.venv/bin/trio-gateway", "serve", "--config", "x.toml"],
            "x.toml",
        ),
        (["python3", "-m", "trio_gateway", "serve", "--config=/etc/g.toml"], "/etc/g.toml"),
        (["trio-gateway", "serve", "--log-level", "debug", "--config", "a.toml"], "a.toml"),
        (
            ["python3", "-m", "trio_gateway", "serve", "--config", "a.toml", "--worker-fd", "3"],
            None,
        ),
        (["trio-gateway", "check", "a.toml"], None),
        (["trio-gateway", "sim"], None),
        (["python3", "-m", "http.server"], None),
        (["vim", "gateway.toml"], None),
        # A command that runs the gateway passes signals on: only the gateway is signalled.
        (["timeout", "25", ".venv/bin/trio-gateway", "serve"], None),
        (["strace", "-f", "python3", "-m", "trio_gateway", "serve"], None),
        (["python3", "-X", "dev", "-m", "trio_gateway", "serve"], "gateway.toml"),
        ([], None),
    ],
)
def test_serve_config_reads_a_command_line(argv: list[str], expected: str | None) -> None:
    assert serve_config(argv) == expected
