"""The log's queue and writer thread (log_queue.py): a caller never waits, drops are counted and
reported, the writer formats what the caller saw, and the exit does not wait on a stuck reader.

Each test writes into its own pipe, read (or not) by the test."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import select
import sys
import threading
import time
import warnings
from collections.abc import Iterator

import pytest

from trio_gateway.ops.access import (
    JsonFormatter,
    RequestContext,
    RequestIdFilter,
    TextFormatter,
    log_access,
    request_context,
)
from trio_gateway.ops.log_queue import (
    DROPPED,
    DroppedRecords,
    LogQueue,
    configure_logging,
)
from trio_gateway.ops.metrics import Metrics
from trio_gateway.ops.tracing import new_trace

# A stuck writer must be given up on at its deadline, not long after; slack for a busy machine.
CLOSE_DEADLINE_S = 0.3
CLOSE_SLACK_S = 1.5


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_end, write_end = os.pipe()
    yield read_end, write_end
    for fd in (read_end, write_end):
        os.close(fd)


def fill(fd: int) -> None:
    """Fill the pipe, so the next write into it blocks until it is read."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except BlockingIOError:
        pass
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)


def read_all(fd: int) -> bytes:
    """Everything in the pipe now, without waiting for more."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    out = bytearray()
    try:
        while chunk := os.read(fd, 1 << 16):
            out += chunk
    except BlockingIOError:
        pass
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    return bytes(out)


class Reader:
    """Reads a pipe on a thread until told to stop (the reader coming back)."""

    def __init__(self, fd: int) -> None:
        self.data = bytearray()
        self._fd = fd
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # The writer's end stays open (the test closes it): wait for data, or now and then
        # look whether the test is done.
        while not self._stop.is_set():
            readable, _, _ = select.select([self._fd], [], [], 0.05)
            if readable:
                self.data += os.read(self._fd, 1 << 16)

    def stop(self) -> bytes:
        self._stop.set()
        self._thread.join()
        self.data += read_all(self._fd)
        return bytes(self.data).replace(b"x", b"")


def queued_logger(logs: LogQueue, name: str) -> logging.Logger:
    logs.handler.addFilter(RequestIdFilter())
    log = logging.getLogger(name)
    log.handlers[:] = [logs.handler]
    log.propagate = False
    log.setLevel(logging.DEBUG)
    return log


def test_a_full_queue_drops_and_counts_by_level_then_the_writer_reports_them(
    pipe: tuple[int, int],
) -> None:
    read_end, write_end = pipe
    dropped = DroppedRecords()
    logs = LogQueue(write_end, TextFormatter(), bound=5, dropped=dropped)
    log = queued_logger(logs, "test.log_queue.full")
    for index in range(5):
        log.info("kept %d", index)
    log.info("dropped")
    log.error("dropped")
    log.error("dropped")
    assert dropped.by_level() == {"debug": 0, "info": 1, "warning": 0, "error": 2, "critical": 0}
    assert logs.statistics().queued == 5
    logs.start()
    assert logs.close()
    lines = read_all(read_end).decode().splitlines()
    assert [line.split(": ", 1)[1] for line in lines[:5]] == [f"kept {i}" for i in range(5)]
    # The first write that got through is followed by the report.
    assert len(lines) == 6
    assert "WARNING trio_gateway.log [-]: 3 log records dropped" in lines[5]
    assert logs.statistics().written == 5


def test_a_writer_stuck_in_a_write_never_holds_the_caller_and_reports_once_moving(
    pipe: tuple[int, int],
) -> None:
    read_end, write_end = pipe
    dropped = DroppedRecords()
    logs = LogQueue(write_end, TextFormatter(), bound=100, dropped=dropped)
    log = queued_logger(logs, "test.log_queue.stuck")
    fill(write_end)
    logs.start()
    started = time.monotonic()
    for index in range(400):
        log.info("line %d", index)
    # 400 puts (or drops): nothing waited on the pipe.
    assert time.monotonic() - started < 1.0
    assert dropped.total() > 0
    reader = Reader(read_end)
    assert logs.close(timeout_s=10)
    text = reader.stop().decode()
    (report,) = [line for line in text.splitlines() if "log records dropped" in line]
    assert report.split(": ", 1)[1].startswith(f"{dropped.total()} log records dropped")
    written = [line for line in text.splitlines() if ": line " in line]
    assert len(written) + dropped.total() == 400
    assert logs.statistics().written == len(written)


def test_close_gives_up_on_a_writer_stuck_in_a_write_at_its_deadline(
    pipe: tuple[int, int],
) -> None:
    read_end, write_end = pipe
    logs = LogQueue(write_end, TextFormatter(), dropped=DroppedRecords())
    log = queued_logger(logs, "test.log_queue.deadline")
    fill(write_end)
    logs.start()
    log.warning("the last line of a clean stop")
    started = time.monotonic()
    assert not logs.close(timeout_s=CLOSE_DEADLINE_S)
    assert CLOSE_DEADLINE_S <= time.monotonic() - started < CLOSE_DEADLINE_S + CLOSE_SLACK_S
    # Read again, the writer gets its line out and ends.
    reader = Reader(read_end)
    assert logs.close(timeout_s=10)
    assert b"the last line of a clean stop" in reader.stop()


@pytest.mark.parametrize("formatter", [TextFormatter(), JsonFormatter()], ids=["text", "json"])
def test_the_writer_formats_what_the_caller_saw(
    pipe: tuple[int, int], formatter: logging.Formatter
) -> None:
    """The writer thread formats only after the request ended, the list changed and the
    exception was handled: the request id, the message and the traceback are the caller's."""
    read_end, write_end = pipe
    logs = LogQueue(write_end, formatter, dropped=DroppedRecords())
    log = queued_logger(logs, "test.log_queue.capture")
    access = logging.getLogger("trio_gateway.access")
    access.addHandler(logs.handler)
    access.setLevel(logging.INFO)
    try:
        context = RequestContext(request_id="req-7", route="GET /x", trace=new_trace(), status=200)
        with request_context(context):
            items = ["before"]
            log.info("items %s", items)
            items.append("after")
            try:
                raise ValueError("the cause")
            except ValueError:
                log.exception("it failed")
            log_access(context, 0.0123)
        log.info("outside")
    finally:
        access.removeHandler(logs.handler)
        access.setLevel(logging.NOTSET)
    logs.start()
    assert logs.close()
    text = read_all(read_end).decode()
    if isinstance(formatter, JsonFormatter):
        items_line, failed, access_line, outside = (json.loads(x) for x in text.splitlines())
        assert (items_line["request_id"], items_line["message"]) == ("req-7", "items ['before']")
        assert failed["request_id"] == "req-7"
        assert failed["exception"].startswith("Traceback (most recent call last):")
        assert failed["exception"].endswith("ValueError: the cause")
        assert (access_line["request_id"], access_line["route"]) == ("req-7", "GET /x")
        assert access_line["duration_ms"] == 12.3
        assert outside["request_id"] == "-"
    else:
        assert "[req-7]: items ['before']\n" in text
        assert "[req-7]: it failed\nTraceback (most recent call last):\n" in text
        assert "ValueError: the cause\n" in text
        assert "INFO trio_gateway.access [req-7]: request_id=req-7 route=GET /x status=200" in text
        assert "duration_ms=12.3" in text
        assert "[-]: outside\n" in text


