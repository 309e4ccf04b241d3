"""Scenario C's clients on the Responses API's WebSocket mode (``GET /v1/responses``), for the
``gateway-ws`` and ``gateway-ws-close`` modes of bench/cancellation.py.

Each client opens its own socket, sends one ``response.create`` and counts its
``response.output_text.delta`` events, as the HTTP clients count their content chunks. A leaver
leaves after its L-th token in one of two ways:

- ``drop``: the TCP connection closed with no close frame first (as Codex leaves);
- ``close``: a close frame (1000), then, once the gateway's own close frame is back (as a
  polite client waits for it), the connection.

The Responses front forwards neither ``ignore_eos`` nor ``chat_template_kwargs`` (request.py
reads the API's fields only), so the simulator is told through a ``<sim>`` script in the prompt
instead: ``text_tokens: M`` and ``finish: length`` is exactly M content tokens, no thinking and
no EOS, what ``ignore_eos`` gives the HTTP modes. The filler words around it make the prompt the
same P tokens (the script has no reasoning step, so thinking stays on and the template's
"thinking off" tokens are not counted).

A raw wsproto client rather than trio-websocket: the drop needs the TCP stream itself (which
trio-websocket keeps private), and one task per socket, no background reader, keeps the load
generator's own CPU as the HTTP clients'.
"""

from __future__ import annotations

import json
from typing import Any, Final

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import ProtocolError

from bench.cancellation_load import (
    CONNECT_TIMEOUT_S,
    ERROR_BODY_BYTES,
    PROMPT_WORDS,
    Leave,
    StreamResult,
)
from trio_gateway.sim.text import count_prompt

# How long a leaver that sent its close frame waits for the gateway's before it hangs up.
CLOSE_REPLY_TIMEOUT_S: Final = 10.0
# The Responses API's way to say "stopped at max_output_tokens": the chat's finish "length".
FINISH_OF_INCOMPLETE: Final[dict[object, str]] = {"max_output_tokens": "length"}
TERMINAL: Final = ("response.completed", "response.incomplete", "response.failed", "error")


def _script(max_tokens: int) -> str:
    steps = [{"text_tokens": max_tokens}, {"finish": "length"}]
    return "<sim>" + json.dumps({"steps": steps}, separators=(",", ":")) + "</sim>"


def _text(tag: str, max_tokens: int, filler: int) -> str:
    words = [PROMPT_WORDS[i % len(PROMPT_WORDS)] for i in range(filler)]
    return " ".join([tag, _script(max_tokens), *words])


def _tokens(text: str) -> int:
    return count_prompt([{"role": "user", "content": text}], None, thinking=True).tokens


def create_message(model: str, tag: str, *, prompt_tokens: int, max_tokens: int) -> dict[str, Any]:
    """The ``response.create`` of one stream: a prompt of exactly ``prompt_tokens`` simulator
    tokens (``tag`` makes it unique), answered with exactly ``max_tokens`` content tokens."""
    filler = prompt_tokens - _tokens(_text(tag, max_tokens, 0))
    if filler < 0:
        raise ValueError(f"the script alone is more than {prompt_tokens} prompt tokens")
    text = _text(tag, max_tokens, filler)
    counted = _tokens(text)
    if counted != prompt_tokens:
        raise ValueError(f"prompt counts {counted} tokens, wanted {prompt_tokens}")
    return {
        "type": "response.create",
        "model": model,
        "input": [{"type": "message", "role": "user", "content": text}],
        "max_output_tokens": max_tokens,
        "store": False,
    }


