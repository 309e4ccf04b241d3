"""The value checks of ``[tracing]`` (docs/configuration.md, "[tracing]")."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from trio_gateway.config.schema import TracingConfig

# An HTTP header's name (RFC 9110's token).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# What the exporter needs: the `tracing` extra (pyproject.toml).
TRACING_MODULES = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
TRACING_EXTRA = "pip install '.[tracing]' in the checkout"


def tracing_installed() -> bool:
    """Whether the OpenTelemetry SDK and OTLP/HTTP exporter can be imported."""
    try:
        return all(importlib.util.find_spec(name) is not None for name in TRACING_MODULES)
    except ModuleNotFoundError:  # a parent package is missing
        return False


def tracing_problems(tracing: TracingConfig | None, environ: Mapping[str, str] | None) -> list[str]:
    """``environ`` None: the headers' secrets are not read, so not checked."""
    if tracing is None:
        return []
    problems = []
    url = urlsplit(tracing.otlp_endpoint)
    if url.scheme not in ("http", "https") or not url.hostname:
        problems.append(
            "tracing.otlp_endpoint: expected an http:// or https:// URL, the collector's "
            f"traces endpoint (http://otel-collector:4318/v1/traces); got {tracing.otlp_endpoint!r}"
        )
    for name, env in tracing.headers.items():
        if _HEADER_NAME.fullmatch(name) is None:
            problems.append(f"tracing.headers.{name}: not an HTTP header name")
        if environ is None:
            continue
        value = environ.get(env)
        if not value:
            problems.append(f"tracing.headers.{name}: environment variable {env!r} is not set")
        elif "\r" in value or "\n" in value:
            # The value itself is never shown.
            problems.append(f"tracing.headers.{name}: {env!r} holds a line break")
    if not 0.0 <= tracing.sample_ratio <= 1.0:
        problems.append("tracing.sample_ratio: must be from 0 to 1")
    if not tracing.service_name:
        problems.append("tracing.service_name: must not be empty")
    for key in ("max_queued_spans", "max_batch_spans"):
        if getattr(tracing, key) < 1:
            problems.append(f"tracing.{key}: must be at least 1")
    for key in ("export_interval_s", "export_timeout_s"):
        if not getattr(tracing, key) > 0:
            problems.append(f"tracing.{key}: must be greater than 0")
    if not tracing_installed():
        problems.append(
            "tracing: needs the OpenTelemetry SDK and its OTLP/HTTP exporter, which are not "
            f"installed: {TRACING_EXTRA}"
        )
    return problems
