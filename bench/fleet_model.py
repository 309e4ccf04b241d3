"""Scenario F's model (``bench/fleet.py``): its configuration, the runs made of it (one
``RunSpec`` each: the policy, the replicas, their caches, the kill), their labels, the record
of a kill and restart, and the workload's sizes in tokens and prefix-cache blocks. No
process is started here.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from bench.fleet_load import first_message, next_message
from trio_gateway.sim.text import count_prompt

IDEAL_CACHE_BLOCKS = 10_000_000  # never evicts anything this workload asks for
POLICIES = ("round_robin", "least_loaded", "affinity")
DEFAULT_RUNS = ("ideal", *POLICIES, "affinity_opening", "affinity_kill")


@attrs.frozen(kw_only=True)
class Config:
    replicas: int
    sessions: int
    turns: int
    concurrency: int
    system_tokens: int  # the shared system prompt's size, in the simulator's tokens
    answer_tokens: tuple[int, int]  # each answer's length, drawn per turn (max_tokens)
    think_s: float  # a tool's run between two turns, drawn per turn from [0, this)
    output_lines: int  # tool output lines in each later user message (~21 tokens a line)
    prefix_cache_blocks: int  # per replica, 16 tokens each
    prefill_s_per_token: float
    decode_step_s: float
    decode_step_s_per_seq: float
    max_num_seqs: int  # per replica
    max_inflight: int  # per replica: the gateway's gate
    epsilon: float
    epsilons: tuple[float, ...]  # more affinity runs, one per value
    runs: tuple[str, ...]
    kill_at: float  # fraction of all turns done
    restart_at: float
    kill_replica: int
    probe_interval_s: float
    scrape_interval_s: float
    sample_interval_s: float
    state_interval_s: float
    turn_attempts: int
    deadline_s: float
    connect_timeout_s: float = 30.0
    max_model_len: int = 8192


@attrs.frozen(kw_only=True)
class RunSpec:
    name: str
    routing: str  # the gateway's policy; "ideal" runs round_robin over a single replica
    epsilon: float
    replicas: int
    cache_blocks: int
    max_num_seqs: int
    max_inflight: int
    session_header: bool
    kill: bool


def run_specs(cfg: Config) -> list[RunSpec]:
    base = RunSpec(
        name="",
        routing="",
        epsilon=cfg.epsilon,
        replicas=cfg.replicas,
        cache_blocks=cfg.prefix_cache_blocks,
        max_num_seqs=cfg.max_num_seqs,
        max_inflight=cfg.max_inflight,
        session_header=True,
        kill=False,
    )
    names = list(cfg.runs) + [f"affinity_eps{e:g}" for e in cfg.epsilons]
    specs = []
    for name in names:
        if name == "ideal":
            # One engine with room for every session at once and a cache that never evicts.
            slots = max(cfg.concurrency, cfg.max_num_seqs) + 8
            specs.append(
                attrs.evolve(
                    base,
                    name=name,
                    routing="round_robin",
                    replicas=1,
                    cache_blocks=IDEAL_CACHE_BLOCKS,
                    max_num_seqs=slots,
                    max_inflight=slots,
                )
            )
        elif name in POLICIES:
            specs.append(attrs.evolve(base, name=name, routing=name))
        elif name == "affinity_opening":
            specs.append(attrs.evolve(base, name=name, routing="affinity", session_header=False))
        elif name == "affinity_kill":
            specs.append(attrs.evolve(base, name=name, routing="affinity", kill=True))
        elif name.startswith("affinity_eps"):
            epsilon = float(name.removeprefix("affinity_eps"))
            specs.append(attrs.evolve(base, name=name, routing="affinity", epsilon=epsilon))
        else:
            raise ValueError(f"unknown run {name!r}")
    return specs


def label(spec: RunSpec) -> str:
    if spec.name == "ideal":
        return "ideal (1 replica, unbounded cache)"
    if spec.name == "affinity_opening":
        return "affinity, no header (opening key)"
    if spec.name == "affinity_kill":
        return "affinity, replica killed + restarted"
    if spec.name.startswith("affinity_eps"):
        return f"affinity ε={spec.epsilon:g}"
    if spec.routing == "affinity":
        return f"affinity (ε={spec.epsilon:g})"
    return spec.routing


@attrs.define
class Chaos:
    """What the kill and restart of one replica did, and when (seconds from the sessions'
    start): filled in by ``fleet_processes.chaos`` while the sessions run."""

    replica: int
    kill_t_s: float | None = None
    restart_t_s: float | None = None  # the new process spawned
    ready_t_s: float | None = None  # it answers /health
    counters_at_kill: tuple[float, float] | None = None  # its (queries, hits) just before
    out_of_rotation_t_s: float | None = None  # the gateway first shows it unhealthy
    back_in_rotation_t_s: float | None = None  # healthy again after the restart
    skipped: str | None = None


# ---------------------------------------------------------------- the workload's sizes


def workload_sizes(cfg: Config, system: str) -> dict[str, Any]:
    """Tokens and 16-token blocks of the workload (answers stood in for by as many words):
    what the prefix caches have to hold."""

    def tokens(messages: list[dict[str, str]]) -> int:
        return count_prompt(messages, None, thinking=False).tokens

    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": first_message(7)},
    ]
    system_only = tokens([{"role": "system", "content": system}])
    prompts = [tokens(messages)]
    for turn in range(1, cfg.turns):
        answer = " ".join(["word"] * (sum(cfg.answer_tokens) // 2))
        messages += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": next_message(7, turn, cfg.output_lines)},
        ]
        prompts.append(tokens(messages))
    shared_blocks = system_only // 16
    own_last = math.ceil((prompts[-1] - system_only) / 16) + 1
    return {
        "system_prompt_tokens": system_only,
        "prompt_tokens_by_turn": prompts,
        "shared_blocks": shared_blocks,
        "session_own_blocks_at_last_turn": own_last,
        "live_blocks_at_most": shared_blocks + cfg.concurrency * own_last,
        "live_blocks_per_replica_affinity": shared_blocks
        + math.ceil(cfg.concurrency / cfg.replicas) * own_last,
        "all_sessions_blocks": shared_blocks + cfg.sessions * own_last,
        "prefix_cache_blocks_per_replica": cfg.prefix_cache_blocks,
    }
