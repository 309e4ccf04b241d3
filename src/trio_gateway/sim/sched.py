"""The engine's scheduling rules, with no I/O and no clock of its own (time is passed in).

The model of a vLLM engine, reduced to what a gateway can observe:

- at most `max_num_seqs` sequences run; the rest wait in an unbounded queue (vLLM never says
  "full": the queue and the time to first token grow instead), in arrival order, or with
  `scheduling_policy = "priority"` by (priority, arrival), lower first (vLLM's
  `PriorityRequestQueue`); a running sequence is never preempted to let a waiting one in;
- the KV cache holds `num_gpu_blocks_override` 16-token blocks (by default room for every
  running sequence at full length): a sequence is admitted only when its prompt's blocks are
  free, and one that needs a block for its next token when none is free preempts, as vLLM
  does, the newest running sequence (fcfs) or the one of the largest (priority, arrival),
  possibly itself; a preempted sequence waits again and, readmitted, prefills its prompt and
  the tokens it had already generated (vLLM's recompute) before going on;
- admitting a sequence costs a prefill of its uncached prompt tokens; the prefix cache
  remembers 16-token blocks (LRU, bounded) and counts queries and hits in tokens;
- one decode step gives one token to every ready running sequence and takes
  `decode_step_s + decode_step_s_per_seq * batch`: a bigger batch is slower per step but has
  more throughput;
- a sequence may pause before a token (a script's `delay_s`): it keeps its slot meanwhile.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Container, Mapping

import attrs

from .config import SimConfig
from .text import BLOCK_TOKENS

__all__ = ["Counters", "Emitted", "Scheduler", "SeqSpec"]


@attrs.frozen(kw_only=True)
class SeqSpec:
    seq_id: int
    prompt_tokens: int
    block_hashes: tuple[int, ...]
    n_tokens: int  # tokens to generate; the sequence finishes after the last one
    delays: Mapping[int, float] = attrs.field(factory=dict)  # token index -> pause before it
    finish_reason: str = "stop"  # for the per-reason success counter only
    priority: int = 0  # vLLM's request priority, lower first (read under "priority" only)


@attrs.define(eq=False)  # identity: the queues remove this very sequence
class _Seq:
    spec: SeqSpec
    generated: int = 0
    resume_at: float = 0.0
    client_left: bool = False
    cached_tokens: int = 0  # prompt tokens the prefix cache had at admission

    def order(self) -> tuple[int, int]:
        """vLLM's Request ordering under the priority policy: (priority, arrival)."""
        return (self.spec.priority, self.spec.seq_id)

    def blocks(self, extra: int = 0) -> int:
        return math.ceil((self.spec.prompt_tokens + self.generated + extra) / BLOCK_TOKENS)


@attrs.frozen(kw_only=True)
class Emitted:
    seq_id: int
    index: int  # which token of the sequence this is
    done: bool  # it was the last one; the sequence has left the engine
    cached_tokens: int = 0  # the sequence's prompt tokens served by the prefix cache


@attrs.define
class Counters:
    """Monotonic counters since start or the last reset."""

    submitted: int = 0
    finished: int = 0
    aborts: int = 0
    prompt_tokens: int = 0
    tokens_generated: int = 0
    tokens_generated_after_client_left: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    max_running_seen: int = 0
    max_waiting_seen: int = 0
    preemptions: int = 0
    finished_by_reason: dict[str, int] = attrs.Factory(dict)


