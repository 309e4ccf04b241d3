"""A simulated vLLM 0.32.0 server (OpenAI-compatible dialect) for tests, benchmarks, and as the
gateway's default upstream; with `dialect` it speaks OpenAI's, Anthropic's or Gemini's API
instead, over the same scripted model and engine. See docs/simulator.md.

Pure core: `text` (tokens, prompt counting), `request` (validation), `script` (the output plan),
`errors` and `wire` (vLLM's exact bodies), `openai_wire`, `anthropic_wire`, `gemini_wire` and
`oauth` (the other dialects), `sched` (scheduling rules). Thin shell: `engine` (the trio loop),
`shell` (shared answer I/O), `app`, `app_anthropic`, `app_gemini` (ASGI), `server`
(`serve_sim`), `cli` (`sim_main`).
"""

from .cli import sim_main
from .config import SimConfig
from .engine import SimEngine, SimStats
from .server import SimHandle, serve_sim

__all__ = ["SimConfig", "SimEngine", "SimHandle", "SimStats", "serve_sim", "sim_main"]
