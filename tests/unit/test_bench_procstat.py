"""``bench/procstat.py`` measures a server with its children: nginx's worker under its master,
the gateway's workers under their supervisor. Real processes, read from /proc."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from bench import procstat

# A parent that starts a child burning ~0.3 s of CPU, then both sleep; the child says when
# it is done burning. With "reap", the child exits and the parent waits for it.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen(
    [sys.executable, "-c", "import sys, time\\nt = time.process_time()\\n"
     "while time.process_time() - t < 0.3: pass\\nprint('burnt', flush=True)\\n"
     "if sys.argv[1] != 'reap': time.sleep(60)", sys.argv[1]],
    stdout=sys.stdout,
)
if sys.argv[1] == "reap":
    child.wait()
    print("reaped", flush=True)
time.sleep(60)
"""


@pytest.fixture
def parent(request: pytest.FixtureRequest) -> Iterator[subprocess.Popen[str]]:
    mode = getattr(request, "param", "live")
    process = subprocess.Popen(
        [sys.executable, "-c", PARENT, mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "burnt\n"
        if mode == "reap":
            assert process.stdout.readline() == "reaped\n"
        yield process
    finally:
        # Ours only, by pid: the child first (once the parent is gone it cannot be found).
        for pid in reversed(procstat.tree_pids(process.pid)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait()


def test_the_tree_is_the_process_and_its_children(parent: subprocess.Popen[str]) -> None:
    tree = procstat.tree_pids(parent.pid)
    assert tree[0] == parent.pid and len(tree) == 2


def test_without_children_files_the_tree_is_found_by_parent(
    parent: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = procstat.tree_pids(parent.pid)
    monkeypatch.setattr(procstat, "_CHILDREN_FILES", False)
    assert procstat.tree_pids(parent.pid) == expected


def test_a_sample_sums_cpu_and_memory_over_the_tree(parent: subprocess.Popen[str]) -> None:
    point = procstat._point(parent.pid, 0.0)
    assert point is not None
    own = procstat.cpu_seconds(parent.pid)
    assert own is not None and point.root_cpu_s == own
    assert point.cpu_s >= own + 0.25  # the child's burn, most of 0.3 s at 100 Hz ticks
    assert point.processes == 2
    alone = procstat.rss_kib(parent.pid)
    assert alone is not None and point.rss_kib > alone


@pytest.mark.parametrize("parent", ["reap"], indirect=True)
def test_a_child_that_exited_and_was_reaped_still_counts(parent: subprocess.Popen[str]) -> None:
    point = procstat._point(parent.pid, 0.0)
    assert point is not None and point.processes == 1
    assert point.cpu_s >= point.root_cpu_s + 0.25


def test_the_sampler_reports_the_roots_share_and_the_process_count(
    parent: subprocess.Popen[str],
) -> None:
    with procstat.Sampler({"p": parent.pid}, interval_s=0.01) as sampler:
        sampler.mark("start")
        time.sleep(0.05)
        sampler.mark("end")
    summary = sampler.summary("p")
    assert summary["processes_peak"] == 2
    assert 0 <= summary["cpu_s_root"] <= summary["cpu_s"]
