"""A headless chromium driven over the DevTools protocol (CDP): for a page a test must type
into (the status page's key form), which --dump-dom cannot. One tab, one WebSocket, commands
answered in order; the events chromium sends meanwhile are skipped."""

from __future__ import annotations

import base64
import itertools
import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio
import trio_websocket

from tests.e2e.test_status_page import CHROMIUM_FLAGS, chromium

START_TIMEOUT_S = 20.0


class Tab:
    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self._ids)
        await self._ws.send_message(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(await self._ws.get_message())
            if message.get("id") == ident:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                result: dict[str, Any] = message["result"]
                return result

    async def evaluate(self, expression: str) -> Any:
        """The value of ``expression`` in the page (a promise is awaited)."""
        answer = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in answer:
            raise AssertionError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = 10.0) -> Any:
        """Until ``expression`` is truthy in the page (the page's own timers run meanwhile; one
        that throws, the page still loading, counts as not yet)."""
        with trio.fail_after(timeout_s):
            while True:
                answer = await self.send(
                    "Runtime.evaluate", expression=expression, returnByValue=True
                )
                value = answer["result"].get("value")
                if "exceptionDetails" not in answer and value:
                    return value
                await trio.sleep(0.05)

    async def screenshot(self, path: Path) -> None:
        shot = await self.send("Page.captureScreenshot", format="png")
        await trio.Path(path.parent).mkdir(parents=True, exist_ok=True)
        await trio.Path(path).write_bytes(base64.b64decode(shot["data"]))


@asynccontextmanager
async def browser_tab(url: str, profile: Path) -> AsyncIterator[Tab]:
    """A chromium showing ``url``, and its tab."""
    args = [
        chromium(),
        *(f for f in CHROMIUM_FLAGS if not f.startswith("--virtual-time-budget")),
        "--remote-debugging-port=0",
        "--window-size=1000,900",
        f"--user-data-dir={profile}",
        url,
    ]
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                args,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
            )
        )
        try:
            port_file = profile / "DevToolsActivePort"
            with trio.fail_after(START_TIMEOUT_S):
                while not port_file.exists() or not port_file.read_text().strip():  # noqa: ASYNC110
                    await trio.sleep(0.05)
            port = int(port_file.read_text().split()[0])
            async with httpx.AsyncClient() as client:
                targets = (await client.get(f"http://127.0.0.1:{port}/json/list")).json()
            (page,) = [t for t in targets if t["type"] == "page"]
            async with trio_websocket.open_websocket_url(
                page["webSocketDebuggerUrl"], max_message_size=64 * 1024 * 1024
            ) as ws:
                yield Tab(ws)
        finally:
            process.kill()
            nursery.cancel_scope.cancel()
