"""A command whose reader closes the pipe early (``trio-gateway usage --json | head -3``) stops
quietly (issue 39, item 7): no traceback, no "Exception ignored" on stderr, and the status a
shell gives a tool SIGPIPE ended (141), as ``seq 1000000 | head -3`` gives ``seq``'s. (With
PYTHONUNBUFFERED, argparse's own --help and --version meet the closed pipe in a write it
ignores, and exit 0: as quietly.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_cli import REPO
from trio_gateway.accounting.ledger import connect, write_batch
from trio_gateway.cli.main import EXIT_BROKEN_PIPE
from trio_gateway.core.usage import refused_record

CLI = [sys.executable, "-m", "trio_gateway"]
# JSON lines well past a pipe's buffer (64 KiB): the writer meets the closed pipe mid-output.
RECORDS = 2000
TIMEOUT_S = 30


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    path = tmp_path / "usage.sqlite3"
    conn = connect(str(path))
    records = [
        refused_record(
            request_id=f"r{i:05}",
            key="alice",
            alias="agent-lite",
            error_code="invalid_json",
            started_at=1_800_000_000.0 + i,
        )
        for i in range(RECORDS)
    ]
    write_batch(conn, records)
    conn.close()
    return path


def test_the_exit_status_is_the_shells_for_a_tool_sigpipe_ended() -> None:
    assert EXIT_BROKEN_PIPE == 128 + signal.SIGPIPE == 141


def environment(*, buffered: bool) -> dict[str, str]:
    """This environment, stdout buffered (a shell's default) or not (PYTHONUNBUFFERED)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return env if buffered else {**env, "PYTHONUNBUFFERED": "1"}


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_usage_json_read_three_lines_then_closed_stops_quietly(
    ledger: Path, buffered: bool
) -> None:
    proc = subprocess.Popen(
        [*CLI, "usage", "--ledger", str(ledger), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(buffered=buffered),
    )
    assert proc.stdout is not None and proc.stderr is not None
    lines = [proc.stdout.readline() for _ in range(3)]
    assert all(line.startswith('{"request_id": "r0000') for line in lines), lines
    proc.stdout.close()  # what `head -3` does once it has its lines
    assert proc.wait(TIMEOUT_S) == EXIT_BROKEN_PIPE
    assert proc.stderr.read() == ""


@pytest.mark.parametrize(
    "command",
    [["usage", "--ledger", "{ledger}"], ["check", str(REPO / "gateway.toml")], ["--version"]],
    ids=["usage-table", "check", "version"],
)
def test_a_command_whose_pipe_is_closed_before_it_prints_stops_quietly(
    ledger: Path, command: list[str]
) -> None:
    proc = subprocess.Popen(
        [*CLI, *(part.format(ledger=ledger) for part in command)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=environment(buffered=True),
    )
    assert proc.stdout is not None
    proc.stdout.close()  # before the interpreter has even started: its first write fails
    _, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == EXIT_BROKEN_PIPE, err
    assert err == ""