class Reader:
    """One socket's state as its events arrive (wsproto's, then the gateway's JSON)."""

    def __init__(self, result: StreamResult, leave_after: int, started: float) -> None:
        self.result = result
        self.leave_after = leave_after
        self.started = started
        self.accepted = False
        self.parts: list[str] = []  # a text message's fragments so far
        self.rejected = bytearray()

    def on_message(self, text: str) -> bool:
        """One of the gateway's messages; True once the client leaves or the answer ended."""
        result = self.result
        event = json.loads(text)
        kind = event.get("type")
        if kind == "response.output_text.delta":
            if event.get("delta"):
                if result.ttft_s is None:
                    result.ttft_s = trio.current_time() - self.started
                result.tokens += 1
            if result.leaves and result.tokens >= self.leave_after:
                result.left = True
                return True
            return False
        if kind not in TERMINAL:
            return False
        response = event.get("response") or {}
        usage = response.get("usage") or {}
        result.prompt_tokens = usage.get("input_tokens")
        result.completion_tokens = usage.get("output_tokens")
        if kind == "response.completed":
            result.finish_reason = "stop"
        elif kind == "response.incomplete":
            reason = (response.get("incomplete_details") or {}).get("reason")
            result.finish_reason = FINISH_OF_INCOMPLETE.get(reason, str(reason))
        else:
            error = event.get("error") or response.get("error")
            result.error = f"{kind}: {json.dumps(error)[:500]}"
        return True


async def ws_stream(
    host: str,
    port: int,
    leave: Leave,
    body: dict[str, Any],
    leave_after: int,
    result: StreamResult,
    t0: float,
) -> None:
    """One stream over its own socket (bench/cancellation_load.py's ``Speaker``). The time to
    first token counts from before the TCP connect, as the HTTP clients' does (each of them
    opens its own connection too)."""
    started = trio.current_time()
    client = Reader(result, leave_after, started)
    ws = WSConnection(ConnectionType.CLIENT)
    try:
        with trio.fail_after(CONNECT_TIMEOUT_S):
            stream = await trio.open_tcp_stream(host, port)
        async with stream:
            await stream.send_all(ws.send(Request(host=f"{host}:{port}", target="/v1/responses")))
            ended = await _read_until_done(stream, ws, client, body)
            if ended and leave == "close" and result.left:
                await stream.send_all(ws.send(CloseConnection(code=1000)))
                with trio.move_on_after(CLOSE_REPLY_TIMEOUT_S):
                    await _read_until_closed(stream, ws)
            # Leaving the block closes the TCP connection: for a "drop" leaver, with no close
            # frame before it.
    except (
        OSError,
        trio.BrokenResourceError,
        trio.TooSlowError,
        ValueError,  # a message that is not JSON
        ProtocolError,
    ) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        result.end_s = trio.current_time() - t0


async def _read_until_done(
    stream: trio.SocketStream, ws: WSConnection, client: Reader, body: dict[str, Any]
) -> bool:
    """Read until the answer ended or the client left (True), or the socket did (False)."""
    result = client.result
    while True:
        data = await stream.receive_some()
        if not data:
            result.error = result.error or "the gateway closed the connection"
            return False
        ws.receive_data(data)
        for event in ws.events():
            if isinstance(event, Ping):
                await stream.send_all(ws.send(event.response()))
            elif isinstance(event, AcceptConnection):
                result.status = 101
                await stream.send_all(ws.send(TextMessage(data=json.dumps(body))))
            elif isinstance(event, TextMessage):
                client.parts.append(event.data)
                if event.message_finished:
                    text, client.parts = "".join(client.parts), []
                    if client.on_message(text):
                        return True
            elif isinstance(event, RejectConnection):
                result.status = event.status_code
                if not event.has_body:
                    result.error = f"HTTP {event.status_code}: the upgrade was refused"
                    return False
            elif isinstance(event, RejectData):
                client.rejected += event.data
                if event.body_finished:
                    text = bytes(client.rejected[:ERROR_BODY_BYTES]).decode("utf-8", "replace")
                    result.error = f"HTTP {result.status}: {text}"
                    return False
            elif isinstance(event, CloseConnection):
                result.error = f"closed by the gateway: {event.code} {event.reason}"
                return False


async def _read_until_closed(stream: trio.SocketStream, ws: WSConnection) -> None:
    """After our close frame: what is still in flight, read and ignored, up to the gateway's
    close frame (or its end of the connection)."""
    while True:
        data = await stream.receive_some()
        if not data:
            return
        ws.receive_data(data)
        for event in ws.events():
            if isinstance(event, CloseConnection):
                return
