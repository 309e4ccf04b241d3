"""The real vLLM of the vLLM tier, as a benchmark's upstream (bench/cancellation_vllm.py):
started pinned to its cores, its counters read, its tokenizer asked for a prompt size and for
the tokens that are one character each."""

from __future__ import annotations

import contextlib
import json
import os
import string
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs
import httpx
from tests.vllm.vllm_server import group_pids, running_vllm

from bench.cancellation_load import parse_metrics

SERVED_MODEL = "qwen3-32b"
FILLER = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "again")
HTTP_TIMEOUT_S = 30.0
IDLE_TIMEOUT_S = 300.0


@attrs.frozen(kw_only=True)
class Upstream:
    root_url: str
    api_key: str
    pgid: int | None  # None: a vLLM this benchmark did not start

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


@contextlib.contextmanager
def vllm(
    *,
    url: str | None,
    api_key: str | None,
    max_num_seqs: int,
    step_delay_ms: float,
    cpus: Sequence[int],
) -> Iterator[Upstream]:
    """The tier's vLLM (tests/vllm/vllm_server.py) on ``cpus``, or the one at ``url``."""
    if url:
        yield Upstream(root_url=url, api_key=api_key or "", pgid=None)
        return
    with running_vllm(max_num_seqs=max_num_seqs, step_delay_ms=step_delay_ms, cpus=cpus) as server:
        yield Upstream(root_url=server.root_url, api_key=server.api_key, pgid=server.pid)


def counters(up: Upstream) -> dict[str, float]:
    """vLLM's /metrics, summed over labels, plus ``started_unfinished``: requests that got
    their first token minus requests that finished. vLLM 0.32 counts a request its client
    left in neither ``request_success_total{finished_reason="abort"}`` (0 here, always) nor
    any other finished counter, so across an idle-to-idle run this is the aborts."""
    with httpx.Client(timeout=HTTP_TIMEOUT_S, trust_env=False) as client:
        values = parse_metrics(client.get(f"{up.root_url}/metrics").text)
    values["started_unfinished"] = values.get(
        "vllm:time_to_first_token_seconds_count", 0.0
    ) - values.get("vllm:request_success_total", 0.0)
    return values


def wait_idle(up: Upstream, timeout_s: float = IDLE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = counters(up)
        if now.get("vllm:num_requests_running") == now.get("vllm:num_requests_waiting") == 0:
            return
        time.sleep(0.2)  # vLLM's state: nothing to wait on but the clock
    raise RuntimeError(f"vLLM not idle after {timeout_s:g} s")


def single_char_tokens(up: Upstream) -> list[int]:
    """The ids of the served tokenizer's one-character ASCII tokens (letters and digits): with
    generation limited to them, the characters a client receives are the tokens it received."""
    with httpx.Client(timeout=HTTP_TIMEOUT_S, trust_env=False, headers=up.headers) as client:
        model_dir = Path(client.get(f"{up.root_url}/v1/models").json()["data"][0]["root"])
    vocab: dict[str, int] = json.loads((model_dir / "tokenizer.json").read_text())["model"]["vocab"]
    ids = [vocab[c] for c in string.ascii_letters + string.digits if c in vocab]
    if len(ids) < 10:
        raise RuntimeError(f"{model_dir}: too few one-character tokens ({len(ids)})")
    return ids


def message(tag: str, words: int) -> dict[str, str]:
    return {"role": "user", "content": " ".join([tag, *(FILLER[i % 10] for i in range(words))])}


def filler_words(up: Upstream, target: int, tag: str) -> tuple[int, int]:
    """The most filler words whose prompt (chat template included, ``tag`` first) vLLM's
    /tokenize counts at most ``target`` tokens, and that count: a bisection, as a word of the
    tiny tokenizer is one to a few tokens."""

    def count(words: int) -> int:
        body = {
            "model": SERVED_MODEL,
            "messages": [message(tag, words)],
            "chat_template_kwargs": {"enable_thinking": False},
        }
        with httpx.Client(timeout=HTTP_TIMEOUT_S, trust_env=False, headers=up.headers) as client:
            response = client.post(f"{up.root_url}/tokenize", json=body)
            response.raise_for_status()
            return int(response.json()["count"])

    low, high = 0, target  # count(low) <= target, or nothing is
    while low < high:
        middle = (low + high + 1) // 2
        if count(middle) <= target:
            low = middle
        else:
            high = middle - 1
    return low, count(low)


def group_cpu_s(pgid: int | None) -> float | None:
    """CPU seconds of vLLM's live processes so far (API server, engine core, worker)."""
    if pgid is None:
        return None
    total = 0
    for pid in group_pids(pgid):
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def affinities(pids: dict[str, int]) -> dict[str, list[int] | None]:
    """The cores each process's threads may run on (the union over its threads: a thread may
    set its own, as vLLM binds its OpenMP threads)."""
    out: dict[str, list[int] | None] = {}
    for name, pid in pids.items():
        cores: set[int] = set()
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    cores |= os.sched_getaffinity(int(task.name))
        out[name] = sorted(cores) if cores else None
    return out
