"""The gateway with ``tracemalloc`` on, for bench/stream_memory.py:

    python -m bench.traced_gateway SNAPSHOT_PREFIX FRAMES serve --config ...

FRAMES: how much of each allocation's traceback is kept (more cost more time). Each SIGUSR1
writes a snapshot to ``SNAPSHOT_PREFIX-N`` (N = 0, 1, ...), then an empty
``SNAPSHOT_PREFIX-N.done`` once it is whole."""

from __future__ import annotations

import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType


def main() -> int:
    prefix, frames, rest = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    taken = 0

    def snapshot(signum: int, frame: FrameType | None) -> None:
        nonlocal taken
        path = Path(f"{prefix}-{taken}")
        taken += 1
        tracemalloc.take_snapshot().dump(str(path))
        path.with_suffix(".done").touch()

    tracemalloc.start(frames)
    signal.signal(signal.SIGUSR1, snapshot)
    from trio_gateway.cli.main import main as gateway_main

    return gateway_main(rest)


if __name__ == "__main__":
    sys.exit(main())