def test_a_record_that_cannot_be_formatted_is_one_line_and_the_log_goes_on(
    pipe: tuple[int, int],
) -> None:
    read_end, write_end = pipe
    logs = LogQueue(write_end, TextFormatter(), dropped=DroppedRecords())
    log = queued_logger(logs, "test.log_queue.bad")
    log.info("%d items", "not a number")
    log.info("next")
    logs.start()
    assert logs.close()
    bad, following = read_all(read_end).decode().splitlines()
    assert bad.startswith("INFO test.log_queue.bad: a log record could not be formatted: TypeError")
    assert following.endswith("[-]: next")


def test_a_traceback_that_cannot_be_rendered_never_fails_the_caller(
    pipe: tuple[int, int],
) -> None:
    class Broken(TextFormatter):
        def formatException(self, ei: object) -> str:
            raise RuntimeError("cannot render")

    read_end, write_end = pipe
    logs = LogQueue(write_end, Broken(), dropped=DroppedRecords())
    log = queued_logger(logs, "test.log_queue.broken")
    try:
        raise ValueError("x")
    except ValueError:
        log.exception("failed")  # did not raise
    logs.start()
    assert logs.close()
    (line,) = read_all(read_end).decode().splitlines()
    assert line == (
        "ERROR test.log_queue.broken: a log record could not be formatted:"
        " RuntimeError('cannot render')"
    )


def test_a_reader_gone_counts_the_lines_lost_as_dropped() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    dropped = DroppedRecords()
    logs = LogQueue(write_end, TextFormatter(), dropped=dropped)
    log = queued_logger(logs, "test.log_queue.gone")
    log.warning("into a pipe with no reader")
    logs.start()
    try:
        assert logs.close()
    finally:
        os.close(write_end)
    assert dropped.by_level()["warning"] == 1


def test_drops_are_in_the_metrics_by_level() -> None:
    def dropped_warnings() -> float:
        for line in Metrics(list).render().decode().splitlines():
            if line.startswith('gateway_log_records_dropped_total{level="warning"} '):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError("no gateway_log_records_dropped_total")

    before = dropped_warnings()
    DROPPED.count("WARNING", 3)
    assert dropped_warnings() == before + 3


def test_configure_logging_sends_warnings_and_unraisable_exceptions_through_the_queue(
    pipe: tuple[int, int],
) -> None:
    read_end, write_end = pipe
    root = logging.getLogger()
    handlers, hook = root.handlers[:], sys.unraisablehook

    class Unraisable:
        def __del__(self) -> None:
            raise RuntimeError("raised in __del__")

    with configure_logging("info", "json", fd=write_end), warnings.catch_warnings():
        warnings.simplefilter("always")
        logging.getLogger("trio_gateway").info("serving")
        logging.getLogger("trio_gateway").debug("not at info")
        warnings.warn("a warning", UserWarning, stacklevel=1)
        Unraisable()
    assert (root.handlers, sys.unraisablehook) == (handlers, hook)
    lines = [json.loads(x) for x in read_all(read_end).decode().splitlines()]
    assert [(x["logger"], x["level"]) for x in lines] == [
        ("trio_gateway", "info"),
        ("py.warnings", "warning"),
        ("trio_gateway", "error"),
    ]
    assert "UserWarning: a warning" in lines[1]["message"]
    assert lines[2]["message"].startswith("Exception ignored in: <")
    assert lines[2]["exception"].endswith("RuntimeError: raised in __del__")
