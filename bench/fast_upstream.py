"""A fast fake vLLM for scenario A: canned one-token answers on raw trio sockets.

Scenario A asks what the middle costs per request, which needs an upstream much cheaper than
the middle. The simulator is not: hypercorn, request validation, prompt counting and its engine
loop cost it milliseconds of CPU per request on the benchmark machine, so it would cap all three
modes at its own rate and the comparison would measure the simulator. This server answers every
``POST /v1/chat/completions`` with the same vLLM 0.32.0-shaped answer, byte for byte what the
simulator sends for a ``max_tokens: 1`` request (taken from it): a ``chat.completion`` body, or,
when the request asks for ``"stream": true`` (the gateway always does), the role chunk, one
content token with ``finish_reason: length``, the usage chunk and ``[DONE]``. It does not look at
the request beyond that. ``GET`` of any path answers 200 (readiness).

    python -m bench.fast_upstream --listen 127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
from functools import partial

import trio

from bench.procstat import raise_nofile_limit

BACKLOG = 2048
READ_BYTES = 65536
MAX_HEAD_BYTES = 65536
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)
_STREAM = re.compile(rb'"stream"\s*:\s*true')

COMPLETION = (
    b'{"id":"chatcmpl-7d6e89ab85d91f08","object":"chat.completion","created":1796094057,'
    b'"model":"qwen3-32b","choices":[{"index":0,"message":{"role":"assistant","content":" mild",'
    b'"refusal":null,"annotations":null,"audio":null,"function_call":null,"reasoning":null},'
    b'"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,'
    b'"routed_experts":null}],"service_tier":null,"system_fingerprint":"vllm-0.32.0-6ede1d34",'
    b'"usage":{"prompt_tokens":16,"total_tokens":17,"completion_tokens":1,'
    b'"prompt_tokens_details":null,"completion_tokens_details":{"reasoning_tokens":0}},'
    b'"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,'
    b'"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}'
)
_CHUNK_HEAD = (
    b'{"id":"chatcmpl-fa7b383597f00d74","object":"chat.completion.chunk","created":1796094057,'
    b'"model":"qwen3-32b","choices":'
)
STREAM_EVENTS = (
    _CHUNK_HEAD + b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
    b'"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}',
    _CHUNK_HEAD + b'[{"index":0,"delta":{"content":" mild"},"logprobs":null,'
    b'"finish_reason":"length","stop_reason":null,"token_ids":null}]}',
    _CHUNK_HEAD + b'[],"usage":{"prompt_tokens":16,"total_tokens":17,"completion_tokens":1,'
    b'"completion_tokens_details":{"reasoning_tokens":0}},'
    b'"system_fingerprint":"vllm-0.32.0-6ede1d34"}',
    b"[DONE]",
)


def _answers() -> tuple[bytes, bytes, bytes]:
    plain = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
        + str(len(COMPLETION)).encode()
        + b"\r\n\r\n"
        + COMPLETION
    )
    sse = b"".join(b"data: " + event + b"\n\n" for event in STREAM_EVENTS)
    stream = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
        + f"{len(sse):x}\r\n".encode()
        + sse
        + b"\r\n0\r\n\r\n"
    )
    ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
    return plain, stream, ok


PLAIN, STREAM, OK = _answers()


async def handle(stream: trio.SocketStream) -> None:
    buf = bytearray()
    try:
        while True:
            while (end := buf.find(b"\r\n\r\n")) < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    return
                data = await stream.receive_some(READ_BYTES)
                if not data:
                    return
                buf += data
            head = bytes(buf[: end + 2])
            match = _CONTENT_LENGTH.search(head)
            length = int(match.group(1)) if match else 0
            while len(buf) < end + 4 + length:
                data = await stream.receive_some(READ_BYTES)
                if not data:
                    return
                buf += data
            body = bytes(buf[end + 4 : end + 4 + length])
            del buf[: end + 4 + length]
            if head.startswith(b"POST"):
                await stream.send_all(STREAM if _STREAM.search(body) else PLAIN)
            else:
                await stream.send_all(OK)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return
    finally:
        await stream.aclose()


async def serve(host: str, port: int) -> None:
    listeners = await trio.open_tcp_listeners(port, host=host, backlog=BACKLOG)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(trio.serve_listeners, handle, listeners))
            print(f"fast upstream on http://{host}:{port}/v1", flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fast_upstream", description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:8000", metavar="HOST:PORT")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    raise_nofile_limit()
    trio.run(serve, host, int(port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
