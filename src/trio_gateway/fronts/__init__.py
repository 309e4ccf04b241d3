"""The fronts callers speak: OpenAI Chat Completions over HTTP, the gateway events over SSE and
WebSocket, the status page, and the app that routes a request to one of them."""
