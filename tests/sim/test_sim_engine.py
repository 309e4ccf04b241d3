"""The scheduling rules (pure) and the trio engine loop on a virtual clock."""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing

from trio_gateway.sim import SimConfig, SimEngine
from trio_gateway.sim.engine import SimSequence
from trio_gateway.sim.sched import Emitted, Scheduler, SeqSpec

CONFIG = SimConfig(
    max_num_seqs=2,
    prefill_s_per_token=0.001,
    decode_step_s=0.01,
    decode_step_s_per_seq=0.005,
    prefix_cache_blocks=8,
)


def spec(seq_id: int, n_tokens: int = 3, blocks: tuple[int, ...] = (), **kw: object) -> SeqSpec:
    return SeqSpec(
        seq_id=seq_id,
        prompt_tokens=16 * len(blocks) + 10,
        block_hashes=blocks,
        n_tokens=n_tokens,
        **kw,  # type: ignore[arg-type]
    )


# ---- the pure scheduler ----


def test_admission_respects_max_num_seqs_in_fifo_order() -> None:
    sched = Scheduler(CONFIG)
    for i in (1, 2, 3, 4):
        sched.add(spec(i))
    sched.admit(0.0)
    assert (sched.running, sched.waiting) == (2, 2)
    assert sched.ready(0.0) == [1, 2]
    # 4 queued, but 2 of them only until the step ends: only 2 waited for a slot.
    assert (sched.counters.max_running_seen, sched.counters.max_waiting_seen) == (2, 2)
    assert sched.abort(1)
    sched.admit(0.0)
    assert sched.ready(0.0) == [2, 3]  # 3 came before 4


def test_a_step_gives_one_token_to_each_ready_sequence() -> None:
    sched = Scheduler(CONFIG)
    sched.add(spec(1, n_tokens=2))
    sched.add(spec(2, n_tokens=1))
    sched.admit(0.0)
    assert sched.advance([1, 2], 0.0) == [
        Emitted(seq_id=1, index=0, done=False),
        Emitted(seq_id=2, index=0, done=True),
    ]
    assert sched.advance([1, 2], 0.0) == [Emitted(seq_id=1, index=1, done=True)]
    assert (sched.running, sched.counters.finished, sched.counters.tokens_generated) == (0, 2, 3)


def test_step_time_grows_with_the_batch_and_prefill() -> None:
    sched = Scheduler(CONFIG)
    assert sched.step_seconds(0, 0) == 0.0
    assert sched.step_seconds(0, 1) == pytest.approx(0.015)
    assert sched.step_seconds(0, 2) == pytest.approx(0.020)
    assert sched.step_seconds(100, 2) == pytest.approx(0.120)


def test_prefix_cache_counts_tokens_and_forgets_the_oldest_blocks() -> None:
    sched = Scheduler(CONFIG)
    sched.add(spec(1, blocks=(1, 2, 3)))
    assert sched.admit(0.0) == 58  # nothing cached yet: the whole prompt is prefilled
    sched.add(spec(2, blocks=(1, 2, 9)))
    sched.abort(1)
    assert sched.admit(0.0) == 58 - 32
    assert (sched.counters.prefix_cache_queries, sched.counters.prefix_cache_hits) == (116, 32)
    sched.abort(2)
    sched.add(spec(3, blocks=tuple(range(100, 108))))  # 8 new blocks push out 1, 2, 3, 9
    sched.admit(0.0)
    sched.abort(3)
    sched.add(spec(4, blocks=(1, 2)))
    assert sched.admit(0.0) == 42


def test_abort_removes_waiting_and_running_sequences_once() -> None:
    sched = Scheduler(CONFIG)
    for i in (1, 2, 3):
        sched.add(spec(i))
    sched.admit(0.0)
    assert sched.abort(3) and sched.abort(1)
    assert not sched.abort(1)
    assert (sched.running, sched.waiting, sched.counters.aborts) == (1, 0, 2)
    assert sched.counters.finished_by_reason == {"abort": 2}


def test_paused_sequences_keep_their_slot_but_skip_steps() -> None:
    sched = Scheduler(CONFIG)
    sched.add(spec(1, n_tokens=3, delays={1: 0.5}))
    sched.add(spec(2, n_tokens=3))
    sched.admit(0.0)
    sched.advance([1, 2], 1.0)
    assert sched.ready(1.2) == [2]
    assert sched.next_resume(1.2) == 1.5
    assert sched.ready(1.5) == [1, 2]
    assert sched.ready(1.5, blocked={2}) == [1]


def test_client_left_tokens_are_counted() -> None:
    sched = Scheduler(CONFIG)
    sched.add(spec(1, n_tokens=5))
    sched.admit(0.0)
    sched.advance([1], 0.0)
    assert sched.mark_client_left(1)
    sched.advance([1], 0.0)
    sched.advance([1], 0.0)
    assert sched.counters.tokens_generated_after_client_left == 2
    assert not sched.mark_client_left(99)


