"""The Responses WebSocket's own rules, on a clock the tests move: lanes (FIFO within one,
side by side across, bounded), the socket's memory (continuation with ``store: false``,
``generate: false``, forks, a miss), refusals that leave the socket open, and its limits (age,
idle, message size, the drain). Over real sockets and the SDK: tests/e2e."""

from __future__ import annotations

import trio
import trio.testing

from tests.unit.socket_client import served

TICK = 0.001


async def test_a_lane_answers_in_order_while_another_answers_beside_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served() as s:
        s.client.create("slow 3", stream_id="a")
        s.client.create("second", stream_id="a")
        s.client.create("fast", stream_id="b")
        events = await s.client.until("response.completed", "a")
        kinds = [(e["type"], e.get("stream_id")) for e in events]
        # b answered while a's first answer ran, and a's second waited for it.
        assert kinds.index(("response.completed", "b")) < len(kinds) - 1
        assert kinds.count(("response.created", "a")) == 1
        events = await s.client.until("response.completed", "a")
        assert events[0]["type"] == "response.created" and events[0]["stream_id"] == "a"
        assert events[-1]["response"]["output"][0]["content"][0]["text"] == "ok"
        sequences = [e["sequence_number"] for e in events]
        assert sequences == list(range(len(events)))
        assert [b["messages"][-1]["content"] for b in s.upstream.bodies] == [
            "slow 3",
            "fast",
            "second",
        ]


