"""CPU per relayed chunk on the gateway's pure path: SSE decode, vLLM chunk parse, OpenAI chunk
encode. The I/O shell (hypercorn, h11, httpx, trio) is not in it: bench/cancellation.py measures
the whole process.

    .venv/bin/python -m bench.chunk_path [--chunks 200000]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence

from trio_gateway.core.sse import SSEDecoder
from trio_gateway.fronts.openai_chunks import ChunkEncoder
from trio_gateway.providers.openai_compatible.dialect import ChunkParser

# A content chunk exactly as vLLM 0.32 sends it (tests/fixtures/vllm-0.32.0).
VLLM_CHUNK = {
    "id": "chatcmpl-a7013ea28c80d9a5",
    "object": "chat.completion.chunk",
    "created": 1795960731,
    "model": "qwen3-32b",
    "choices": [
        {
            "index": 0,
            "delta": {"content": " weather"},
            "logprobs": None,
            "finish_reason": None,
            "token_ids": None,
        }
    ],
}


def run(chunks: int, per_read: int) -> float:
    """CPU seconds per chunk, with ``per_read`` chunks arriving in one network read."""
    frame = b"data: " + json.dumps(VLLM_CHUNK, separators=(",", ":")).encode() + b"\n\n"
    read = frame * per_read
    reads = chunks // per_read
    decoder = SSEDecoder()
    parser = ChunkParser("bench")
    encoder = ChunkEncoder(
        completion_id="chatcmpl-bench", created=0, model="agent-lite", include_usage=False
    )
    parser.feed_data(b'{"choices": []}')  # the response-started event, once
    out = 0
    start = time.process_time()
    for _ in range(reads):
        for sse in decoder.feed(read):
            for event in parser.feed_data(sse.data):
                out += len(encoder.encode(event))
    elapsed = time.process_time() - start
    assert out > 0
    return elapsed / (reads * per_read)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--chunks", type=int, default=200_000)
    args = parser.parse_args(argv)
    print("| chunks per network read | CPU per chunk (µs) |")
    print("| --- | --- |")
    for per_read in (1, 4, 16):
        print(f"| {per_read} | {run(args.chunks, per_read) * 1e6:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
