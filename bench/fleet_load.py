"""The load of scenario F (``bench/fleet.py``): agent sessions of several turns, and what is
sampled while they run.

A session is one conversation: a system prompt shared by every session, a first user message
of its own, then turn after turn, each resending the whole history (every earlier answer and
message) plus a new user message, as agents and chat clients do. Turns of one session run in
order; ``concurrency`` sessions run at once, each client taking the next session when its
current one ends.

Each turn is one streamed request on its own connection (``bench/rawhttp.py``), timed by the
client: time to first token is from just before connecting to the first non-empty
``delta.content``. The usage chunk at the end gives the prompt tokens and, as
``prompt_tokens_details.cached_tokens``, the tokens the replica's prefix cache served: the
hit rate as the client sees it, per request. A turn that fails in a way the client sees is
retried (a real agent would), and every failed attempt is kept.

While the sessions run, each simulator's ``/load`` (running + waiting sequences) is read every
``sample_interval_s``.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
import httpx
import trio

from bench import harness
from bench.rawhttp import RequestFailed, Response, connect, error_code

HOST = "127.0.0.1"


# ---------------------------------------------------------------- the conversation's text

# The shared system prompt is built from these, numbered and repeated until it is long enough:
# fixed text, identical for every session, so the fleet's caches can share its blocks.
_SYSTEM_HEAD = (
    "You are Fleet, a careful coding agent. You work in a Python repository through the tools "
    "you are given, one step at a time, and you explain each step in one or two sentences "
    "before you take it. Follow these rules in every answer."
)
_RULES = (
    "Read the task and every file it names before you change anything.",
    "Prefer the smallest change that solves the problem; leave unrelated code alone.",
    "Run the failing test first, and read its output to the end before you guess a cause.",
    "When a command fails, quote the first line of the error and say what you will try next.",
    "Never invent a file, a function or a flag: look it up, and say so when you cannot.",
    "Keep a short plan of numbered steps, and say which step you are on.",
    "Write type hints on every new function, and a docstring that says why it exists.",
    "After each change, run the tests of the module you touched, then the whole suite.",
    "Ask before you delete data, rewrite history, or touch anything outside the repository.",
    "When you are done, list the files you changed and one line on each change.",
    "If two rules disagree, the earlier rule wins, and you say that you noticed it.",
    "Answer in plain words; no tables unless asked, and no more than a screen of text.",
)


def system_prompt(target_tokens: int, count: Callable[[str], int]) -> str:
    """The shared system prompt: the head, then numbered rules, until ``count`` (the
    simulator's token rule for a prompt holding only this system message) reaches
    ``target_tokens``."""
    lines = [_SYSTEM_HEAD]
    number = 0
    while count("\n".join(lines)) < target_tokens:
        number += 1
        lines.append(f"Rule {number}: {_RULES[(number - 1) % len(_RULES)]}")
    return "\n".join(lines)


def first_message(session: int) -> str:
    """Each session's own opening question: what makes its history (and its affinity key
    without the header) distinct from every other session's."""
    return (
        f"Session {session}: please fix issue #{4000 + session} in module "
        f"pkg{session % 17}/mod{session}.py. The failing test is test_case_{session}, and the "
        f"log says error E{session * 7 % 1000} at line {session % 300 + 10}. Start with step 1."
    )


def next_message(session: int, turn: int, output_lines: int) -> str:
    """What the agent's next turn sends: the output of the tool the last answer ran (a test
    run's traceback, ``output_lines`` lines of it), then the request to go on. Tool results
    are what make an agent's history grow by hundreds of tokens a turn."""
    lines = [f"Step {turn} ran. The tool printed:"]
    for k in range(output_lines):
        line = (session * 31 + turn * 7 + k) % 900 + 10
        lines.append(
            f'  File "pkg{session % 17}/mod{session}.py", line {line}, in step_{turn}_{k}: '
            "assert result == expected"
        )
    lines.append(f"Tell me in a sentence what this means, then go on with step {turn + 1}.")
    return "\n".join(lines)


# ---------------------------------------------------------------- one turn


@attrs.define
class Turn:
    """One attempt at one turn of one session, as the client saw it. Times are seconds from
    the start of the load."""

    session: int
    turn: int
    attempt: int
    started_s: float = 0.0
    ttft_s: float | None = None  # started → first non-empty delta.content
    end_s: float | None = None
    tokens: int = 0  # content chunks
    prompt_tokens: int | None = None  # from the usage chunk
    cached_tokens: int | None = None  # prompt_tokens_details.cached_tokens
    error: str | None = None
    detail: str | None = None


