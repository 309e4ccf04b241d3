"""OpenAI-compatible servers (vLLM, the simulator): the dialect, vLLM's load signals, and
replica groups."""
