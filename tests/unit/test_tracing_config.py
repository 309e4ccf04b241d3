"""``[tracing]`` in gateway.toml: off without the section, every mistake said with its path,
header values from the environment and never in a repr, a restart to change it."""

from __future__ import annotations

import pytest

from tests.unit.test_config import GOOD, problems
from trio_gateway.config import tracing_checks
from trio_gateway.config.load import parse_config
from trio_gateway.config.reload_plan import fixed_changes

ENV = {"VLLM_API_KEY": "k", "OTLP_TOKEN": "Bearer s3cret-token"}
TRACING = """
[tracing]
otlp_endpoint = "http://otel-collector:4318/v1/traces"
"""


def test_tracing_is_off_without_the_section() -> None:
    config = parse_config(GOOD, environ=ENV)
    assert config.tracing is None and config.tracing_headers == {}


def test_defaults_and_header_values_from_the_environment() -> None:
    config = parse_config(
        GOOD + TRACING + '[tracing.headers]\nauthorization = "OTLP_TOKEN"\n', environ=ENV
    )
    tracing = config.tracing
    assert tracing is not None
    assert (tracing.sample_ratio, tracing.service_name, tracing.capture_content) == (
        1.0,
        "trio-gateway",
        False,
    )
    assert (tracing.max_queued_spans, tracing.max_batch_spans) == (2048, 512)
    assert config.tracing_headers["authorization"].value == "Bearer s3cret-token"
    assert "s3cret" not in repr(config)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ('otlp_endpoint = "otel-collector:4318"\n', "tracing.otlp_endpoint: expected an http"),
        ("sample_ratio = 1.5\n", "tracing.sample_ratio: must be from 0 to 1"),
        ('sample_ratio = "all"\n', "tracing.sample_ratio: expected a number"),
        ('service_name = ""\n', "tracing.service_name: must not be empty"),
        ("max_queued_spans = 0\n", "tracing.max_queued_spans: must be at least 1"),
        ("export_timeout_s = 0\n", "tracing.export_timeout_s: must be greater than 0"),
        ("capture_contents = true\n", "tracing: unknown key 'capture_contents' (did you mean"),
        (
            '[tracing.headers]\nauthorization = "NOT_SET"\n',
            "tracing.headers.authorization: environment variable 'NOT_SET' is not set",
        ),
        (
            '[tracing.headers]\n"bad name" = "OTLP_TOKEN"\n',
            "tracing.headers.bad name: not an HTTP header name",
        ),
    ],
)
def test_each_mistake_is_named_by_its_path(extra: str, expected: str) -> None:
    text = GOOD + "\n[tracing]\n" + extra
    if "otlp_endpoint" not in extra:
        text = GOOD + TRACING + extra
    found = problems(text, ENV)
    assert any(p.startswith(expected) for p in found), found


def test_a_header_value_is_never_shown_even_when_refused() -> None:
    env = ENV | {"OTLP_TOKEN": "Bearer s3cret\r\ninjected: 1"}
    found = problems(GOOD + TRACING + '[tracing.headers]\nauthorization = "OTLP_TOKEN"\n', env)
    assert found == ["tracing.headers.authorization: 'OTLP_TOKEN' holds a line break"]


def test_without_the_sdk_the_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing_checks, "TRACING_MODULES", ("opentelemetry.not_there",))
    [found] = problems(GOOD + TRACING, ENV)
    assert found.endswith("pip install '.[tracing]' in the checkout")


def test_a_reload_cannot_change_tracing() -> None:
    old = parse_config(GOOD, environ=ENV)
    new = parse_config(GOOD + TRACING, environ=ENV)
    assert fixed_changes(old, new) == [
        "tracing: changed (unset -> TracingConfig(otlp_endpoint='http://otel-collector:4318/v"
        "...); a restart applies it"
    ]
