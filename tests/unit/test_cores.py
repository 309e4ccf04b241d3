"""``[server] workers = "auto"`` (process/cores.py): the cores a process may use, from its CPU
affinity and every cgroup quota above it, v2 and v1, read from tables of fake files."""

from __future__ import annotations

import os

import pytest

from trio_gateway.config.load import parse_config
from trio_gateway.config.schema import ConfigError
from trio_gateway.process.cores import cores_available, cpu_quota, resolve_workers, usable_cores

V2_SERVICE = "0::/system.slice/trio-gateway.service\n"
V1_DOCKER = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n"

CASES = {
    # name: (/proc/self/cgroup, files, affinity, cores)
    "v2, no quota anywhere": (V2_SERVICE, {"/sys/fs/cgroup/cpu.max": "max 100000\n"}, 8, 8),
    "v2, no cpu.max at all (root cgroup)": (V2_SERVICE, {}, 4, 4),
    "v2, the service's quota, 1.5 cores: 2": (
        V2_SERVICE,
        {
            "/sys/fs/cgroup/system.slice/trio-gateway.service/cpu.max": "150000 100000\n",
            "/sys/fs/cgroup/system.slice/cpu.max": "max 100000\n",
        },
        8,
        2,
    ),
    "v2, a parent's quota is the smaller": (
        V2_SERVICE,
        {
            "/sys/fs/cgroup/system.slice/trio-gateway.service/cpu.max": "400000 100000\n",
            "/sys/fs/cgroup/system.slice/cpu.max": "300000 100000\n",
        },
        8,
        3,
    ),
    "v2, a container: the host's path is not there, its root is": (
        "0::/kubepods.slice/pod1/cri-abc\n",
        {"/sys/fs/cgroup/cpu.max": "100000 100000\n"},
        16,
        1,
    ),
    "v2, affinity below the quota": (
        V2_SERVICE,
        {"/sys/fs/cgroup/system.slice/cpu.max": "800000 100000"},
        2,
        2,
    ),
    "v1, a docker --cpus 0.5: 1": (
        V1_DOCKER,
        {
            "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000\n",
            "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        },
        4,
        1,
    ),
    "v1, quota -1 is none": (
        V1_DOCKER,
        {
            "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
            "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        },
        4,
        4,
    ),
    "v1, 3 cores in a container's root": (
        V1_DOCKER,
        {
            "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "300000",
            "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000",
        },
        8,
        3,
    ),
    "garbage is no quota": (
        V2_SERVICE,
        {"/sys/fs/cgroup/cpu.max": "lots\n", "/sys/fs/cgroup/system.slice/cpu.max": "0 0"},
        6,
        6,
    ),
    "an affinity of one core": (V2_SERVICE, {}, 1, 1),
}


@pytest.mark.parametrize("name", CASES)
def test_usable_cores(name: str) -> None:
    proc_self, files, affinity, cores = CASES[name]
    assert usable_cores(affinity, cpu_quota(proc_self, files.get)) == cores


def test_a_tiny_quota_is_still_one_worker() -> None:
    assert usable_cores(8, 0.01) == 1
    assert usable_cores(8, 2.0) == 2


def test_auto_on_this_machine_is_within_its_affinity() -> None:
    cores = cores_available()
    assert 1 <= cores <= len(os.sched_getaffinity(0))
    assert resolve_workers("auto") == min(64, cores)
    assert resolve_workers(3) == 3


def test_the_config_takes_auto_or_a_number_and_says_what_else_is_wrong() -> None:
    base = (
        '[aliases.a]\n[[aliases.a.providers]]\nname = "v"\ntype = "openai_compatible"\n'
        'base_url = "http://h/v1"\nmodel = "m"\n'
    )
    for value, expected in (('"auto"', "auto"), ("4", 4)):
        config = parse_config(f"[server]\nworkers = {value}\n{base}", source="t.toml")
        assert config.server.workers == expected
    for value, problem in (
        ('"four"', 'expected a number of workers or "auto"'),
        ("0", 'must be from 1 to 64, or "auto"'),
        ("2.0", 'expected a number of workers or "auto"'),
    ):
        with pytest.raises(ConfigError) as raised:
            parse_config(f"[server]\nworkers = {value}\n{base}", source="t.toml")
        assert any("server.workers" in p and problem in p for p in raised.value.problems), (
            raised.value.problems
        )
