"""A process seen from outside: CPU time, RSS and open file descriptors read from /proc.

The gateway and the naive proxy are measured by the benchmark process, never by themselves, so
the measurement costs them nothing and works for any server. ``Sampler`` reads them in a
thread every ``interval_s`` (a /proc read is a few microseconds: it does not disturb the load
generator's event loop) and keeps the series, from which before / peak / after are taken.

What is sampled is the process **and its descendants**: a server whose work is done by
children (nginx's worker under its master, ``[server] workers = 2`` under the gateway's
supervisor) is measured whole, CPU, RSS and descriptors summed over the tree; for a server of
one process the tree is that process.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from pathlib import Path
from typing import Any

import attrs

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds used by ``pid`` so far, None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _reaped_children_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid``'s children that exited and were waited for (cutime + cstime):
    a worker that dies and is reaped mid-run leaves the live tree, not the sum."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / CLOCK_TICKS


# The kernel lists a task's children in /proc/PID/task/TID/children where built with
# CONFIG_PROC_CHILDREN; elsewhere every process's parent is read instead.
_CHILDREN_FILES = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists()


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def child_pids(pid: int) -> list[int]:
    """The live children of ``pid`` (of every thread of it: a child belongs to the thread
    that forked it)."""
    if not _CHILDREN_FILES:
        return [int(e) for e in os.listdir("/proc") if e.isdigit() and _parent(int(e)) == pid]
    children: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tasks:
        with contextlib.suppress(OSError):
            children += [
                int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
            ]
    return children


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants, ``pid`` first."""
    found = [pid]
    i = 0
    while i < len(found):
        found += [c for c in child_pids(found[i]) if c not in found]
        i += 1
    return found


def rss_kib(pid: int) -> int | None:
    """Resident set size (VmRSS) in KiB, None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def fd_count(pid: int) -> int | None:
    """Open file descriptors of ``pid`` (entries of /proc/PID/fd)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def loadavg() -> list[float] | None:
    """The 1, 5 and 15 minute load averages: how busy the (possibly shared) machine was."""
    try:
        return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


