"""The trio shell around the pure `Scheduler`: one loop task that runs decode steps, and one
bounded channel per sequence through which token indexes reach the HTTP handler.

A sequence whose channel is full (its client reads slower than the engine writes) sits out the
next steps: it keeps its slot but does not advance (``client_lead_tokens``). With no lead (0),
vLLM's way, a sequence decodes on whatever its client takes, and its channel holds at most its
own tokens' indexes.
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NoReturn

import attrs
import trio

from .config import SimConfig
from .sched import Scheduler, SeqSpec

__all__ = ["SimEngine", "SimSequence", "SimStats"]

# Request bodies (and headers) remembered for tests that check what the gateway sent.
RECORDED_REQUESTS = 16
# The fields holding them, in `GET /sim/stats` only when asked for (`?bodies=1`).
RECORDED_FIELDS = ("last_request_body", "last_request_bodies", "last_request_headers")
# Distinct fault scripts whose `times` budget is tracked; the oldest are forgotten.
TRACKED_FAULT_SCRIPTS = 1024


@attrs.frozen(kw_only=True)
class SimStats:
    """A snapshot of the simulator, since start or the last reset."""

    requests: int  # chat-completion requests received (past auth), whatever their outcome
    errors: int  # of those, answered with an error status (validation or scripted fault)
    running: int
    waiting: int
    max_running_seen: int
    max_waiting_seen: int
    finished: int  # sequences that generated all their tokens
    aborts: int  # sequences removed before the end (client gone, connection dropped)
    disconnects: int  # clients seen leaving before their answer was complete
    prompt_tokens: int
    tokens_generated: int
    tokens_generated_after_client_left: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    kv_cache_usage: float
    finished_by_reason: Mapping[str, int]
    last_request_body: Any
    last_request_bodies: tuple[Any, ...]  # oldest first, at most RECORDED_REQUESTS
    last_request_headers: tuple[Mapping[str, str], ...]
    token_grants: int = 0  # access tokens granted by the gemini dialect's `POST /token`
    preemptions: int = 0  # running sequences put back to wait for lack of KV blocks

    def to_json(self, *, bodies: bool = True) -> dict[str, Any]:
        """As JSON; without ``bodies``, the recorded requests (prompts and all) are counted,
        not copied: ``GET /sim/stats`` is polled, and printed, far more than it is inspected."""
        out = attrs.asdict(self)
        if not bodies:
            for field in RECORDED_FIELDS:
                del out[field]
            out["recorded_requests"] = len(self.last_request_bodies)
        return out


class SimSequence:
    """One generation, as its HTTP handler sees it."""

    def __init__(
        self, engine: SimEngine, seq_id: int, tokens: trio.MemoryReceiveChannel[int]
    ) -> None:
        self._engine = engine
        self.seq_id = seq_id
        self._tokens = tokens

    async def next_token(self) -> int | None:
        """The index of the next generated token, or None once the sequence has finished."""
        try:
            index = await self._tokens.receive()
        except trio.EndOfChannel:
            return None
        self._engine._poke()  # a full channel just got room: the engine may advance us again
        return index

    def mark_client_left(self) -> None:
        self._engine._mark_client_left(self.seq_id)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the prefix cache served; known once the first token arrived."""
        return self._engine._cached.get(self.seq_id, 0)


