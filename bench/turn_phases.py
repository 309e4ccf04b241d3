"""Where a scenario H turn's instructions go before the relay, phase by phase, over HTTP and over
the Responses WebSocket mode: counted by valgrind, in-process (no server, no upstream).

``bench/turn_instructions.py`` counts a whole turn; this splits what ``prepare_turn`` does
(``fronts/responses/turn.py``) into the phases it chains, each run on every turn of a scenario H
rollout (21 turns, a 2 KB tool output each): reading the body (HTTP: the whole history's JSON;
WebSocket: only the new input, its conversation walked back from the socket's memory, each
record's text decoded), translating it to a chat body (``parse_responses_body``), validating it
as a chat request, screening it with the alias's input filters, and (both modes alike) encoding
the chat body for the upstream. One process per stage, each stage the phases up to it, under
``valgrind --tool=cachegrind --cache-sim=no``; a stage's total less the one before it, over the
turns, is what its phase costs a turn (the setup, the same in every process, cancels).

    .venv/bin/python -m bench.turn_phases [--repeat 3]
    .venv/bin/python -m bench.turn_phases --prefixes   # the socket's prefixes on (the default)
    .venv/bin/python -m bench.turn_phases --stage ws:screen --repeat 1   # one stage, no valgrind
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from bench import ws_rollout
from bench.harness import ALIAS, LABELS, gateway_toml
from bench.processes import PYTHON
from bench.turn_instructions import GATEWAY

STAGES = ("read", "translate", "validate", "screen", "upstream")
MODES = (ws_rollout.HTTP, ws_rollout.WS)


def output_of(response_id: str, step: int, last: bool) -> list[dict[str, Any]]:
    """What the gateway answered a scenario H turn (the simulator's reasoning and call)."""
    hexid = response_id.removeprefix("resp_")
    if last:
        text = f"Done: read {step} files."
        part = {"type": "output_text", "text": text, "annotations": []}
        return [
            {
                "id": f"msg_{hexid}_0",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [part],
            }
        ]
    return [
        {
            "id": f"rs_{hexid}_0",
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": f"step {step}: read the next file"}],
            "status": "completed",
        },
        {
            "id": f"fc_{hexid}_1",
            "type": "function_call",
            "status": "completed",
            "call_id": f"chatcmpl-tool-{step:016x}",
            "name": "read_file",
            "arguments": json.dumps({"path": f"src/module_{step}.py"}),
        },
    ]


class Conversation:
    """One rollout's turns as both clients send them, and the socket's memory holding the
    WebSocket's records (written by ``prepare_turn`` and ``Turn.record``, as the socket does)."""

    def __init__(self, cfg: ws_rollout.Config, *, prefixes: bool = False) -> None:
        from trio_gateway.accounting.response_memory import MemoryResponseStore
        from trio_gateway.config.load import parse_config
        from trio_gateway.dispatch.router import Router
        from trio_gateway.fronts.responses.service import service_of

        config = parse_config(gateway_toml(GATEWAY, 1, 2))
        self.router = Router(config.aliases, {}, filters=config.filters)
        self.service = service_of(self.router)
        self.memory = MemoryResponseStore(ttl_s=3600, max_bytes=1 << 30, key_quota_bytes=1 << 30)
        # The socket's translated conversations (``fronts/responses/prefixes.py``), when asked.
        self.prefixes: Any = None
        if prefixes:
            from trio_gateway.fronts.responses.prefixes import Prefixes

            self.prefixes = Prefixes(self.memory, max_bytes=1 << 30)
        self.cfg = cfg
        self.http_raw: list[bytes] = []  # each turn's POST body
        self.ws_bodies: list[dict[str, Any]] = []  # each turn's create, as a POST body

    async def build(self) -> None:
        from trio_gateway.fronts.responses.turn import prepare_turn

        cfg, rng = self.cfg, random.Random(0)
        items = ws_rollout.first_input(cfg, 0)
        new_items = items
        previous: str | None = None
        for step in range(cfg.tool_calls + 1):
            last = step == cfg.tool_calls
            self.http_raw.append(
                json.dumps(ws_rollout.body(cfg, ALIAS, items, step, stream=True)).encode()
            )
            fields: dict[str, Any] = {"stream": True}
            if previous is not None:
                fields["previous_response_id"] = previous
            ws_body = ws_rollout.body(cfg, ALIAS, new_items, step, **fields)
            self.ws_bodies.append(ws_body)
            extra = {"prefixes": self.prefixes} if self.prefixes is not None else {}
            turn = await prepare_turn(
                self.router,
                self.service,
                ws_body,
                None,
                front="responses_ws",
                size=len(json.dumps(ws_body)),
                depth_known=True,
                local=(self.memory,),
                **extra,
            )
            output = output_of(turn.response_id, step, last)
            response: dict[str, Any] = {"id": turn.response_id, "object": "response"}
            response |= {"status": "completed", **turn.parsed.echo, "output": output}
            record = turn.record(response)
            await self.memory.put("", record)
            if self.prefixes is not None:
                from trio_gateway.accounting.response_records import load_record

                self.prefixes.keep(
                    "",
                    turn.response_id,
                    turn.parsed.history,
                    load_record(record.id, record.text).items(),
                    opener=self.service.sealer.open,
                    turns=turn.history_turns + 1,
                    size=turn.history_bytes + record.size,
                )
            previous = turn.response_id
            if last:
                break
            new_items = [ws_rollout.next_output(cfg, rng, output, step)]
            items = [*items, *output, *new_items]


async def run_stage(conversation: Conversation, mode: str, stage: str, repeat: int) -> int:
    """Every turn through the phases up to ``stage`` (``""``: none), ``repeat`` times; the
    turns run."""
    from trio_gateway.core.request import read_chat_json
    from trio_gateway.core.validation import within_depth
    from trio_gateway.fronts.chat import for_key
    from trio_gateway.fronts.responses.request import RESPONSES_PARTS, parse_responses_body
    from trio_gateway.fronts.responses.turn import _validated
    from trio_gateway.providers.openai_compatible.dialect import _ENCODER, build_body

    depth = STAGES.index(stage) + 1 if stage else 0
    router, service = conversation.router, conversation.service
    provider = router.aliases[ALIAS].providers[0]
    turns = 0
    for _ in range(repeat):
        for i, raw in enumerate(conversation.http_raw):
            if depth == 0:
                turns += 1
                continue
            history: list[dict[str, Any]] = []
            prefix = None
            if mode == ws_rollout.HTTP:
                body = read_chat_json(raw, RESPONSES_PARTS)
                within_depth(raw)
            else:
                body = conversation.ws_bodies[i]
                previous = body.get("previous_response_id")
                found = None
                if isinstance(previous, str) and conversation.prefixes is not None:
                    found = conversation.prefixes.get("", previous, service.bounds)
                if found is not None:
                    prefix = found[0]
                elif isinstance(previous, str):
                    records, _ = await service.conversation("", previous, (conversation.memory,))
                    for record in records:
                        history += record.items()
            if depth >= 2:
                extra = {"prefix": prefix, "snapshot": True} if prefix is not None else {}
                parsed = parse_responses_body(
                    body, history=history, opener=service.sealer.open, **extra
                )
            if depth >= 3:
                request = for_key(router, _validated(parsed, True), None)
            if depth >= 4:
                router.screen(request)
            if depth >= 5:
                _ENCODER.encode(build_body(request, provider)).encode()
            turns += 1
    return turns


async def stage_main(
    mode: str, stage: str, cfg: ws_rollout.Config, repeat: int, prefixes: bool
) -> None:
    conversation = Conversation(cfg, prefixes=prefixes)  # a router wants a running loop
    await conversation.build()
    started = time.process_time()
    turns = await run_stage(conversation, mode, stage, repeat)
    cpu_ms = (time.process_time() - started) * 1000 / max(turns, 1)
    print(json.dumps({"mode": mode, "stage": stage, "turns": turns, "cpu_ms_per_turn": cpu_ms}))


def counted(argv: list[str], work: Path, name: str) -> int:
    out = work / f"{name}.out"
    valgrind = ["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}"]
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dicts' layouts in every process
    subprocess.run([*valgrind, *argv], check=True, capture_output=True, env=env)
    match = re.search(r"^summary:\s+(\d+)", out.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no summary line in {out}")
    return int(match.group(1))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tool-calls", type=int, default=20)
    parser.add_argument("--grow-bytes", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=3, help="passes over the rollout's turns")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument(
        "--prefixes", action="store_true", help="the WebSocket's turns go on from its prefixes"
    )
    parser.add_argument("--stage", help="MODE:STAGE (or MODE: for none): run it here, uncounted")
    args = parser.parse_args(argv)
    cfg = ws_rollout.Config(
        rollouts=1,
        concurrency=1,
        tool_calls=args.tool_calls,
        grow_bytes=args.grow_bytes,
        decode_tokens_per_s=1.0,
    )
    if args.stage is not None:
        mode, _, stage = args.stage.partition(":")
        trio.run(stage_main, mode, stage, cfg, args.repeat, args.prefixes)
        return 0
    me = [PYTHON, "-m", "bench.turn_phases", "--tool-calls", str(args.tool_calls)]
    me += ["--grow-bytes", str(args.grow_bytes), "--repeat", str(args.repeat)]
    me += ["--prefixes"] if args.prefixes else []
    turns = (args.tool_calls + 1) * args.repeat
    result: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory(prefix="turn-phases-") as tmp:
        work = Path(tmp)
        base = counted([*me, "--stage", "http:"], work, "base")
        for mode in args.modes:
            before = base
            result[mode] = {}
            for stage in STAGES:
                total = counted([*me, "--stage", f"{mode}:{stage}"], work, f"{mode}-{stage}")
                result[mode][stage] = round((total - before) / turns)
                before = total
                print(mode, stage, result[mode][stage], file=sys.stderr)
    print(json.dumps(result))
    print("| phase | " + " | ".join(LABELS[m] for m in args.modes) + " |")
    for stage in STAGES:
        cells = " | ".join(f"{result[m][stage] / 1e6:.2f}M" for m in args.modes)
        print(f"| {stage} | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
