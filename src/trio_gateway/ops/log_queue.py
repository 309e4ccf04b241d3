"""Log records leave the event loop's thread at once: a stuck log reader never stops the gateway.

::

    any thread ──Logger.handle──▶ QueuedHandler, on the caller's thread: the request id (a
      context variable the writer's thread cannot see) and anything that could change later
      (a message's mutable arguments, a traceback) captured; then the record is queued, or
      dropped and counted when LOG_QUEUE_RECORDS are waiting: never waited for
      ──queue──▶ the writer thread: formats, joins whole lines into writes of at most PIPE_BUF
      bytes, os.write(fd); after drops, its first write that gets through is followed by
      "N log records dropped"

A write into a pipe nobody reads (a stalled log shipper, a terminal paused with Ctrl-S) blocks
until the reader comes back. Made on the loop, as ``logging.StreamHandler`` made it, it froze
every request, ``/healthz`` included; made here, only the writer waits, the queue fills, and
what does not fit is dropped (``gateway_log_records_dropped_total{level}``). At exit the queue
is written out for up to :data:`FLUSH_AT_EXIT_S`; a writer still stuck then is a daemon thread
and does not hold the exit.

The writer writes the file descriptor itself, not through ``sys.stderr``: a daemon thread
stuck inside ``sys.stderr``'s buffer would hold that buffer's lock when the interpreter
flushes it at exit (a fatal error), and ``logging.shutdown`` would wait forever on the lock of
a handler stuck in ``emit``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import attrs

from trio_gateway.ops.access import AccessLine, JsonFormatter, RequestIdFilter, TextFormatter

# Records waiting for the writer; beyond, records are dropped. A record with its access line's
# fields takes about 1.3 KB (tracemalloc), so a full queue holds some 13 MB: 3 to 5 s of
# access lines at the 2,000 to 3,000 requests/s one process serves, before the first drop.
LOG_QUEUE_RECORDS = 10_000
# Records the writer takes from the queue at a time: all it holds besides the queue.
BATCH_RECORDS = 256
# At exit, the longest the writer gets to write out the queue.
FLUSH_AT_EXIT_S = 2.0
# Several processes ([server] workers) write lines into one stderr; a pipe keeps a write of
# at most PIPE_BUF bytes whole, so a line is never cut by another process's.
WRITE_BATCH_BYTES = select.PIPE_BUF
# The writer, woken by a record in an empty queue, waits this long to take what comes
# meanwhile with it: one wake-up of its thread (and one hand-over of the GIL) for many records,
# not one for each.
GATHER_S = 0.01
# Drops go on while the queue stays full: one report line at most this often, not one per write.
DROP_REPORT_INTERVAL_S = 1.0
LEVELS = ("debug", "info", "warning", "error", "critical")
REPORT_LOGGER = "trio_gateway.log"

# Arguments that cannot change between the log call and the writer's formatting (an access
# line holds only such values, and makes its text on the writer's thread).
_FIXED_ARGS = frozenset({str, int, float, bool, type(None), AccessLine})


class DroppedRecords:
    """Records not written, by level. Counted from any thread (rarely: only when the queue is
    full or a write fails); read by the writer and by a scrape of ``/metrics``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_level = dict.fromkeys(LEVELS, 0)

    def count(self, levelname: str, records: int = 1) -> None:
        level = levelname.lower()
        with self._lock:
            self._by_level[level] = self._by_level.get(level, 0) + records

    def by_level(self) -> dict[str, int]:
        with self._lock:
            return dict(self._by_level)

    def total(self) -> int:
        with self._lock:
            return sum(self._by_level.values())


# Logging is the process's: so are its drops (metrics.py reads them into /metrics).
DROPPED = DroppedRecords()


def capture(record: logging.LogRecord, formatter: logging.Formatter) -> logging.LogRecord:
    """The record as the writer may format it later on another thread: a message whose
    arguments could change (a list, an exception, any object) is made text now, and a
    traceback is rendered now (the exception could gain a cause or notes, and its frames would
    stay alive in the queue). The usual record, a text with numbers and strings, is queued as
    it is: formatting it is the writer's work. A copy is changed, so another handler of the
    same record still sees it whole."""
    args = record.args
    fixed = type(record.msg) is str and (
        not args or (type(args) is tuple and all(type(a) in _FIXED_ARGS for a in args))
    )
    if fixed and not record.exc_info:
        return record
    record = logging.makeLogRecord(record.__dict__)
    if not fixed:
        # One that cannot be formatted is left as it is: the writer says so in its place.
        with contextlib.suppress(Exception):
            record.msg, record.args = record.getMessage(), None
    if record.exc_info:
        if not record.exc_text:
            record.exc_text = formatter.formatException(record.exc_info)
        record.exc_info = None
    return record


