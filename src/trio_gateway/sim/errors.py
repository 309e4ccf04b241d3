"""Error responses exactly as vLLM 0.32.0 writes them (see tests/sim/fixtures/misc_errors.txt).

Every refusal the simulator can give is built here, as a value: the ASGI shell only sends it.
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = [
    "ApiError",
    "auto_tool_choice_unsupported",
    "bad_request",
    "context_too_long",
    "max_tokens_too_large",
    "max_tokens_too_small",
    "method_not_allowed",
    "model_not_found",
    "payload_too_large",
    "retry_after_header",
    "route_not_found",
    "script_error",
    "simulated_fault",
    "unauthorized",
    "validation_error",
]


@attrs.frozen(kw_only=True)
class ApiError:
    status: int
    body: Any
    headers: tuple[tuple[str, str], ...] = ()


def _vllm_error(status: int, type_: str, message: str, param: str | None) -> ApiError:
    # Key order is vLLM's: message, type, param, code (an int, not a string like OpenAI's).
    body = {"error": {"message": message, "type": type_, "param": param, "code": status}}
    return ApiError(status=status, body=body)


def bad_request(message: str, param: str | None = None) -> ApiError:
    return _vllm_error(400, "BadRequestError", message, param)


def unauthorized() -> ApiError:
    # vLLM's auth middleware answers before any routing, with this bare body.
    return ApiError(status=401, body={"error": "Unauthorized"})


def model_not_found(requested: str, served: str) -> ApiError:
    message = f"The model `{requested}` does not exist. Valid aliases: {served}."
    return _vllm_error(404, "NotFoundError", message, "model")


def max_tokens_too_large(max_tokens: int, max_model_len: int) -> ApiError:
    message = (
        f"max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. "
        f"Please request fewer output tokens. (parameter=max_tokens, value={max_tokens})"
    )
    return bad_request(message, "max_tokens")


def max_tokens_too_small(max_tokens: int) -> ApiError:
    return bad_request(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")


def context_too_long(max_model_len: int, prompt_tokens: int) -> ApiError:
    # vLLM stops tokenizing one token past the limit, so it reports max_model_len + 1 however
    # long the prompt really is ("at least").
    seen = min(prompt_tokens, max_model_len + 1)
    message = (
        f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
        f"contains at least {seen} input tokens, which exceeds this limit even without any "
        f"output tokens. Please reduce the length of the input prompt. "
        f"(parameter=input_tokens, value={seen})"
    )
    return bad_request(message, "input_tokens")


def auto_tool_choice_unsupported() -> ApiError:
    return bad_request(
        '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
    )


def validation_error(kind: str, loc: tuple[str | int, ...], msg: str) -> ApiError:
    """A request-validation 400, written the way vLLM stringifies pydantic's error list."""
    return bad_request(f"[{{'type': {kind!r}, 'loc': {('body', *loc)!r}, 'msg': {msg!r}}}]")


def script_error(message: str) -> ApiError:
    # Not a vLLM error: a test wrote a bad <sim> script and should hear about it loudly.
    return bad_request(f"sim script: {message}", "sim")


def route_not_found() -> ApiError:
    return ApiError(status=404, body={"detail": "Not Found"})


def method_not_allowed() -> ApiError:
    return ApiError(status=405, body={"detail": "Method Not Allowed"})


def payload_too_large(limit_bytes: int) -> ApiError:
    return bad_request(f"request body larger than {limit_bytes} bytes")


def retry_after_header(retry_after: float | None) -> tuple[tuple[str, str], ...]:
    if retry_after is None:
        return ()
    text = str(int(retry_after)) if float(retry_after).is_integer() else str(retry_after)
    return (("retry-after", text),)


def simulated_fault(
    status: int, body: Any | None, retry_after: float | None, error: str | None = None
) -> ApiError:
    """The answer of a `{"status": ...}` script step."""
    if body is None:
        body = {
            "error": {
                "message": f"simulated HTTP {status}",
                "type": error or "SimulatedError",
                "param": None,
                "code": status,
            }
        }
    return ApiError(status=status, body=body, headers=retry_after_header(retry_after))
