"""The shared vocabulary: errors, events, the request and its validation, SSE, tool calls, usage
arithmetic, API keys. Pure code, no I/O beyond reading a named file; every layer may import it."""
