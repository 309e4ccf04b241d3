"""``trio-gateway reload`` against a real ``serve``: it says what the gateway made of the file,
and fails when the gateway refused it (the file can pass ``check`` and still need a restart)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.e2e.test_cli import CLI, default_config_on_free_ports, wait_ready


def client_env() -> dict[str, str]:
    # The gateway keeps its status where its own environment says; the client works that out
    # from the gateway's environment, not its own.
    return {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "TMPDIR")}


def reload(config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "reload", "--config", str(config), *extra],
        capture_output=True,
        text=True,
        timeout=30,
        env=client_env(),
    )


@contextmanager
def serving(config: Path, port: int, runtime: Path) -> Iterator[subprocess.Popen[str]]:
    runtime.mkdir(mode=0o700)
    proc = subprocess.Popen(
        [*CLI, "serve", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=config.parent,
        env={**client_env(), "XDG_RUNTIME_DIR": str(runtime)},
    )
    try:
        wait_ready(port, proc)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)


def test_reload_exits_non_zero_with_the_reason_when_the_gateway_refuses(tmp_path: Path) -> None:
    config, port = default_config_on_free_ports(tmp_path)
    text = config.read_text()
    runtime = tmp_path / "run"
    with serving(config, port, runtime) as proc:
        status = runtime / "trio-gateway" / f"reload-{proc.pid}.json"
        # Valid on its own (`check` passes), but only a restart can apply it.
        config.write_text(text.replace("drain_timeout_s = 30.0", "drain_timeout_s = 31.0"))
        refused = reload(config)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert f"sent SIGHUP to pid {proc.pid}" in refused.stdout
        assert (
            f"pid {proc.pid}: server.drain_timeout_s: changed (30.0 -> 31.0); a restart applies it"
        ) in refused.stderr
        assert f"pid {proc.pid}: reload rejected; nothing changed" in refused.stderr
        # One edit the gateway takes: 0, and what it changed.
        config.write_text(text.replace("max_inflight = 32", "max_inflight = 16"))
        applied = reload(config)
        assert applied.returncode == 0, applied.stderr
        assert f"pid {proc.pid}: reload applied: 0 added, 0 removed, 0 replaced, 1 resized" in (
            applied.stdout
        )
        assert stat_mode(runtime / "trio-gateway") == 0o700 and stat_mode(status) == 0o600
    assert proc.returncode == 0
    assert not status.exists()  # removed at exit


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_every_worker_s_verdict_is_waited_for(tmp_path: Path) -> None:
    config, port = default_config_on_free_ports(tmp_path)
    text = config.read_text().replace("[server]\n", "[server]\nworkers = 2\n")
    config.write_text(text)
    runtime = tmp_path / "run"
    with serving(config, port, runtime):
        # Both workers serving: each has said so in its own status file.
        deadline = time.monotonic() + 20
        while len(list((runtime / "trio-gateway").glob("reload-*.json"))) < 2:
            assert time.monotonic() < deadline, "the second worker did not start"
            time.sleep(0.05)
        config.write_text(text.replace("drain_timeout_s = 30.0", "drain_timeout_s = 5.0"))
        refused = reload(config)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert refused.stderr.count("reload rejected; nothing changed") == 2, refused.stderr
        config.write_text(text.replace("weight = 100", "weight = 50"))
        applied = reload(config)
        assert applied.returncode == 0, applied.stderr
        assert applied.stdout.count("reload applied") == 2, applied.stdout


def test_reload_says_when_no_outcome_came(tmp_path: Path) -> None:
    config, _ = default_config_on_free_ports(tmp_path)
    deaf = subprocess.Popen(
        [sys.executable, "-c", "import signal, time\nsignal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
         "print('ready', flush=True)\ntime.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert deaf.stdout is not None and deaf.stdout.readline() == "ready\n"
        waited = reload(config, "--pid", str(deaf.pid), "--timeout", "0.5")
    finally:
        deaf.kill()
        deaf.communicate()
    assert waited.returncode == 1
    assert f"pid {deaf.pid}: no outcome within 0.5 s" in waited.stderr