class QueuedHandler(logging.Handler):
    """Runs on the caller's thread (the event loop's): its filters (the request id), then
    :func:`capture` and a put that never waits."""

    def __init__(
        self,
        records: queue.SimpleQueue[logging.LogRecord | None],
        formatter: logging.Formatter,
        *,
        bound: int,
        dropped: DroppedRecords,
    ) -> None:
        super().__init__()
        self._records = records
        self._bound = bound
        self._dropped = dropped
        # Only its formatException runs here (capture); the writer formats with the same one.
        self._formatter = formatter

    def emit(self, record: logging.LogRecord) -> None:
        # SimpleQueue's put is a C call that never waits; queue.Queue(maxsize) takes a lock and
        # notifies a condition per record. The bound is checked first, so it holds within one
        # record per thread logging at the same instant.
        if self._records.qsize() >= self._bound:
            self._dropped.count(record.levelname)
            return
        # A record capture fails on (a traceback that cannot be rendered) is queued as it is,
        # and the writer says it could not format it: raised here, it would fail the request.
        with contextlib.suppress(Exception):
            record = capture(record, self._formatter)
        self._records.put(record)


@attrs.frozen(kw_only=True)
class LogQueueStats:
    queued: int
    written: int  # records
    dropped: int  # queue full or write failed, since the process started


class LogQueue:
    """The queue, its handler (put it on the root logger) and its writer thread, writing to
    ``fd``. One per process: :func:`configure_logging` makes it."""

    def __init__(
        self,
        fd: int,
        formatter: logging.Formatter,
        *,
        bound: int = LOG_QUEUE_RECORDS,
        dropped: DroppedRecords = DROPPED,
        encoding: str = "utf-8",
    ) -> None:
        self._records: queue.SimpleQueue[logging.LogRecord | None] = queue.SimpleQueue()
        self.handler = QueuedHandler(self._records, formatter, bound=bound, dropped=dropped)
        self._writer = _Writer(fd, formatter, self._records, dropped, encoding)
        self._dropped = dropped
        # A daemon: one stuck in a write must not hold the interpreter's exit (close() waits
        # for it, with a deadline).
        self._thread = threading.Thread(
            target=self._writer.run, name="trio-gateway-log-writer", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout_s: float = FLUSH_AT_EXIT_S) -> bool:
        """Write out what is queued, for up to ``timeout_s``; True when all of it was
        written. Records queued after this are not written."""
        self._records.put(None)
        if self._thread.ident is None:
            return False  # never started
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def statistics(self) -> LogQueueStats:
        return LogQueueStats(
            queued=self._records.qsize(),
            written=self._writer.written,
            dropped=self._dropped.total(),
        )