def turn_request(port: int, body: dict[str, Any], session_id: str | None) -> bytes:
    payload = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    head = (
        f"POST {harness.CHAT_PATH} HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
        "content-type: application/json\r\n"
        + (f"x-session-id: {session_id}\r\n" if session_id is not None else "")
        + f"content-length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


async def stream_turn(
    result: Turn, port: int, request: bytes, t0: float, connect_timeout_s: float
) -> str:
    """POST one streamed turn and read it to the end; returns the answer's text (what the
    client appends to the history) and fills ``result``."""
    started = time.monotonic()
    result.started_s = started - t0
    text: list[str] = []
    done = False
    stream: trio.SocketStream | None = None
    try:
        stream = await connect(HOST, port, timeout_s=connect_timeout_s)
        await stream.send_all(request)
        response = Response(stream)
        await response.read_head()
        if response.status != 200:
            body = await response.read_body()
            raise RequestFailed(f"http_{response.status}:{error_code(body)}", body[:300].decode())
        pending = b""
        while (piece := await response.next_piece()) is not None:
            now = time.monotonic()
            pending += piece
            *events, pending = pending.split(b"\n\n")
            for event in events:
                data = event.removeprefix(b"data: ")
                if data is event:
                    continue  # a comment or another field
                if data == b"[DONE]":
                    done = True
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    error = chunk["error"]
                    code = error.get("code", "?") if isinstance(error, dict) else error
                    raise RequestFailed(f"in_stream:{code}", json.dumps(error)[:300])
                usage = chunk.get("usage")
                if usage:
                    result.prompt_tokens = usage.get("prompt_tokens")
                    details = usage.get("prompt_tokens_details") or {}
                    result.cached_tokens = details.get("cached_tokens")
                for choice in chunk.get("choices") or ():
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        if result.ttft_s is None:
                            result.ttft_s = now - started
                        text.append(content)
                        result.tokens += 1
        if not done:
            raise RequestFailed("incomplete", "no [DONE]")
        if result.prompt_tokens is None:
            raise RequestFailed("no_usage", "no usage chunk")
    except RequestFailed as exc:
        result.error, result.detail = exc.kind, exc.detail
    except ValueError as exc:
        result.error, result.detail = "bad_json", str(exc)[:200]
    finally:
        if stream is not None:
            with trio.CancelScope(shield=True):
                await stream.aclose()
        result.end_s = time.monotonic() - t0
    return "".join(text)


# ---------------------------------------------------------------- progress and samplers


class Progress:
    """Turns completed so far, and events set when given fractions of all turns are done
    (the kill and the restart wait on them)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.finished = trio.Event()  # every session ended
        self._marks: list[tuple[float, trio.Event]] = []

    def at(self, fraction: float) -> trio.Event:
        event = trio.Event()
        self._marks.append((fraction, event))
        self._check()
        return event

    def turn_done(self) -> None:
        self.done += 1
        self._check()

    def _check(self) -> None:
        for fraction, event in self._marks:
            if self.done >= fraction * self.total:
                event.set()


@attrs.define
class LoadSeries:
    """Each replica's running + waiting sequences (its ``/load``), sampled: None where the
    replica did not answer (killed)."""

    t_s: list[float] = attrs.Factory(list)
    loads: list[list[int | None]] = attrs.Factory(list)  # [sample][replica]


async def sample_loads(urls: Sequence[str], interval_s: float, t0: float, into: LoadSeries) -> None:
    """Until cancelled: every ``interval_s``, each simulator's ``/load`` (a few bytes of JSON,
    cheap for the simulator, like ``/sim/stats`` without ``?bodies=1``)."""
    async with httpx.AsyncClient(timeout=1.0, trust_env=False) as client:
        tick = trio.current_time()
        while True:
            row: list[int | None] = []
            for url in urls:
                try:
                    response = await client.get(f"{url}/load")
                    row.append(int(response.json()["server_load"]))
                except (httpx.HTTPError, ValueError, KeyError):
                    row.append(None)
            into.t_s.append(time.monotonic() - t0)
            into.loads.append(row)
            tick += interval_s
            await trio.sleep_until(max(tick, trio.current_time()))


def replica_states(metrics_text: str) -> dict[str, str]:
    states: dict[str, str] = {}
    for name, labels, value in prometheus_samples(metrics_text):
        if name == "gateway_replica_state" and value == 1.0:
            states[labels.get("replica", "?")] = labels.get("state", "?")
    return states


def prometheus_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample line. Enough for the gateway's and the
    simulator's own expositions: label values here hold no quotes, commas or escapes."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name, _, rest = name_labels.partition("{")
        labels: dict[str, str] = {}
        for part in rest.rstrip("}").split(","):
            key, eq, raw = part.partition("=")
            if eq:
                labels[key.strip()] = raw.strip().strip('"')
        try:
            samples.append((name, labels, float(value)))
        except ValueError:
            continue
    return samples


# ---------------------------------------------------------------- the sessions


@attrs.frozen(kw_only=True)
class Workload:
    sessions: int
    turns: int
    concurrency: int
    system: str
    answer_tokens: tuple[int, int]  # each answer's length, drawn per turn from this range
    think_s: float  # the tool's run between turns, drawn per turn from [0, this)
    stagger_s: float  # client k starts its first session k * this after the start
    send_session_header: bool
    output_lines: int  # lines of tool output in each user message after the first
    turn_attempts: int
    connect_timeout_s: float
    deadline_s: float


@attrs.define
class LoadResult:
    turns: list[Turn]
    wall_s: float
    timed_out: bool
    sessions_given_up: int


def turn_body(model: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    # Thinking off: the answer is content only, and that content is what the next turn sends
    # back as the assistant message, exactly as generated. ignore_eos: exactly max_tokens.
    return {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }


async def run_sessions(
    port: int,
    model: str,
    work: Workload,
    t0: float,
    progress: Progress,
    background: Sequence[Callable[[], Awaitable[None]]] = (),
    alongside: Sequence[Callable[[], Awaitable[None]]] = (),
) -> LoadResult:
    """Every session, ``concurrency`` at once. ``background`` tasks (samplers) run until the
    sessions and the ``alongside`` tasks (the kill and restart) have ended, then are
    cancelled; ``alongside`` tasks are awaited (``progress.finished`` tells them the sessions
    are over)."""
    turns: list[Turn] = []
    given_up = 0
    sessions = iter(range(work.sessions))

    async def session(index: int) -> None:
        nonlocal given_up
        # Answer lengths and tool times vary, the same in every run (seeded by the session):
        # alike turns would keep the sessions of a replica in lockstep, every one of them
        # finishing in the same step and prefilling its next turn in the same step, which
        # real traffic does not do.
        rng = random.Random(f"fleet-session-{index}")
        header = f"fleet-session-{index}" if work.send_session_header else None
        messages = [
            {"role": "system", "content": work.system},
            {"role": "user", "content": first_message(index)},
        ]
        for turn in range(work.turns):
            length = rng.randint(*work.answer_tokens)
            think_s = rng.uniform(0.0, work.think_s)
            answer: str | None = None
            for attempt in range(work.turn_attempts):
                result = Turn(session=index, turn=turn, attempt=attempt)
                turns.append(result)
                request = turn_request(port, turn_body(model, messages, length), header)
                text = await stream_turn(result, port, request, t0, work.connect_timeout_s)
                if result.error is None:
                    answer = text
                    break
            if answer is None:
                given_up += 1
                return  # the conversation cannot go on without this turn's answer
            progress.turn_done()
            if turn + 1 < work.turns:
                await trio.sleep(think_s)  # the tool the answer asked for runs
            messages.append({"role": "assistant", "content": answer})
            follow = next_message(index, turn + 1, work.output_lines)
            messages.append({"role": "user", "content": follow})

    async def client(k: int) -> None:
        # Sessions arrive over the first second instead of all in one instant.
        await trio.sleep(k * work.stagger_s)
        for index in sessions:  # shared iterator: each session goes to one client
            await session(index)

    started = time.monotonic()
    wall_s: float | None = None
    with trio.move_on_after(work.deadline_s) as deadline:
        async with trio.open_nursery() as outer:
            for task in background:
                outer.start_soon(task)
            async with trio.open_nursery() as companions:
                for task in alongside:
                    companions.start_soon(task)
                async with trio.open_nursery() as clients:
                    for k in range(work.concurrency):
                        clients.start_soon(client, k)
                wall_s = time.monotonic() - started
                progress.finished.set()
            outer.cancel_scope.cancel()
    return LoadResult(
        turns=turns,
        wall_s=wall_s if wall_s is not None else time.monotonic() - started,
        timed_out=deadline.cancelled_caught,
        sessions_given_up=given_up,
    )
