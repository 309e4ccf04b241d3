"""The cancellation benchmark's configuration and its load generator (see bench/cancellation.py).

The load: N streams start together, one connection each; a seeded fraction of the clients leave
after L content tokens; the simulator's state is sampled meanwhile.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import attrs
import httpx
import trio

from trio_gateway.sim.text import count_prompt

SERVED_MODEL = "qwen3-32b"
ALIAS = "bench"
RESULTS_DIR = Path(__file__).resolve().parent / "results"
MODES = ("direct", "gateway", "naive")
# The gateway's Responses WebSocket (bench/cancellation_ws.py): a leaver drops its TCP
# connection, or sends a close frame. Asked for by name only (not in the suite's run).
Leave = Literal["drop", "close"]
WS_MODES: dict[str, Leave] = {"gateway-ws": "drop", "gateway-ws-close": "close"}
GATEWAY_MODES = ("gateway", *WS_MODES)
# Filler words for prompts: each is exactly one simulator token (docs/simulator.md).
PROMPT_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "again")
CONNECT_TIMEOUT_S = 10.0
ERROR_BODY_BYTES = 4096
LOG_PROBLEM = re.compile(r"Traceback|ERROR|CRITICAL|Exception")
_METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


# ---------------------------------------------------------------- configuration


@attrs.frozen(kw_only=True)
class BenchConfig:
    streams: int
    prompt_tokens: int
    max_tokens: int
    leave_fraction: float
    leave_after: int
    max_num_seqs: int
    decode_step_s: float
    decode_step_s_per_seq: float
    prefill_s_per_token: float
    modes: tuple[str, ...]
    max_inflight: tuple[int, ...]
    queue_timeout_s: float
    seed: int
    deadline_s: float
    drain_timeout_s: float
    poll_s: float


class LoadShape(Protocol):
    """What the load generator reads of a configuration: BenchConfig here, the real-vLLM
    variant's own in bench/cancellation_vllm.py."""

    @property
    def streams(self) -> int: ...
    @property
    def leave_fraction(self) -> float: ...
    @property
    def leave_after(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def deadline_s(self) -> float: ...
    @property
    def drain_timeout_s(self) -> float: ...
    @property
    def poll_s(self) -> float: ...


@attrs.frozen(kw_only=True)
class Mode:
    kind: str  # direct | gateway | naive | gateway-ws | gateway-ws-close
    max_inflight: int | None = None

    @property
    def label(self) -> str:
        if self.kind == "gateway":
            return f"gateway (max_inflight={self.max_inflight})"
        if self.kind == "gateway-ws":
            return f"gateway, Responses WebSocket, dropped (max_inflight={self.max_inflight})"
        if self.kind == "gateway-ws-close":
            return f"gateway, Responses WebSocket, close frame (max_inflight={self.max_inflight})"
        if self.kind == "naive":
            return "naive proxy (no disconnect propagation)"
        return "direct to the simulator"


def _positive_ints(text: str) -> tuple[int, ...]:
    values = tuple(int(v) for v in text.split(",") if v.strip())
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas: {text}")
    return values


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    known = (*MODES, *WS_MODES)
    unknown = [m for m in modes if m not in known]
    if not modes or unknown:
        raise argparse.ArgumentTypeError(f"modes are {', '.join(known)}; got {text!r}")
    return modes


def parse_args(argv: Sequence[str]) -> BenchConfig:
    p = argparse.ArgumentParser(
        prog="python -m bench.cancellation",
        description="Clients that leave early: direct vs gateway vs a naive proxy.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--streams", type=int, default=100)
    p.add_argument("--prompt-tokens", type=int, default=500)
    p.add_argument("--max-tokens", type=int, default=2000)
    p.add_argument("--leave-fraction", type=float, default=0.4)
    p.add_argument("--leave-after", type=int, default=100, help="content tokens, then close")
    p.add_argument("--max-num-seqs", type=int, default=32, help="the simulator's batch size")
    p.add_argument("--decode-step-s", type=float, default=0.004)
    p.add_argument("--decode-step-s-per-seq", type=float, default=0.00016)
    p.add_argument("--prefill-s-per-token", type=float, default=0.00002)
    p.add_argument(
        "--modes",
        type=_modes,
        default=MODES,
        help=f"comma-separated; also {', '.join(WS_MODES)} (the Responses WebSocket)",
    )
    p.add_argument(
        "--max-inflight",
        type=_positive_ints,
        default=(32, 28),
        help="gateway (and gateway-ws) runs, one per value",
    )
    p.add_argument(
        "--queue-timeout-s", type=float, default=600.0, help="gateway: wait for a slot this long"
    )
    p.add_argument("--seed", type=int, default=1, help="chooses which clients leave")
    p.add_argument("--deadline-s", type=float, default=600.0, help="per mode, for the clients")
    p.add_argument(
        "--drain-timeout-s", type=float, default=300.0, help="then, for the simulator to go idle"
    )
    p.add_argument("--poll-s", type=float, default=0.25, help="sampling of the simulator's queue")
    a = p.parse_args(argv)
    if a.streams < 1 or a.max_tokens < 1 or a.leave_after < 1 or a.max_num_seqs < 1:
        p.error("--streams, --max-tokens, --leave-after and --max-num-seqs must be at least 1")
    if not 0.0 <= a.leave_fraction <= 1.0:
        p.error("--leave-fraction must be between 0 and 1")
    if a.leave_after >= a.max_tokens:
        p.error("--leave-after must be below --max-tokens (or nobody leaves early)")
    if a.prompt_tokens < _prompt_overhead():
        p.error(f"--prompt-tokens must be at least {_prompt_overhead()}")
    return BenchConfig(
        streams=a.streams,
        prompt_tokens=a.prompt_tokens,
        max_tokens=a.max_tokens,
        leave_fraction=a.leave_fraction,
        leave_after=a.leave_after,
        max_num_seqs=a.max_num_seqs,
        decode_step_s=a.decode_step_s,
        decode_step_s_per_seq=a.decode_step_s_per_seq,
        prefill_s_per_token=a.prefill_s_per_token,
        modes=a.modes,
        max_inflight=a.max_inflight,
        queue_timeout_s=a.queue_timeout_s,
        seed=a.seed,
        deadline_s=a.deadline_s,
        drain_timeout_s=a.drain_timeout_s,
        poll_s=a.poll_s,
    )


def expand_modes(config: BenchConfig) -> list[Mode]:
    modes: list[Mode] = []
    for kind in config.modes:
        if kind in GATEWAY_MODES:
            modes.extend(Mode(kind=kind, max_inflight=n) for n in config.max_inflight)
        else:
            modes.append(Mode(kind=kind))
    return modes


# ---------------------------------------------------------------- the load


def _user_message(tag: str, filler: int) -> dict[str, Any]:
    words = [PROMPT_WORDS[i % len(PROMPT_WORDS)] for i in range(filler)]
    return {"role": "user", "content": " ".join([tag, *words])}


def _prompt_overhead() -> int:
    return count_prompt([_user_message("x", 0)], None, thinking=False).tokens


def request_body(config: BenchConfig, model: str, tag: str) -> dict[str, Any]:
    """A prompt of exactly ``prompt_tokens`` simulator tokens; ``tag`` (one token) makes it
    unique, so the prefix cache never helps. Thinking is off so every token is content."""
    filler = config.prompt_tokens - _prompt_overhead()
    message = _user_message(tag, filler)
    counted = count_prompt([message], None, thinking=False).tokens
    if counted != config.prompt_tokens:
        raise ValueError(f"prompt counts {counted} tokens, wanted {config.prompt_tokens}")
    return {
        "model": model,
        "messages": [message],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": config.max_tokens,
        "ignore_eos": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }


def leavers(config: LoadShape) -> list[bool]:
    count = round(config.streams * config.leave_fraction)
    chosen = set(random.Random(config.seed).sample(range(config.streams), count))
    return [i in chosen for i in range(config.streams)]


@attrs.define
class StreamResult:
    index: int
    leaves: bool
    status: int | None = None
    ttft_s: float | None = None  # request start → first content token
    end_s: float | None = None  # from the common start
    tokens: int = 0  # content tokens received
    finish_reason: str | None = None
    prompt_tokens: int | None = None  # from the usage chunk (stayers only)
    completion_tokens: int | None = None
    left: bool = False  # closed the connection on purpose
    error: str | None = None


@attrs.frozen
class Sample:
    t_s: float
    running: int
    waiting: int
    generated: int  # the simulator's tokens_generated so far
    prefilled: int  # prompt tokens admitted so far (no prefix-cache hits in this benchmark)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → {name: value}, summing over label sets (enough for our gauges)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = _METRIC_LINE.match(line.strip())
        if match is None or line.startswith("#"):
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        values[match.group(1)] = values.get(match.group(1), 0.0) + value
    return values


async def _sim_sample(client: httpx.AsyncClient, sim_url: str, t_s: float) -> Sample:
    response = await client.get(f"{sim_url}/metrics")
    metrics = parse_metrics(response.text)
    return Sample(
        t_s=t_s,
        running=int(metrics.get("vllm:num_requests_running", 0)),
        waiting=int(metrics.get("vllm:num_requests_waiting", 0)),
        generated=int(metrics.get("vllm:generation_tokens_total", 0)),
        prefilled=int(metrics.get("vllm:prompt_tokens_total", 0)),
    )


async def _stream(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    leave_after: int,
    result: StreamResult,
    t0: float,
    chars_are_tokens: bool,
    start_after_s: float,
) -> None:
    await trio.sleep(start_after_s)
    started = trio.current_time()
    try:
        async with client.stream("POST", url, json=body) as response:
            result.status = response.status_code
            if response.status_code != 200:
                text = (await response.aread())[:ERROR_BODY_BYTES].decode("utf-8", "replace")
                result.error = f"HTTP {response.status_code}: {text}"
                return
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = f"in-stream error: {json.dumps(chunk['error'])[:500]}"
                    break
                usage = chunk.get("usage")
                if usage and not chunk.get("choices"):
                    result.prompt_tokens = usage.get("prompt_tokens")
                    result.completion_tokens = usage.get("completion_tokens")
                for choice in chunk.get("choices") or ():
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        if result.ttft_s is None:
                            result.ttft_s = trio.current_time() - started
                        result.tokens += len(content) if chars_are_tokens else 1
                    if choice.get("finish_reason"):
                        result.finish_reason = choice["finish_reason"]
                if result.leaves and result.tokens >= leave_after:
                    # Leaving the block closes the unfinished response: the connection goes.
                    result.left = True
                    break
    except (httpx.HTTPError, ValueError) as exc:  # ValueError: a chunk that is not JSON
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        result.end_s = trio.current_time() - t0


# One stream spoken another way than an HTTP chat stream (bench/cancellation_ws.py): its body,
# the leaver's token count, its result to fill in, and the common start.
Speaker = Callable[[dict[str, Any], int, StreamResult, float], Awaitable[None]]


@attrs.frozen(kw_only=True)
class LoadOutcome:
    streams: list[StreamResult]
    samples: list[Sample]
    clients_done_s: float
    clients_timed_out: bool
    sim_idle_s: float | None  # from the start until running + waiting was 0 again


async def run_load(
    config: LoadShape,
    url: str,
    sim_url: str,
    bodies: list[dict[str, Any]],
    headers: Mapping[str, str] | None = None,
    *,
    chars_are_tokens: bool = False,
    stagger_s: float = 0.0,
    speaker: Speaker | None = None,
) -> LoadOutcome:
    """Every stream at once, one connection each; then wait for the simulator (or vLLM: the
    same ``vllm:*`` metrics at ``sim_url``/metrics) to go idle. ``headers`` go with every
    request (a real vLLM wants its API key). A content chunk is one token (the simulator's
    way) unless ``chars_are_tokens``: then each character is one (a real vLLM may put several
    tokens in a chunk; bench/cancellation_vllm.py makes every token one character). Stream
    ``i`` starts ``i * stagger_s`` after the first: with a stagger the requests arrive in index
    order, so which clients are in the engine's first batch is the same in every mode. With a
    ``speaker``, each stream is ``speaker``'s (its own connection; ``url`` is not used)."""
    who_leaves = leavers(config)
    results = [StreamResult(index=i, leaves=who_leaves[i]) for i in range(config.streams)]
    samples: list[Sample] = []
    timeout = httpx.Timeout(
        connect=CONNECT_TIMEOUT_S, write=CONNECT_TIMEOUT_S, pool=CONNECT_TIMEOUT_S, read=None
    )
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=0)
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(timeout=timeout, limits=limits, headers=headers, trust_env=False)
            )
            for _ in range(config.streams if speaker is None else 0)
        ]
        monitor = await stack.enter_async_context(
            httpx.AsyncClient(timeout=CONNECT_TIMEOUT_S, trust_env=False)
        )
        t0 = trio.current_time()
        sim_idle_s: float | None = None

        async def sample_forever() -> None:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    samples.append(await _sim_sample(monitor, sim_url, trio.current_time() - t0))
                await trio.sleep(config.poll_s)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample_forever)
            with trio.move_on_after(config.deadline_s) as deadline:
                async with trio.open_nursery() as streams:
                    for i, (body, result) in enumerate(zip(bodies, results, strict=True)):
                        if speaker is not None:
                            streams.start_soon(speaker, body, config.leave_after, result, t0)
                            continue
                        streams.start_soon(
                            _stream,
                            clients[i],
                            url,
                            body,
                            config.leave_after,
                            result,
                            t0,
                            chars_are_tokens,
                            i * stagger_s,
                        )
            clients_done_s = trio.current_time() - t0
            with trio.move_on_after(config.drain_timeout_s):
                while True:
                    with contextlib.suppress(httpx.HTTPError):
                        last = await _sim_sample(monitor, sim_url, trio.current_time() - t0)
                        if last.running == last.waiting == 0:
                            sim_idle_s = trio.current_time() - t0
                            break
                    await trio.sleep(config.poll_s / 5)
            nursery.cancel_scope.cancel()
    for result in results:
        if not (result.finish_reason or result.left or result.error):
            late = deadline.cancelled_caught
            result.error = "cut by the deadline" if late else "ended without a finish_reason"
    return LoadOutcome(
        streams=results,
        samples=samples,
        clients_done_s=clients_done_s,
        clients_timed_out=deadline.cancelled_caught,
        sim_idle_s=sim_idle_s,
    )