class Scheduler:
    def __init__(self, config: SimConfig) -> None:
        self._config = config
        self._waiting: collections.deque[_Seq] = collections.deque()
        self._running: dict[int, _Seq] = {}
        self._cache: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._kv_capacity_blocks = config.num_gpu_blocks_override or (
            config.max_num_seqs * math.ceil(config.max_model_len / BLOCK_TOKENS)
        )
        self._by_priority = config.scheduling_policy == "priority"
        self.counters = Counters()

    # ---- observation ----

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def waiting_for_capacity(self) -> int:
        """Sequences that would wait even at a step boundary: every slot is taken (vLLM's
        ``reason="capacity"``). One that arrives mid-step with a slot free waits only for the
        step to end, which a sampled gauge never shows; it is not counted."""
        free = self._config.max_num_seqs - len(self._running)
        return max(0, len(self._waiting) - free)

    def kv_cache_usage(self) -> float:
        """Fraction of the KV blocks the running sequences hold (0..1, as vLLM reports)."""
        return min(1.0, self._used_blocks() / self._kv_capacity_blocks)

    def _used_blocks(self) -> int:
        return sum(s.blocks() for s in self._running.values())

    def reset_counters(self) -> None:
        self.counters = Counters(
            max_running_seen=self.running, max_waiting_seen=self.waiting_for_capacity
        )

    # ---- changes ----

    def add(self, spec: SeqSpec) -> None:
        self._waiting.append(_Seq(spec=spec))
        self.counters.submitted += 1
        self.counters.max_waiting_seen = max(
            self.counters.max_waiting_seen, self.waiting_for_capacity
        )

    def mark_client_left(self, seq_id: int) -> bool:
        """Note that nobody reads this sequence any more; False if it already finished."""
        seq = self._find(seq_id)
        if seq is None:
            return False
        seq.client_left = True
        return True

    def abort(self, seq_id: int) -> bool:
        """Remove a sequence wherever it is; False if it had already finished."""
        if self._running.pop(seq_id, None) is None:
            for seq in self._waiting:
                if seq.spec.seq_id == seq_id:
                    self._waiting.remove(seq)
                    break
            else:
                return False
        self.counters.aborts += 1
        self._count_finish("abort")
        return True

    def _next_waiting(self) -> _Seq:
        if self._by_priority:
            return min(self._waiting, key=_Seq.order)
        return self._waiting[0]

    def _make_room(self) -> tuple[int, bool]:
        """vLLM's preemption: each running sequence (in admission order) that needs a new KV
        block for its next token when none is free frees one by preempting a victim. Returns
        the blocks left once the running ones have their next, and whether any was preempted."""
        free = self._kv_capacity_blocks - self._used_blocks()
        before = self.counters.preemptions
        for seq in list(self._running.values()):
            if seq.spec.seq_id not in self._running:
                continue  # preempted a moment ago, as a victim
            grow = seq.blocks(1) - seq.blocks()
            while grow > free:
                running = list(self._running.values())
                victim = max(running, key=_Seq.order) if self._by_priority else running[-1]
                del self._running[victim.spec.seq_id]
                free += victim.blocks()
                self._waiting.appendleft(victim)  # vLLM prepends; "priority" reorders anyway
                self.counters.preemptions += 1
                if victim is seq:
                    break
            else:
                free -= grow
        return free, self.counters.preemptions > before

    def admit(self, now: float) -> int:
        """Preempt where the KV cache is full, then move waiting sequences into free slots
        (in arrival order, or by priority) while their blocks fit. Returns the tokens to
        prefill: uncached prompt tokens, and a preempted sequence's generated ones again."""
        free, preempted = self._make_room()
        to_prefill = 0
        # As vLLM: no waiting sequence is scheduled in a step that had to preempt.
        while not preempted and self._waiting and len(self._running) < self._config.max_num_seqs:
            seq = self._next_waiting()
            if seq.blocks() > free:
                break  # vLLM stops admitting at the first that does not fit
            free -= seq.blocks()
            self._waiting.remove(seq)
            hits = self._lookup_prefix(seq.spec.block_hashes)
            if seq.generated:
                # Readmitted after a preemption: its KV is recomputed, output included.
                to_prefill += seq.spec.prompt_tokens - hits + seq.generated
            else:
                to_prefill += seq.spec.prompt_tokens - hits
                seq.cached_tokens = hits
                self.counters.prompt_tokens += seq.spec.prompt_tokens
                # vLLM counts queries in prompt tokens, hits in cached tokens.
                self.counters.prefix_cache_queries += seq.spec.prompt_tokens
            seq.resume_at = now + seq.spec.delays.get(seq.generated, 0.0)
            self._running[seq.spec.seq_id] = seq
        self.counters.max_running_seen = max(self.counters.max_running_seen, self.running)
        return to_prefill

    def ready(self, now: float, blocked: Container[int] = ()) -> list[int]:
        """Running sequences that take part in the next decode step."""
        return [
            seq_id
            for seq_id, seq in self._running.items()
            if seq.resume_at <= now and seq_id not in blocked
        ]

    def next_resume(self, now: float) -> float | None:
        """When the earliest paused sequence wants its next token, if any is paused."""
        times = [s.resume_at for s in self._running.values() if s.resume_at > now]
        return min(times) if times else None

    def step_seconds(self, prefill_tokens: int, batch: int) -> float:
        seconds = self._config.prefill_s_per_token * prefill_tokens
        if batch:
            seconds += self._config.decode_step_s + self._config.decode_step_s_per_seq * batch
        return seconds

    def advance(self, batch: list[int], now: float) -> list[Emitted]:
        """Give one token to each sequence of `batch` still running (some may have been
        aborted while the step ran)."""
        out: list[Emitted] = []
        for seq_id in batch:
            seq = self._running.get(seq_id)
            if seq is None:
                continue
            index = seq.generated
            seq.generated += 1
            self.counters.tokens_generated += 1
            if seq.client_left:
                self.counters.tokens_generated_after_client_left += 1
            done = seq.generated >= seq.spec.n_tokens
            if done:
                del self._running[seq_id]
                self.counters.finished += 1
                self._count_finish(seq.spec.finish_reason)
            else:
                seq.resume_at = now + seq.spec.delays.get(seq.generated, 0.0)
            out.append(
                Emitted(seq_id=seq_id, index=index, done=done, cached_tokens=seq.cached_tokens)
            )
        return out

    # ---- internals ----

    def _find(self, seq_id: int) -> _Seq | None:
        seq = self._running.get(seq_id)
        if seq is not None:
            return seq
        return next((s for s in self._waiting if s.spec.seq_id == seq_id), None)

    def _count_finish(self, reason: str) -> None:
        # vLLM's request_success_total knows stop/length/abort; tool calls end with a stop.
        key = "stop" if reason == "tool_calls" else reason
        by_reason = self.counters.finished_by_reason
        by_reason[key] = by_reason.get(key, 0) + 1

    def _lookup_prefix(self, block_hashes: tuple[int, ...]) -> int:
        """Prefix-cache hits in tokens for these blocks; then remember them (LRU)."""
        hits = 0
        for block in block_hashes:
            if block not in self._cache:
                break
            hits += 1
        for block in block_hashes:
            self._cache[block] = None
            self._cache.move_to_end(block)
        while len(self._cache) > self._config.prefix_cache_blocks:
            self._cache.popitem(last=False)
        self.counters.prefix_cache_hits += hits * BLOCK_TOKENS
        return hits * BLOCK_TOKENS