class SimEngine:
    def __init__(self, config: SimConfig) -> None:
        self._config = config
        self._sched = Scheduler(config)
        self._ids = itertools.count(1)
        self._senders: dict[int, trio.MemorySendChannel[int]] = {}
        # Prefix-cache hits of live sequences (entries leave with their sequence).
        self._cached: dict[int, int] = {}
        self._token_grants = 0
        self._wake = trio.Event()
        # Set (and replaced) whenever anything in `stats()` may have changed.
        self._changed = trio.Event()
        self._requests = 0
        self._errors = 0
        self._disconnects = 0
        self._bodies: collections.deque[Any] = collections.deque(maxlen=RECORDED_REQUESTS)
        self._headers: collections.deque[Mapping[str, str]] = collections.deque(
            maxlen=RECORDED_REQUESTS
        )
        self._fault_uses: collections.OrderedDict[str, int] = collections.OrderedDict()

    @property
    def config(self) -> SimConfig:
        return self._config

    # ---- what the HTTP layer reports ----

    def note_request(self, body: Any, headers: Mapping[str, str]) -> None:
        self._requests += 1
        self._bodies.append(body)
        self._headers.append(headers)
        self._notify()

    def note_error(self) -> None:
        self._errors += 1
        self._notify()

    def note_token_grant(self) -> None:
        self._token_grants += 1
        self._notify()

    def fault_applies(self, script_key: str | None, times: int | None) -> bool:
        """Whether a scripted fault fires for this request: always without `times`, else for
        the first `times` requests carrying the same script (so a retry can succeed)."""
        if times is None or script_key is None:
            return True
        used = self._fault_uses.pop(script_key, 0)
        self._fault_uses[script_key] = used + 1
        while len(self._fault_uses) > TRACKED_FAULT_SCRIPTS:
            self._fault_uses.popitem(last=False)
        return used < times

    def server_load(self) -> int:
        return self._sched.running + self._sched.waiting

    def reset(self) -> None:
        """Zero the counters (tests share one simulator); running work is not touched."""
        self._sched.reset_counters()
        self._requests = self._errors = self._disconnects = self._token_grants = 0
        self._bodies.clear()
        self._headers.clear()
        self._fault_uses.clear()
        self._notify()

    def stats(self) -> SimStats:
        c = self._sched.counters
        return SimStats(
            requests=self._requests,
            errors=self._errors,
            running=self._sched.running,
            waiting=self._sched.waiting,
            max_running_seen=c.max_running_seen,
            max_waiting_seen=c.max_waiting_seen,
            finished=c.finished,
            aborts=c.aborts,
            disconnects=self._disconnects,
            prompt_tokens=c.prompt_tokens,
            tokens_generated=c.tokens_generated,
            tokens_generated_after_client_left=c.tokens_generated_after_client_left,
            prefix_cache_queries=c.prefix_cache_queries,
            prefix_cache_hits=c.prefix_cache_hits,
            kv_cache_usage=self._sched.kv_cache_usage(),
            finished_by_reason=dict(c.finished_by_reason),
            last_request_body=self._bodies[-1] if self._bodies else None,
            last_request_bodies=tuple(self._bodies),
            last_request_headers=tuple(self._headers),
            token_grants=self._token_grants,
            preemptions=c.preemptions,
        )

    async def wait_until(self, predicate: Callable[[SimStats], bool]) -> SimStats:
        """Wait for the first stats snapshot satisfying `predicate` (tests: "until the abort
        was seen"), without polling. Put a deadline around it at the call site."""
        while True:
            stats = self.stats()
            if predicate(stats):
                return stats
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # ---- sequences ----

    @contextmanager
    def sequence(
        self,
        *,
        prompt_tokens: int,
        block_hashes: tuple[int, ...],
        n_tokens: int,
        delays: Mapping[int, float],
        finish_reason: str,
        priority: int = 0,
    ) -> Iterator[SimSequence]:
        """Queue a sequence; leaving the block removes it from the engine if still there (the
        abort vLLM does when a client goes away)."""
        seq_id = next(self._ids)
        # Unbounded without a lead: a sequence's tokens, at most its n_tokens.
        send, receive = trio.open_memory_channel[int](self._config.client_lead_tokens or math.inf)
        spec = SeqSpec(
            seq_id=seq_id,
            prompt_tokens=prompt_tokens,
            block_hashes=block_hashes,
            n_tokens=n_tokens,
            delays=delays,
            finish_reason=finish_reason,
            priority=priority,
        )
        self._senders[seq_id] = send
        self._sched.add(spec)
        self._poke()
        self._notify()
        try:
            with receive:
                yield SimSequence(self, seq_id, receive)
        finally:
            self._senders.pop(seq_id, None)
            self._cached.pop(seq_id, None)
            send.close()
            if self._sched.abort(seq_id):
                self._poke()  # a slot is free: let the next waiting sequence in
                self._notify()

    def _mark_client_left(self, seq_id: int) -> None:
        if self._sched.mark_client_left(seq_id):
            self._disconnects += 1
            self._notify()

    def _poke(self) -> None:
        self._wake.set()

    # ---- the loop ----

    def _blocked(self) -> set[int]:
        lead = self._config.client_lead_tokens
        if not lead:
            return set()
        return {
            seq_id
            for seq_id, send in self._senders.items()
            if send.statistics().current_buffer_used >= lead
        }

    async def run(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """The engine loop: admit, prefill, decode one step, hand out tokens, repeat."""
        task_status.started()
        while True:
            now = trio.current_time()
            prefill = self._sched.admit(now)
            if prefill:
                self._notify()
            batch = self._sched.ready(now, self._blocked())
            if not prefill and not batch:
                # Nothing to compute: sleep until work arrives, a channel drains or a paused
                # sequence wants its next token. No checkpoint since the checks above, so no
                # wake-up can be lost between them and this new event.
                self._wake = trio.Event()
                resume = self._sched.next_resume(now)
                with trio.move_on_at(resume if resume is not None else float("inf")):
                    await self._wake.wait()
                continue
            await trio.sleep(self._sched.step_seconds(prefill, len(batch)))
            for emitted in self._sched.advance(batch, trio.current_time()):
                send = self._senders.get(emitted.seq_id)
                if send is None:
                    continue
                if emitted.index == 0:
                    self._cached[emitted.seq_id] = emitted.cached_tokens
                # Cannot block: the room was checked before the step and only we send.
                send.send_nowait(emitted.index)
                if emitted.done:
                    send.close()
                    del self._senders[emitted.seq_id]
            self._notify()