class _Writer:
    """The writer thread's loop and state (nothing here runs on the event loop)."""

    def __init__(
        self,
        fd: int,
        formatter: logging.Formatter,
        records: queue.SimpleQueue[logging.LogRecord | None],
        dropped: DroppedRecords,
        encoding: str,
    ) -> None:
        self._fd = fd
        self._formatter = formatter
        self._records = records
        self._dropped = dropped
        self._encoding = encoding
        self.written = 0
        # Drops before this queue existed are not its to report.
        self._reported = dropped.total()
        self._last_report = -DROP_REPORT_INTERVAL_S

    def run(self) -> None:
        records = self._records
        while True:
            try:
                # With drops not yet reported, wait only until a report is due.
                first = records.get(timeout=self._idle_s())
            except queue.Empty:
                self._report()
                continue
            if first is not None and records.empty():
                time.sleep(GATHER_S)
            batch = [first]
            with contextlib.suppress(queue.Empty):
                while len(batch) < BATCH_RECORDS:
                    batch.append(records.get_nowait())
            if not self._write_records(batch):
                return

    def _write_records(self, batch: list[logging.LogRecord | None]) -> bool:
        """Formats and writes ``batch`` in writes of whole lines; False at the end (None)."""
        pending = bytearray()
        levels: list[str] = []
        for record in batch:
            if record is None:
                self._write(pending, levels)
                self._report(at_exit=True)
                return False
            line = self._line(record)
            if pending and len(pending) + len(line) > WRITE_BATCH_BYTES:
                self._write(pending, levels)
                pending, levels = bytearray(), []
            pending += line
            levels.append(record.levelname)
        self._write(pending, levels)
        return True

    def _idle_s(self) -> float | None:
        if self._dropped.total() == self._reported:
            return None
        return max(0.0, self._last_report + DROP_REPORT_INTERVAL_S - time.monotonic())

    def _line(self, record: logging.LogRecord) -> bytes:
        try:
            text = self._formatter.format(record)
        except Exception as exc:  # one bad record must not stop the log
            text = f"{record.levelname} {record.name}: a log record could not be formatted: {exc!r}"
        return (text + "\n").encode(self._encoding, "backslashreplace")

    def _write(self, data: bytearray, levels: list[str]) -> bool:
        """All of ``data``, however long the reader takes; False when the file refuses it
        (its reader is gone): those records count as dropped."""
        if not data:
            return True
        view = memoryview(data)
        try:
            while view:
                try:
                    view = view[os.write(self._fd, view) :]
                except BlockingIOError:
                    # Someone made the file description non-blocking (it is shared with the
                    # parent): wait for room as a blocking write would.
                    select.select([], [self._fd], [])
        except OSError:
            for level in levels:
                self._dropped.count(level)
            return False
        finally:
            view.release()
        self.written += len(levels)
        if self._dropped.total() > self._reported:
            self._report()
        return True

    def _report(self, *, at_exit: bool = False) -> None:
        """After drops, once a write got through (the reader is back): how many, in one line."""
        unreported = self._dropped.total() - self._reported
        now = time.monotonic()
        if not unreported or (not at_exit and now - self._last_report < DROP_REPORT_INTERVAL_S):
            return
        record = logging.LogRecord(
            REPORT_LOGGER,
            logging.WARNING,
            "(unknown file)",
            0,
            "%d log records dropped (the log's reader did not keep up; "
            "gateway_log_records_dropped_total)",
            (unreported,),
            None,
        )
        record.request_id = "-"
        self._last_report = now
        self._reported += unreported
        if not self._write(bytearray(self._line(record)), []):
            self._reported -= unreported


def _log_unraisable(unraisable: sys.UnraisableHookArgs) -> None:
    """What the interpreter prints to stderr itself (an exception in a ``__del__``, say),
    logged instead: printed, it would be a write on the loop's thread."""
    exc = unraisable.exc_value
    logging.getLogger("trio_gateway").error(
        "%s: %r",
        unraisable.err_msg or "Exception ignored in",
        unraisable.object,
        exc_info=(unraisable.exc_type, exc, unraisable.exc_traceback) if exc else None,
    )


@contextmanager
def configure_logging(level: str, log_format: str, *, fd: int = 2) -> Iterator[LogQueue]:
    """The CLI's logging: text or JSON lines on stderr (``fd``), with request ids, through the
    queue and its writer thread. Python's warnings and unraisable exceptions go the same way.
    On exit the queue is written out for up to :data:`FLUSH_AT_EXIT_S`, and the logging as it
    was is put back."""
    formatter = JsonFormatter() if log_format == "json" else TextFormatter()
    encoding = getattr(sys.stderr, "encoding", None) or "utf-8"
    logs = LogQueue(fd, formatter, encoding=encoding)
    logs.handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    saved_handlers, saved_level, saved_hook = root.handlers[:], root.level, sys.unraisablehook
    saved_names = logging.logThreads, logging.logProcesses, logging.logMultiprocessing
    root.handlers[:] = [logs.handler]
    root.setLevel(level.upper())
    # One line per upstream request is noise at INFO; the gateway logs what matters.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # No format shows a thread's or a process's name: a record made on the loop leaves them
    # out (a sixth of making one).
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging.captureWarnings(True)
    sys.unraisablehook = _log_unraisable
    logs.start()
    try:
        yield logs
    finally:
        sys.unraisablehook = saved_hook
        logging.captureWarnings(False)
        logging.logThreads, logging.logProcesses, logging.logMultiprocessing = saved_names
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        logs.close()
