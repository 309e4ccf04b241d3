"""The simulator's `--scheduling-policy`: vLLM 0.32's waiting order (priority, arrival) and its
preemption when the KV cache is full, and the `priority` field on the wire."""

from __future__ import annotations

from functools import partial

import attrs
import httpx
import trio
import trio.testing

from trio_gateway.sim import SimConfig, SimEngine, serve_sim
from trio_gateway.sim.engine import SimStats
from trio_gateway.sim.sched import Scheduler, SeqSpec

from .test_sim_request import PARIS, accepted, refused

FCFS = SimConfig(max_num_seqs=1, max_model_len=64)
PRIORITY = attrs.evolve(FCFS, scheduling_policy="priority")


def spec(seq_id: int, priority: int = 0, prompt_tokens: int = 10, n_tokens: int = 40) -> SeqSpec:
    return SeqSpec(
        seq_id=seq_id,
        prompt_tokens=prompt_tokens,
        block_hashes=(),
        n_tokens=n_tokens,
        priority=priority,
    )


def admitted_order(config: SimConfig, specs: list[SeqSpec]) -> list[int]:
    """The order one slot serves ``specs``, all waiting at once."""
    sched = Scheduler(config)
    for s in specs:
        sched.add(s)
    order: list[int] = []
    while sched.running or sched.waiting:
        sched.admit(0.0)
        [running] = sched.ready(0.0)
        order.append(running)
        assert sched.abort(running)
    return order


def _received_more_than(n: int, stats: SimStats) -> bool:
    return stats.requests > n


def test_priority_serves_lower_numbers_first_then_arrival_and_fcfs_ignores_it() -> None:
    specs = [spec(1, 2), spec(2, 0), spec(3, 2), spec(4, -1), spec(5, 0)]
    assert admitted_order(PRIORITY, specs) == [4, 2, 5, 1, 3]
    assert admitted_order(FCFS, specs) == [1, 2, 3, 4, 5]


def test_a_running_sequence_is_not_preempted_for_a_waiting_one_while_the_cache_has_room() -> None:
    sched = Scheduler(PRIORITY)
    sched.add(spec(1, priority=5))
    sched.admit(0.0)
    sched.add(spec(2, priority=0))
    sched.admit(0.0)
    assert (sched.ready(0.0), sched.waiting, sched.counters.preemptions) == ([1], 1, 0)


def kv_bound(policy: str) -> Scheduler:
    """Two running sequences of 15 prompt tokens, a cache of 3 blocks: the first new block
    (the 17th token of one of them) has no room."""
    config = SimConfig(
        max_num_seqs=2, max_model_len=64, num_gpu_blocks_override=3, scheduling_policy=policy
    )
    sched = Scheduler(config)
    sched.add(spec(1, priority=0, prompt_tokens=15))  # older, more urgent
    sched.add(spec(2, priority=1, prompt_tokens=15))
    sched.admit(0.0)
    assert sched.ready(0.0) == [1, 2]
    sched.advance([1, 2], 0.0)  # 16 tokens each: a full block; the next token needs another
    return sched


def test_a_full_kv_cache_preempts_the_newest_under_fcfs() -> None:
    sched = kv_bound("fcfs")
    assert sched.admit(0.0) == 0
    assert (sched.ready(0.0), sched.waiting, sched.counters.preemptions) == ([1], 1, 1)


def test_a_full_kv_cache_preempts_the_lowest_priority_which_recomputes_on_readmission() -> None:
    # Priority 1 is the victim even though it is not the newest when arrivals are swapped.
    config = SimConfig(
        max_num_seqs=2, max_model_len=64, num_gpu_blocks_override=3, scheduling_policy="priority"
    )
    sched = Scheduler(config)
    sched.add(spec(1, priority=1, prompt_tokens=15))
    sched.add(spec(2, priority=0, prompt_tokens=15))
    sched.admit(0.0)
    sched.advance([1, 2], 0.0)
    sched.admit(0.0)
    assert (sched.ready(0.0), sched.counters.preemptions) == ([2], 1)
    assert sched.abort(2)  # room again: the victim comes back, prompt and output recomputed
    assert sched.admit(0.0) == 15 + 1
    emitted = sched.advance(sched.ready(0.0), 0.0)
    assert [(e.seq_id, e.index) for e in emitted] == [(1, 1)]  # it goes on where it was


def test_the_priority_field_is_accepted_under_either_policy_as_vllm_does() -> None:
    # vLLM 0.32 takes `priority` without --scheduling-policy priority and ignores it (checked
    # against the real server: tests/vllm/test_vllm_raw.py).
    assert accepted({"messages": PARIS, "priority": 3}).priority == 3
    assert accepted({"messages": PARIS, "priority": -2}, PRIORITY).priority == -2
    assert accepted({"messages": PARIS}).priority == 0
    error = refused({"messages": PARIS, "priority": "high"})
    assert error.status == 400
    assert "int_type" in error.body["error"]["message"]


async def test_over_http_the_priority_class_is_served_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = attrs.evolve(PRIORITY, max_model_len=4096, decode_step_s=0.01)
    order: list[int] = []
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(serve_sim, config)
        engine: SimEngine = handle.engine
        async with httpx.AsyncClient(base_url=handle.base_url, timeout=60) as client:

            async def ask(priority: int) -> None:
                body = {"messages": PARIS, "max_tokens": 5, "priority": priority}
                response = await client.post("/v1/chat/completions", json=body)
                assert response.status_code == 200, response.text
                order.append(priority)

            async with trio.open_nursery() as requests:
                for n, priority in enumerate((0, 3, 2, 1)):  # the first runs, the rest wait
                    requests.start_soon(ask, priority)
                    await engine.wait_until(partial(_received_more_than, n))
        nursery.cancel_scope.cancel()
    assert order == [0, 1, 2, 3]