def test_kv_cache_usage_is_a_fraction() -> None:
    sched = Scheduler(SimConfig(max_num_seqs=2, max_model_len=64))  # 8 blocks in all
    sched.add(spec(1, blocks=(1,)))  # 26 prompt tokens: 2 blocks
    sched.admit(0.0)
    assert sched.kv_cache_usage() == 0.25


# ---- the trio loop, on trio's virtual clock ----


async def drain(seq: SimSequence) -> list[tuple[int, float]]:
    got = []
    while (index := await seq.next_token()) is not None:
        got.append((index, trio.current_time()))
    return got


async def test_tokens_arrive_at_the_modelled_times(autojump_clock: trio.testing.MockClock) -> None:
    engine = SimEngine(CONFIG)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        start = trio.current_time()
        with engine.sequence(
            prompt_tokens=10, block_hashes=(), n_tokens=3, delays={2: 1.0}, finish_reason="stop"
        ) as seq:
            got = await drain(seq)
        nursery.cancel_scope.cancel()
    times = [round(t - start, 6) for _, t in got]
    # prefill 10 x 1 ms + one 15 ms step; then a step; then a 1 s pause and a step.
    assert times == [0.025, 0.040, 1.055]
    assert engine.stats().finished == 1


async def test_max_num_seqs_holds_and_the_queue_waits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SimEngine(CONFIG)
    finish_times: list[float] = []

    async def one() -> None:
        with engine.sequence(
            prompt_tokens=10, block_hashes=(), n_tokens=10, delays={}, finish_reason="length"
        ) as seq:
            await drain(seq)
        finish_times.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        async with trio.open_nursery() as clients:
            for _ in range(6):
                clients.start_soon(one)
            with trio.fail_after(1):
                await engine.wait_until(lambda s: s.running == 2 and s.waiting == 4)
        nursery.cancel_scope.cancel()
    stats = engine.stats()
    # 6 arrive at once; 4 wait for a slot.
    assert (stats.max_running_seen, stats.max_waiting_seen, stats.finished) == (2, 4, 6)
    assert stats.finished_by_reason == {"length": 6}
    assert stats.tokens_generated == 60
    # Three waves of two: each wave ends about a third of the way apart.
    waves = sorted(finish_times)
    assert waves[1] - waves[0] < 0.001 < waves[2] - waves[1]


async def test_leaving_the_block_aborts_and_frees_the_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SimEngine(CONFIG)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        with engine.sequence(
            prompt_tokens=10, block_hashes=(), n_tokens=1000, delays={}, finish_reason="stop"
        ) as seq:
            for _ in range(5):
                await seq.next_token()
            seq.mark_client_left()
        stats = engine.stats()
        assert (stats.running, stats.aborts, stats.disconnects) == (0, 1, 1)
        assert stats.finished_by_reason == {"abort": 1}
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("lead", "when_read", "later"),
    [
        # The unread sequence fills its channel, then sits out the steps, however long.
        (64, 200 + 64, 200 + 64),
        # vLLM's way: it decodes in step with the other, and on to its end, read or not.
        (0, 400, 700),
    ],
)
async def test_a_slow_reader_holds_back_only_its_own_sequence_and_only_with_a_lead(
    autojump_clock: trio.testing.MockClock, lead: int, when_read: int, later: int
) -> None:
    engine = SimEngine(attrs.evolve(CONFIG, client_lead_tokens=lead))
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        with (
            engine.sequence(
                prompt_tokens=10, block_hashes=(), n_tokens=500, delays={}, finish_reason="stop"
            ) as unread,
            engine.sequence(
                prompt_tokens=10, block_hashes=(), n_tokens=200, delays={}, finish_reason="stop"
            ) as reader,
        ):
            assert len(await drain(reader)) == 200
            assert engine.stats().tokens_generated == when_read
            await trio.sleep(10)  # 300 steps' worth of the model's time, twice over
            assert engine.stats().tokens_generated == later
            assert [index for index, _ in await drain(unread)] == list(range(500))
        nursery.cancel_scope.cancel()


async def test_reset_zeroes_counters_but_not_work(autojump_clock: trio.testing.MockClock) -> None:
    engine = SimEngine(CONFIG)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        engine.note_request({"a": 1}, {"x": "y"})
        with engine.sequence(
            prompt_tokens=10, block_hashes=(), n_tokens=100, delays={}, finish_reason="stop"
        ) as seq:
            await seq.next_token()
            engine.reset()
            stats = engine.stats()
            assert (stats.requests, stats.tokens_generated, stats.running) == (0, 0, 1)
            assert stats.max_running_seen == 1 and stats.last_request_body is None
        nursery.cancel_scope.cancel()


def test_fault_budget_per_script() -> None:
    engine = SimEngine(CONFIG)
    assert [engine.fault_applies("s", 2) for _ in range(3)] == [True, True, False]
    assert engine.fault_applies("t", 1)
    assert engine.fault_applies("s", None)
