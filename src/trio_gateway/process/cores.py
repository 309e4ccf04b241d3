"""``[server] workers = "auto"``: one worker per core this process may use.

A core the process may use is one of its CPU affinity (``os.sched_getaffinity``: what
``taskset``, systemd's ``CPUAffinity=``/``AllowedCPUs=`` and Kubernetes' static CPU manager
give it), and no more than its cgroup's CPU quota allows (a pod's CPU limit, systemd's
``CPUQuota=``, ``docker run --cpus``): cgroup v2's ``cpu.max`` ("200000 100000" is two cores;
"max" is none), or v1's ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us`` (-1 is none), of the
process's own cgroup and of every cgroup above it (a limit applies to everything below). A
quota of 1.5 cores is 2 workers: a worker is busy only part of the time, and two of them use
the half core a single one would leave.

The rules are pure (``usable_cores``, over the text of ``/proc/self/cgroup`` and a reader of
files); ``cores_available`` reads the real ones.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import PurePosixPath

from trio_gateway.config.checks import MAX_WORKERS
from trio_gateway.config.schema import Workers

CGROUP_ROOT = "/sys/fs/cgroup"

Read = Callable[[str], str | None]  # a file's text, or None when it cannot be read


def _v2_quota(text: str) -> float | None:
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_quota(quota_text: str | None, period_text: str | None) -> float | None:
    try:
        quota, period = int((quota_text or "").strip()), int((period_text or "").strip())
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _ancestors(path: str) -> list[str]:
    """``/a/b`` -> ``["/a/b", "/a", "/"]``."""
    pure = PurePosixPath("/") / path.lstrip("/")
    return [str(pure), *(str(p) for p in pure.parents)]


def cpu_quota(proc_self_cgroup: str, read: Read, root: str = CGROUP_ROOT) -> float | None:
    """The smallest CPU quota (in cores) on the process's cgroup path, None when none is set.

    In a container the cgroup file system shows the container's own cgroup as its root while
    ``/proc/self/cgroup`` may still name the host's path: the path's ancestors that do not
    exist under ``root`` are skipped, and the root itself is always read."""
    quotas: list[float] = []
    for line in proc_self_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # cgroup v2
            for directory in _ancestors(path):
                text = read(f"{root}{directory.rstrip('/')}/cpu.max")
                if text is not None and (q := _v2_quota(text)) is not None:
                    quotas.append(q)
        elif "cpu" in controllers.split(","):  # cgroup v1's cpu controller
            mount = f"{root}/{controllers}"
            for directory in _ancestors(path):
                base = f"{mount}{directory.rstrip('/')}"
                period = read(f"{base}/cpu.cfs_period_us")
                quota = _v1_quota(read(f"{base}/cpu.cfs_quota_us"), period)
                if quota is not None:
                    quotas.append(quota)
    return min(quotas, default=None)


def usable_cores(affinity: int, quota: float | None) -> int:
    """Cores the process may use: its affinity, capped by its quota rounded up; at least 1."""
    cores = affinity if quota is None else min(affinity, math.ceil(quota - 1e-9))
    return max(1, cores)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as file:
            return file.read()
    except (OSError, UnicodeDecodeError):
        return None


def cores_available() -> int:
    """This process's usable cores (the module docstring), from the running system."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        affinity = os.cpu_count() or 1
    proc_self = _read("/proc/self/cgroup") or ""
    return usable_cores(affinity, cpu_quota(proc_self, _read))


def resolve_workers(workers: Workers) -> int:
    """``[server] workers`` as a number: ``"auto"`` is one per usable core (at most 64)."""
    if workers == "auto":
        return min(MAX_WORKERS, cores_available())
    return workers