def machine_busy_s() -> float | None:
    """CPU seconds the whole machine spent busy since boot (Linux /proc/stat)."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    # cpu user nice system idle iowait irq softirq steal ...
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in first[1:9])
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def raise_nofile_limit() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit and return (soft, hard).

    Scenario D holds 5,000 client connections in the load generator and twice that in a proxy
    (one to the client, one upstream). Child processes inherit the limit, so calling this before
    starting the simulator, the proxy and the gateway raises theirs too without touching them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


@attrs.frozen
class Point:
    """One sample of a process tree: CPU, RSS and descriptors summed over its processes."""

    t_s: float  # seconds since the sampler started
    cpu_s: float
    rss_kib: int
    fds: int
    processes: int = 1
    root_cpu_s: float = 0.0  # the root process's own share of cpu_s (nginx's master, say)


def _point(pid: int, t_s: float) -> Point | None:
    root_cpu = cpu_seconds(pid)
    if root_cpu is None:
        return None
    cpu, rss, fds, processes = _reaped_children_cpu_s(pid), 0, 0, 0
    for member in tree_pids(pid):
        member_cpu = root_cpu if member == pid else cpu_seconds(member)
        member_rss, member_fds = rss_kib(member), fd_count(member)
        if member_cpu is None or member_rss is None or member_fds is None:
            if member == pid:
                return None
            continue  # a child that exited between the listing and the reads
        cpu += member_cpu
        rss += member_rss
        fds += member_fds
        processes += 1
    return Point(t_s=t_s, cpu_s=cpu, rss_kib=rss, fds=fds, processes=processes, root_cpu_s=root_cpu)


class Sampler:
    """Samples named processes in a background thread while the load runs.

    ``mark_start()`` and ``mark_end()`` bracket the load: CPU is the difference between those two
    samples; "before" is the RSS/fds at the start, "peak" the maximum seen in between, "after"
    a sample taken by ``settle()`` once the load generator has closed every connection.
    """

    def __init__(self, pids: dict[str, int], interval_s: float = 0.2) -> None:
        self._pids = pids
        self._interval_s = interval_s
        self._t0 = time.monotonic()
        self.series: dict[str, list[Point]] = {name: [] for name in pids}
        self._marks: dict[str, dict[str, Point | None]] = {name: {} for name in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="proc-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _sample(self) -> dict[str, Point | None]:
        now = time.monotonic() - self._t0
        taken = {name: _point(pid, now) for name, pid in self._pids.items()}
        for name, point in taken.items():
            if point is not None:
                self.series[name].append(point)
        return taken

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._sample()

    def mark(self, label: str) -> None:
        for name, point in self._sample().items():
            self._marks[name][label] = point

    def summary(self, name: str) -> dict[str, Any]:
        """CPU seconds between the "start" and "end" marks; RSS and fds before, peak, after."""
        marks = self._marks[name]
        start, end, after = marks.get("start"), marks.get("end"), marks.get("after")
        window = [
            p
            for p in self.series[name]
            if start is not None and p.t_s >= start.t_s and (end is None or p.t_s <= end.t_s)
        ]
        return {
            "cpu_s": (end.cpu_s - start.cpu_s) if start and end else None,
            # Of cpu_s, the root's own: all of it for one process; next to nothing for nginx's
            # master or the gateway's supervisor, whose children do the work.
            "cpu_s_root": (end.root_cpu_s - start.root_cpu_s) if start and end else None,
            "processes_peak": max((p.processes for p in window), default=None),
            "rss_kib_before": start.rss_kib if start else None,
            "rss_kib_peak": max((p.rss_kib for p in window), default=None),
            "rss_kib_after": after.rss_kib if after else None,
            "fds_before": start.fds if start else None,
            "fds_peak": max((p.fds for p in window), default=None),
            "fds_after": after.fds if after else None,
            "series": [attrs.astuple(p) for p in self.series[name]],
        }


def _tcp_table(pid: int) -> dict[int, tuple[int, int, str]]:
    """socket inode -> (local port, remote port, state hex) from the process's network
    namespace view (/proc/PID/net/tcp and tcp6)."""
    table: dict[int, tuple[int, int, str]] = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            local, remote, state, inode = f[1], f[2], f[3], int(f[9])
            table[inode] = (
                int(local.rsplit(":", 1)[1], 16),
                int(remote.rsplit(":", 1)[1], 16),
                state,
            )
    return table


TCP_LISTEN = "0A"
TCP_CLOSE_WAIT = "08"


def connections(pid: int, listen_port: int, upstream_port: int) -> dict[str, int] | None:
    """The open TCP sockets of the process and its descendants (``tree_pids``) by role:
    ``clients`` (accepted on ``listen_port``), ``clients_close_wait`` (of those, closed by the
    client but not yet by the process), ``upstream`` (to ``upstream_port``: a pool's
    keep-alive connections stay open by design), ``other``; and ``fds``, all their
    descriptors, from the same listing (a count compared with the roles must be of the same
    moment: a pool closing idle connections between two looks made a leak count negative);
    None when the process is gone."""
    fd_total = 0
    inodes: set[int] = set()  # a socket inherited across a fork is one connection
    for i, member in enumerate(tree_pids(pid)):
        try:
            fds = os.listdir(f"/proc/{member}/fd")
        except OSError:
            if i == 0:
                return None
            continue
        fd_total += len(fds)
        for fd in fds:
            # A descriptor may close between the listing and the read: skip it, it is gone.
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{member}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(int(link[8:-1]))
    table = _tcp_table(pid)
    counts = {"clients": 0, "clients_close_wait": 0, "upstream": 0, "other": 0, "fds": fd_total}
    for inode in inodes:
        entry = table.get(inode)
        if entry is None:
            continue  # not TCP (a pipe-like socketpair, UDP)
        local, remote, state = entry
        if state == TCP_LISTEN:
            continue
        if local == listen_port:
            counts["clients"] += 1
            # The client closed and the process has not: a handler still holds the socket.
            counts["clients_close_wait"] += state == TCP_CLOSE_WAIT
        elif remote == upstream_port:
            counts["upstream"] += 1
        else:
            counts["other"] += 1
    return counts


# Where an arrival storm waits in the kernel (scenario D): connections a full accept queue
# refused (each such client's SYN is retransmitted after 1 s, then 3 s), and SYNs retransmitted.
TCP_STORM_COUNTERS = ("ListenOverflows", "ListenDrops", "TCPSynRetrans")


def tcp_ext_counters(names: tuple[str, ...] = TCP_STORM_COUNTERS) -> dict[str, int] | None:
    """The machine's TcpExt counters ``names`` (Linux /proc/net/netstat), None where unread."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return None
    for head, values in zip(lines[::2], lines[1::2], strict=False):
        if head.startswith("TcpExt:"):
            table = dict(zip(head.split()[1:], values.split()[1:], strict=False))
            return {name: int(table.get(name, 0)) for name in names}
    return None
