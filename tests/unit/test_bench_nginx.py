"""The ``nginx`` and ``gateway-w2`` modes of scenarios A and B (issue 33): nginx's generated
config, which scenario runs which mode, and what happens where nginx is not installed. The
runs themselves are in tests/e2e/test_bench_smoke.py."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from bench import harness, nginx_proxy, overhead, scale, stream_timing
from bench.harness import GatewaySettings
from bench.nginx_proxy import NginxSettings, nginx_argv, nginx_conf

from trio_gateway.config.load import parse_config


def settings(prefix: Path) -> NginxSettings:
    return NginxSettings(
        listen_port=18000,
        upstream_port=18001,
        keepalive=64,
        prefix=prefix,
        access_log=prefix / "logs" / "access.log",
    )


def directives(conf: str) -> list[str]:
    """The config's statements, comments left out, one space between words."""
    lines = (line.split("#", 1)[0].strip() for line in conf.splitlines())
    return [" ".join(line.split()) for line in lines if line]


def test_the_config_is_a_pass_through_proxy_of_one_worker(tmp_path: Path) -> None:
    found = directives(nginx_conf(settings(tmp_path)))
    for wanted in (
        "daemon off;",
        "master_process on;",
        "worker_processes 1;",
        f"access_log {tmp_path}/logs/access.log;",
        "server 127.0.0.1:18001;",
        "keepalive 64;",
        "listen 127.0.0.1:18000;",
        "proxy_pass http://engine;",
        "proxy_http_version 1.1;",
        'proxy_set_header Connection "";',
        "proxy_buffering off;",
    ):
        assert wanted in found, wanted


def test_every_path_nginx_writes_is_the_runs_own(tmp_path: Path) -> None:
    conf = nginx_conf(settings(tmp_path))
    words = [w.rstrip(";") for line in directives(conf) for w in line.split()]
    paths = [w for w in words if w.startswith("/") and w != "/"]  # not `location /`
    assert len(paths) == 7  # pid, access log, five temp directories
    assert all(p.startswith(str(tmp_path)) for p in paths), paths
    # Nothing goes to the default error log (root's) before the config is read either.
    argv = nginx_argv(tmp_path / "nginx.conf", tmp_path)
    assert argv[argv.index("-e") + 1] == "stderr"


@pytest.mark.skipif(nginx_proxy.missing() is not None, reason=str(nginx_proxy.missing()))
def test_nginx_accepts_the_config(tmp_path: Path) -> None:
    conf = tmp_path / "nginx.conf"
    conf.write_text(nginx_conf(settings(tmp_path)))
    (tmp_path / "logs").mkdir()
    argv = nginx_argv(conf, tmp_path)
    result = subprocess.run([*argv, "-t"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


@pytest.fixture
def nginx_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nginx_proxy, "NGINX", Path(sys.executable))


@pytest.fixture
def nginx_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(nginx_proxy, "NGINX", tmp_path / "no-nginx")


@pytest.mark.usefixtures("nginx_installed")
def test_a_runs_five_modes_and_b_four_by_default() -> None:
    common, _ = overhead.parse([])
    assert common.modes == ("direct", "naive", "nginx", "gateway", "gateway-w2")
    assert common.skipped == {}
    common, _ = stream_timing.parse([])
    assert common.modes == ("direct", "naive", "nginx", "gateway")
    common, _ = scale.parse([])
    assert common.modes == harness.MODES
    common, _ = scale.parse(["--modes", "gateway,gateway-w2"])  # two workers when asked
    assert common.modes == ("gateway", "gateway-w2")


@pytest.mark.usefixtures("nginx_installed")
@pytest.mark.parametrize(
    ("parse", "mode", "where"),
    [
        (scale.parse, "nginx", "nginx runs in A and B"),
        (stream_timing.parse, "gateway-w2", "gateway-w2 runs in A and D (overhead, scale) only"),
        (overhead.parse, "gateway-w3", "choose from direct, naive, nginx, gateway, gateway-w2"),
    ],
)
def test_a_scenario_refuses_a_mode_it_does_not_run(
    parse: Callable[[Sequence[str]], object],
    mode: str,
    where: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse(["--modes", f"direct,{mode}"])
    assert where in capsys.readouterr().err


@pytest.mark.usefixtures("nginx_missing")
def test_without_nginx_the_default_run_leaves_its_mode_out_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    common, _ = overhead.parse(["--smoke"])
    assert common.modes == ("direct", "naive", "gateway", "gateway-w2")
    assert "no-nginx not found" in common.skipped["nginx"]
    assert "the nginx mode is skipped" in capsys.readouterr().err


@pytest.mark.usefixtures("nginx_missing")
def test_without_nginx_asking_for_its_mode_is_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        stream_timing.parse(["--modes", "direct,nginx"])
    assert "--modes nginx:" in capsys.readouterr().err


def test_gateway_w2_is_two_workers_sharing_the_single_gateways_slots() -> None:
    single = GatewaySettings(max_inflight=64, queue_timeout_s=30.0)
    text = harness.gateway_toml(overhead.two_workers(single), 18000, 18001)
    config = parse_config(text)
    assert config.server.workers == 2
    (provider,) = config.providers().values()
    # The workers share them through their supervisor (issue 43): the same 64 for the host.
    assert provider.max_inflight == single.max_inflight
