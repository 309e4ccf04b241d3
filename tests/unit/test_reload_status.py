"""The reload status file: where it lives, and what a reader trusts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from trio_gateway.process.reload_status import (
    ReloadStatus,
    StatusFile,
    read_status,
    status_dir,
    status_path,
)


def test_the_directory_follows_the_gateway_s_environment() -> None:
    assert status_dir({"XDG_RUNTIME_DIR": "/run/user/7"}, 7) == Path("/run/user/7/trio-gateway")
    assert status_dir({"TMPDIR": "/var/tmp"}, 7) == Path("/var/tmp/trio-gateway-7")
    assert status_dir({}, 7) == Path("/tmp/trio-gateway-7")
    # A relative runtime directory would depend on the reader's working directory.
    assert status_dir({"XDG_RUNTIME_DIR": "run"}, 7) == Path("/tmp/trio-gateway-7")


async def test_a_written_status_reads_back_and_counts_reloads(tmp_path: Path) -> None:
    status = StatusFile({"XDG_RUNTIME_DIR": str(tmp_path)})
    await status.write(None, (), "serving")
    first = read_status(status.directory, os.getpid(), os.getuid())
    assert first == ReloadStatus(pid=os.getpid(), reloads=0, applied=None, summary="serving")
    await status.write(False, ("server.listen: changed",), "")
    second = read_status(status.directory, os.getpid(), os.getuid())
    assert second is not None and (second.reloads, second.applied) == (1, False)
    assert second.problems == ("server.listen: changed",)
    status.remove()
    assert read_status(status.directory, os.getpid(), os.getuid()) is None


@pytest.mark.parametrize("mode", [0o777, 0o770])
def test_a_directory_others_may_write_is_neither_used_nor_trusted(
    tmp_path: Path, mode: int, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "trio-gateway"
    directory.mkdir()
    directory.chmod(mode)
    forged = ReloadStatus(pid=os.getpid(), reloads=9, applied=True)
    status_path(directory, os.getpid()).write_text(forged.to_json())
    assert read_status(directory, os.getpid(), os.getuid()) is None
    status = StatusFile({"XDG_RUNTIME_DIR": str(tmp_path)})
    trio.run(status.write, True, (), "")
    assert not status.usable
    assert "reload status: cannot write" in caplog.text


@pytest.mark.parametrize(
    "text",
    ["", "{}", "[1]", '{"pid": 1, "reloads": "x", "applied": 1, "problems": [], "summary": ""}'],
)
def test_anything_else_in_the_file_is_no_status(text: str) -> None:
    assert ReloadStatus.from_json(text) is None


async def test_at_start_the_files_of_processes_gone_are_removed(tmp_path: Path) -> None:
    directory = tmp_path / "trio-gateway"
    directory.mkdir(mode=0o700)
    stale = status_path(directory, 2**22 + 1)  # past Linux's PID_MAX_LIMIT: no such process
    alive = status_path(directory, os.getppid())
    for path in (stale, alive):
        path.write_text("{}")
    await StatusFile({"XDG_RUNTIME_DIR": str(tmp_path)}).write(None, (), "serving")
    assert not stale.exists() and alive.exists()
