"""deploy/systemd/ and deploy/Containerfile fit what the gateway does: SIGHUP reloads, sd_notify,
the drain within the stop timeout; its port, user, command line and config path."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.e2e.deploy_files import (
    BASE,
    CONTAINERFILE,
    DRAIN_MARGIN_S,
    ROOT,
    SYSTEMD_UNIT,
    container,
    listen_port,
    parsed_gateway_config,
    resource,
)


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in SYSTEMD_UNIT.read_text().splitlines():
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_the_systemd_unit_fits_what_the_gateway_handles(tmp_path: Path) -> None:
    settings = unit_settings()
    cli = (ROOT / "src" / "trio_gateway" / "cli" / "main.py").read_text()
    sources = "\n".join(p.read_text() for p in (ROOT / "src").rglob("*.py"))
    # SIGHUP's default action ends the process without a drain: a reload may send it only
    # because the gateway handles it, through `trio-gateway reload`, which checks the file
    # first, for the unit's main process.
    assert "signal.SIGHUP" in cli
    (reload,) = settings["ExecReload"]
    assert reload.split()[1:] == [
        "reload",
        "--config",
        "/etc/trio-gateway/gateway.toml",
        "--pid",
        "$MAINPID",
    ]
    # Type=notify would wait forever for a READY=1 a gateway that does not notify never sends.
    if "NOTIFY_SOCKET" not in sources:
        assert settings["Type"] != ["notify"]
    else:
        assert settings["Type"] == ["notify"] and settings["NotifyAccess"] == ["main"]
    assert settings["KillSignal"] == ["SIGTERM"]
    (exec_start,) = settings["ExecStart"]
    assert exec_start.split()[1:3] == ["serve", "--config"]
    # Long enough for the drain of the Kubernetes example's config (60 s), with the margin.
    config = parsed_gateway_config(tmp_path)
    stop_s = int(settings["TimeoutStopSec"][0].removesuffix("s"))
    assert stop_s >= config.server.drain_timeout_s + DRAIN_MARGIN_S
    assert int(settings["LimitNOFILE"][0]) >= 16384
    assert settings["NoNewPrivileges"] == ["yes"]
    assert settings["ProtectSystem"] == ["strict"]


def test_the_containerfile_runs_the_gateway_as_deployed(tmp_path: Path) -> None:
    text = CONTAINERFILE.read_text()
    config = parsed_gateway_config(tmp_path)
    assert "FROM python:3.11-slim" in text
    assert 'ENTRYPOINT ["trio-gateway"]' in text
    assert f"EXPOSE {listen_port(config.server.listen)}" in text
    user = re.search(r"^USER (\d+):(\d+)$", text, flags=re.MULTILINE)
    assert user is not None and int(user.group(1)) != 0
    cmd_line = re.search(r"^CMD (\[.*\])$", text, flags=re.MULTILINE)
    assert cmd_line is not None
    cmd = json.loads(cmd_line.group(1))
    deployment = resource(BASE, "Deployment", "trio-gateway")
    assert cmd[:3] == container(deployment)["args"][:3]
    # What it copies is what `pip install .` needs.
    for copied in ("pyproject.toml", "README.md", "src"):
        assert (ROOT / copied).exists()