async def test_no_stream_id_is_one_lane_and_events_carry_none(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served() as s:
        s.client.create("slow 2")
        s.client.create("after")
        first = await s.client.until("response.completed")
        second = await s.client.until("response.completed")
        assert all("stream_id" not in e for e in first + second)
        assert first[-1]["response"]["id"] != second[-1]["response"]["id"]
        assert s.upstream.bodies[1]["messages"][-1]["content"] == "after"


async def test_a_lane_past_max_lanes_is_refused_and_the_socket_goes_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served(max_lanes=1) as s:
        s.client.create("slow 2", stream_id="a")
        s.client.create("other", stream_id="b")
        refused = await s.client.until("error")
        error = refused[-1]
        assert error["status"] == 429 and error["stream_id"] == "b"
        assert error["error"]["code"] == "too_many_requests"
        assert "max_lanes" in error["error"]["message"]
        await s.client.until("response.completed", "a")
        s.client.create("again", stream_id="b")
        done = await s.client.until("response.completed", "b")
        assert done[-1]["response"]["status"] == "completed"
        refusals = [r for r in s.records.records if r.outcome == "refused"]
        assert [(r.endpoint, r.error_code) for r in refusals] == [
            ("responses_ws", "too_many_requests")
        ]


async def test_waiting_creates_are_bounded_in_bytes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served(max_queued_bytes=4096, max_message_bytes=4096) as s:
        s.client.create("slow 2")
        for i in range(5):  # each counted at least 1 KiB: the fifth does not fit
            s.client.create(f"w{i}")
        refused = await s.client.until("error")
        assert refused[-1]["error"]["code"] == "too_many_requests"
        assert "max_queued_bytes" in refused[-1]["error"]["message"]
        for _ in range(5):
            await s.client.until("response.completed")
        assert [b["messages"][-1]["content"] for b in s.upstream.bodies] == [
            "slow 2",
            "w0",
            "w1",
            "w2",
            "w3",
        ]


async def test_bad_messages_are_answered_in_band_and_the_socket_stays_open(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served() as s:
        s.client.say("{not json")
        s.client.say({"type": "response.cancel", "response_id": "x"})
        s.client.say({"type": "response.create", "stream_id": 7})
        s.client.create("hi", stream_id="a", background=True)
        s.client.create("hi", stream_id="a", generate="yes")
        s.client.say({"type": "response.create", "stream_id": "a", "model": "nope", "input": "x"})
        errors = [await s.client.event() for _ in range(6)]
        assert [e["error"]["code"] for e in errors] == [
            "invalid_message",
            "unknown_type",
            "invalid_message",
            "unsupported_parameter",
            "invalid_request",
            "model_not_found",
        ]
        assert [e.get("stream_id") for e in errors] == [None, None, None, "a", "a", "a"]
        assert errors[3]["error"]["param"] == "background"
        s.client.create("still here")
        done = await s.client.until("response.completed")
        assert done[-1]["response"]["output"][0]["content"][0]["text"] == "ok"


async def test_a_message_past_the_limit_closes_the_socket_with_1009(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served(max_message_bytes=2000, max_queued_bytes=2000) as s:
        s.client.create("x" * 1900)
        await s.client.until("response.completed")
        s.client.create("x" * 2000)
        close = await s.client.closing()
        assert close["code"] == 1009
        assert "over the limit of 2000" in close["reason"]


async def test_a_continuation_with_store_false_reads_the_socket_memory(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served() as s:
        s.client.create("first", store=False, instructions="be brief")
        first = (await s.client.until("response.completed"))[-1]["response"]
        assert first["store"] is False
        s.client.create("second", store=False, previous_response_id=first["id"])
        second = (await s.client.until("response.completed"))[-1]["response"]
        assert second["previous_response_id"] == first["id"]
        # The upstream got the whole conversation; the service's store holds none of it.
        assert s.upstream.bodies[-1]["messages"] == [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "second"},
        ]
        from trio_gateway.fronts.responses.service import service_of

        assert await service_of(s.router).store.get("", first["id"]) is None


async def test_generate_false_remembers_without_an_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served() as s:
        warm = [
            {"type": "message", "role": "developer", "content": "You are Codex."},
        ]
        s.client.say(
            {
                "type": "response.create",
                "model": "a",
                "input": warm,
                "generate": False,
                "stream": True,
                "store": False,
            }
        )
        events = await s.client.until("response.completed")
        assert [e["type"] for e in events] == [
            "response.created",
            "response.in_progress",
            "response.completed",
        ]
        warmed = events[-1]["response"]
        assert warmed["output"] == [] and warmed["status"] == "completed"
        assert s.upstream.bodies == []
        s.client.create("go", store=False, previous_response_id=warmed["id"], stream=True)
        await s.client.until("response.completed")
        assert s.upstream.bodies[0]["messages"] == [
            {"role": "system", "content": "You are Codex."},
            {"role": "user", "content": "go"},
        ]
        outcomes = s.router.metrics.registry.get_sample_value(
            "gateway_responses_socket_creates_total", {"outcome": "remembered"}
        )
        assert outcomes == 1.0


async def test_a_fork_starts_a_lane_from_another_lanes_response(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served() as s:
        s.client.create("root", store=False, stream_id="main")
        root = (await s.client.until("response.completed", "main"))[-1]["response"]
        s.client.create("left", store=False, stream_id="main", previous_response_id=root["id"])
        s.client.create("right", store=False, stream_id="fork", previous_response_id=root["id"])
        await s.client.until("response.completed", "main")
        await s.client.until("response.completed", "fork")
        by_last = {b["messages"][-1]["content"]: b["messages"] for b in s.upstream.bodies}
        assert (
            by_last["right"][:2]
            == by_last["left"][:2]
            == [
                {"role": "user", "content": "root"},
                {"role": "assistant", "content": "ok"},
            ]
        )


async def test_a_missing_previous_response_is_an_error_on_its_lane(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served() as s:
        s.client.create("x", stream_id="a", previous_response_id="resp_" + "0" * 32)
        error = (await s.client.until("error"))[-1]
        assert error["status"] == 400 and error["stream_id"] == "a"
        assert error["error"]["code"] == "previous_response_not_found"
        assert error["error"]["param"] == "previous_response_id"
        s.client.create("y", stream_id="a")
        await s.client.until("response.completed", "a")


async def test_the_memory_keeps_the_newest_responses_within_its_bytes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served(memory_bytes=4000, max_message_bytes=4000, max_queued_bytes=4000) as s:
        ids = []
        for i in range(8):
            s.client.create(f"turn {i} " + "x" * 800, store=False)
            ids.append((await s.client.until("response.completed"))[-1]["response"]["id"])
        s.client.create("old", store=False, previous_response_id=ids[0])
        assert (await s.client.until("error"))[-1]["error"]["code"] == (
            "previous_response_not_found"
        )
        s.client.create("new", store=False, previous_response_id=ids[-1])
        await s.client.until("response.completed")


async def test_a_steer_fails_returning_its_input_on_the_responses_lane(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served() as s:
        s.client.create("slow 3", stream_id="a")
        created = await s.client.until("response.created", "a")
        response_id = created[-1]["response"]["id"]
        s.client.say(
            {"type": "response.steer", "previous_response_id": response_id, "input": "faster"}
        )
        events = await s.client.until("response.steer.failed")
        failed = events[-1]
        assert failed["stream_id"] == "a"
        assert failed["steer"] == {"previous_response_id": response_id, "input": "faster"}
        assert failed["error"]["code"] == "steering_not_supported"
        done = await s.client.until("response.completed", "a")
        numbers = [e["sequence_number"] for e in created + events + done]
        assert sorted(numbers) == list(range(len(numbers)))


async def test_an_idle_socket_is_closed(autojump_clock: trio.testing.MockClock) -> None:
    async with served(idle_timeout_s=30) as s:
        s.client.create("slow 40")  # answering is not idle
        await s.client.until("response.completed")
        started = trio.current_time()
        close = await s.client.closing()
        assert close["code"] == 1000 and "idle" in close["reason"]
        assert 29 <= trio.current_time() - started <= 31


async def test_past_its_age_a_socket_finishes_its_answer_then_closes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served(max_age_s=10) as s:
        await trio.sleep(8)
        s.client.create("slow 5", stream_id="a")
        await s.client.until("response.created", "a")
        await trio.sleep(3)  # past the age, still answering
        s.client.create("late", stream_id="b")
        refused = (await s.client.until("error"))[-1]
        assert refused["stream_id"] == "b"
        assert refused["error"]["code"] == "websocket_connection_limit_reached"
        await s.client.until("response.completed", "a")
        last = (await s.client.until("error"))[-1]
        assert last["error"]["code"] == "websocket_connection_limit_reached"
        assert "stream_id" not in last
        close = await s.client.closing()
        assert close["code"] == 1000
        assert s.upstream.cut == 0


async def test_an_idle_socket_past_its_age_says_so_and_closes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served(max_age_s=60, idle_timeout_s=600) as s:
        error = await s.client.event()
        assert error["error"]["code"] == "websocket_connection_limit_reached"
        assert trio.current_time() >= 60
        assert (await s.client.closing())["code"] == 1000


async def test_a_client_that_leaves_cuts_every_lanes_upstream(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served() as s:
        s.client.create("slow 50", stream_id="a")
        s.client.create("slow 50", stream_id="b")
        s.client.create("queued", stream_id="b")
        await s.client.until("response.output_text.delta", "a")
        await s.client.until("response.output_text.delta", "b")
        s.client.leave()
        with trio.fail_after(TICK):  # at once: no tick of the clock passes
            await s.upstream.wait_cut(2)
            await s.records.wait(2)
        assert len(s.upstream.bodies) == 2  # the queued create never started
        cancelled = [r for r in s.records.records if r.outcome == "cancelled"]
        assert [r.error_code for r in cancelled] == ["client_gone", "client_gone"]
        assert {r.endpoint for r in cancelled} == {"responses_ws"}


async def test_a_draining_gateway_refuses_new_creates_then_closes_with_1001(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with served() as s:
        s.client.create("slow 5", stream_id="a")
        await s.client.until("response.created", "a")
        s.router.drain.begin()
        s.client.create("late", stream_id="b")
        refused = (await s.client.until("error"))[-1]
        assert refused["error"]["code"] == "shutting_down" and refused["stream_id"] == "b"
        await s.client.until("response.completed", "a")
        assert (await s.client.closing())["code"] == 1001
