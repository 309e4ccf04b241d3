"""The outcome of a reload, where ``trio-gateway reload`` can wait for it.

A signal carries no answer, so every serving process (``serve``, or each worker of
``[server] workers``) keeps a small JSON file, ``reload-PID.json``: written at start, and again
as soon as each reload is applied or refused, with the problems that refused it. ``reload``
reads it before it sends SIGHUP and waits for the count of reloads in it to move on.

The file lives in a directory only the gateway's user can write: ``$XDG_RUNTIME_DIR/trio-gateway``
when the gateway has that variable, else ``$TMPDIR`` (or ``/tmp``) ``/trio-gateway-UID``, made
mode 0700. A directory that is not the user's own, or that others may write, is not used (by
the gateway, nor trusted by ``reload``). ``reload`` works it out from the gateway's own
environment (``/proc/PID/environ``), so the two agree whichever shell runs ``reload``.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

import attrs
import trio

log = logging.getLogger("trio_gateway")

DIR_MODE = 0o700
FILE_MODE = 0o600
MAX_STATUS_BYTES = 64 * 1024  # what a reader takes of a file: problems are a few lines
MAX_PROBLEMS = 50


@attrs.frozen
class ReloadStatus:
    """What one serving process says of its reloads."""

    pid: int
    reloads: int  # reloads decided since the process started
    applied: bool | None  # the last one's outcome; None before the first
    problems: tuple[str, ...] = ()  # why the last one was refused
    summary: str = ""  # what the last one applied

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ReloadStatus | None:
        """None for anything that is not a status this module wrote."""
        try:
            raw = json.loads(text)
            status = cls(
                pid=int(raw["pid"]),
                reloads=int(raw["reloads"]),
                applied=None if raw["applied"] is None else bool(raw["applied"]),
                problems=tuple(str(p) for p in raw["problems"][:MAX_PROBLEMS]),
                summary=str(raw["summary"]),
            )
        except (ValueError, KeyError, TypeError):
            return None
        return status


def status_dir(environ: Mapping[str, str], uid: int) -> Path:
    """Where a process with this environment and user keeps its status (pure)."""
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_absolute():
        return Path(runtime) / "trio-gateway"
    tmp = environ.get("TMPDIR") or "/tmp"
    return Path(tmp) / f"trio-gateway-{uid}"


def status_path(directory: Path, pid: int) -> Path:
    return directory / f"reload-{pid}.json"


def _private(path: Path, uid: int, kind: int) -> bool:
    """``path`` is a ``kind`` (not a link to one), the user's own, and no one else may write it."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return (
        stat.S_IFMT(st.st_mode) == kind
        and st.st_uid == uid
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's: alive
    return True


def read_status(directory: Path, pid: int, uid: int) -> ReloadStatus | None:
    """The status of process ``pid`` (of user ``uid``); None when there is none to trust."""
    path = status_path(directory, pid)
    if not _private(directory, uid, stat.S_IFDIR) or not _private(path, uid, stat.S_IFREG):
        return None
    try:
        with path.open("rb") as file:
            text = file.read(MAX_STATUS_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    status = ReloadStatus.from_json(text)
    return status if status is not None and status.pid == pid else None


class StatusFile:
    """This process's status file, written as reloads are decided, removed at exit."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.pid = os.getpid()
        self.uid = os.getuid()
        self.directory = status_dir(os.environ if environ is None else environ, self.uid)
        self.path = status_path(self.directory, self.pid)
        self.reloads = 0
        self.usable = True

    def _prepare(self) -> None:
        self.directory.mkdir(mode=DIR_MODE, exist_ok=True)
        if not _private(self.directory, self.uid, stat.S_IFDIR):
            raise OSError(f"{self.directory} is not a directory only this user may write")

    def _write(self, status: ReloadStatus) -> None:
        self._prepare()
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".reload-{self.pid}.")
        try:
            os.fchmod(fd, FILE_MODE)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(status.to_json())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _remove_stale(self) -> None:
        """The files of processes gone without removing theirs (kill -9), at this one's start."""
        for path in self.directory.glob("reload-*.json"):
            pid = path.name.removeprefix("reload-").removesuffix(".json")
            if pid.isdigit() and int(pid) != self.pid and not _alive(int(pid)):
                path.unlink(missing_ok=True)

    async def write(self, applied: bool | None, problems: tuple[str, ...], summary: str) -> None:
        """Say the latest outcome (``applied`` None: serving, no reload yet). A status that
        cannot be written is logged once; the gateway serves on, and ``reload`` times out."""
        if not self.usable:
            return
        if applied is not None:
            self.reloads += 1
        status = ReloadStatus(
            pid=self.pid,
            reloads=self.reloads,
            applied=applied,
            problems=problems[:MAX_PROBLEMS],
            summary=summary,
        )
        try:
            await trio.to_thread.run_sync(self._write, status)
            if applied is None:
                await trio.to_thread.run_sync(self._remove_stale)
        except OSError as exc:
            self.usable = False
            log.warning(
                "reload status: cannot write %s (%s); `trio-gateway reload` will not see "
                "reload outcomes, the log has them",
                self.path,
                exc.strerror or exc,
            )

    def remove(self) -> None:
        if self.usable:
            self.path.unlink(missing_ok=True)
