"""Pure parts of the `gemini` dialect: Google's generateContent API, as AI Studio
(`/v1beta/models/M:generateContent`) and Vertex AI (`/v1/projects/P/locations/L/publishers/
google/models/M:...`) serve it.

The body is checked like Google's proto-JSON parser does (unknown names are refused everywhere,
camelCase and snake_case both accepted) and turned into the engine's `ChatRequest`, with the
messages normalised to chat-completion shape so the script, prompt count and seed work as in
every dialect (a user turn made only of `functionResponse` parts plays OpenAI's `tool` message).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .config import SimConfig
from .errors import ApiError
from .request import ChatRequest
from .script import Fault, Generation
from .text import count_prompt
from .vendor_models import gemini_refusal, gemini_thinks
from .wire import dumps

__all__ = [
    "GeminiContext",
    "GeminiRequest",
    "GeminiRoute",
    "GeminiStream",
    "gemini_fault",
    "google_error",
    "parse_generate_request",
    "parse_route",
    "response_body",
]

_STUDIO = re.compile(
    r"/(v1|v1beta|v1alpha)/models/([^/:]+):(generateContent|streamGenerateContent)"
)
_VERTEX = re.compile(
    r"/(v1|v1beta1)/projects/([^/]+)/locations/([^/]+)/publishers/google/models/([^/:]+)"
    r":(generateContent|streamGenerateContent)"
)
DEFAULT_RETRY_DELAY_S = 4.0  # RetryInfo.retryDelay of a 429 whose script gives no retry_after
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"

_TOP = frozenset(
    {
        "contents", "systemInstruction", "tools", "toolConfig", "generationConfig",
        "safetySettings", "cachedContent", "labels", "model",
    }
)  # fmt: skip
_CONTENT = frozenset({"role", "parts"})
_PART_DATA = frozenset(
    {"text", "inlineData", "fileData", "functionCall", "functionResponse", "executableCode",
     "codeExecutionResult"}
)  # fmt: skip
_PART = _PART_DATA | {"thought", "thoughtSignature", "videoMetadata", "mediaResolution"}
_NESTED: Mapping[str, frozenset[str]] = {
    "inlineData": frozenset({"mimeType", "data", "displayName"}),
    "fileData": frozenset({"mimeType", "fileUri", "displayName"}),
    "functionCall": frozenset({"id", "name", "args"}),
    "functionResponse": frozenset({"id", "name", "response", "parts", "willContinue"}),
}
_TOOL = frozenset(
    {"functionDeclarations", "googleSearch", "googleSearchRetrieval", "codeExecution",
     "urlContext", "retrieval", "fileSearch", "googleMaps", "enterpriseWebSearch"}
)  # fmt: skip
_DECLARATION = frozenset(
    {"name", "description", "parameters", "parametersJsonSchema", "response",
     "responseJsonSchema", "behavior"}
)  # fmt: skip
# The OpenAPI subset `parameters` takes; JSON-Schema-only words are unknown names to it.
_SCHEMA = frozenset(
    {"type", "format", "title", "description", "nullable", "enum", "maxItems", "minItems",
     "properties", "required", "minProperties", "maxProperties", "minLength", "maxLength",
     "pattern", "example", "anyOf", "propertyOrdering", "default", "items", "minimum",
     "maximum"}
)  # fmt: skip
_TYPES = frozenset(
    {"TYPE_UNSPECIFIED", "STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL"}
)
_GENERATION = frozenset(
    {"stopSequences", "responseMimeType", "responseSchema", "responseJsonSchema",
     "responseModalities", "candidateCount", "maxOutputTokens", "temperature", "topP", "topK",
     "seed", "presencePenalty", "frequencyPenalty", "responseLogprobs", "logprobs",
     "enableEnhancedCivicAnswers", "speechConfig", "thinkingConfig", "mediaResolution",
     "imageConfig", "audioTimestamp"}
)  # fmt: skip
_THINKING = frozenset({"includeThoughts", "thinkingBudget", "thinkingLevel"})
_LEVELS = ("THINKING_LEVEL_UNSPECIFIED", "MINIMAL", "LOW", "MEDIUM", "HIGH")
_MODES = ("MODE_UNSPECIFIED", "AUTO", "ANY", "NONE", "VALIDATED")
_STATUSES: Mapping[int, tuple[str, str]] = {
    400: ("INVALID_ARGUMENT", "Request contains an invalid argument."),
    401: ("UNAUTHENTICATED", "Request had invalid authentication credentials."),
    403: ("PERMISSION_DENIED", "The caller does not have permission."),
    404: ("NOT_FOUND", "Requested entity was not found."),
    429: ("RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota)."),
    500: ("INTERNAL", "An internal error has occurred. Please retry or report it."),
    503: ("UNAVAILABLE", "The model is overloaded. Please try again later."),
    504: ("DEADLINE_EXCEEDED", "Deadline expired before operation could complete."),
}
_FINISH = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS"}


@attrs.frozen(kw_only=True)
class GeminiRoute:
    version: str
    model: str
    stream: bool
    vertex: bool
    project: str = ""
    location: str = ""


def parse_route(path: str) -> GeminiRoute | None:
    match = _STUDIO.fullmatch(path)
    if match is not None:
        version, model, method = match.groups()
        return GeminiRoute(
            version=version, model=model, stream=method.startswith("stream"), vertex=False
        )
    match = _VERTEX.fullmatch(path)
    if match is not None:
        version, project, location, model, method = match.groups()
        return GeminiRoute(
            version=version,
            model=model,
            stream=method.startswith("stream"),
            vertex=True,
            project=project,
            location=location,
        )
    return None


def _seconds(value: float) -> str:
    return f"{int(value)}s" if float(value).is_integer() else f"{value}s"


def google_error(
    code: int, message: str, status: str | None = None, details: Sequence[Any] = ()
) -> ApiError:
    """A google.rpc Status answer. Google sends no Retry-After header, even on 429."""
    error: dict[str, Any] = {
        "code": code,
        "message": message,
        "status": status or _STATUSES.get(code, ("UNKNOWN", ""))[0],
    }
    if details:
        error["details"] = list(details)
    return ApiError(status=code, body={"error": error})


def _fault_error(fault: Fault) -> dict[str, Any]:
    status, message = _STATUSES.get(fault.status, ("UNKNOWN", ""))
    retry = fault.retry_after
    if retry is None and fault.status == 429:
        retry = DEFAULT_RETRY_DELAY_S
    details = [] if retry is None else [{"@type": _RETRY_INFO, "retryDelay": _seconds(retry)}]
    error = google_error(
        fault.status, message or f"simulated HTTP {fault.status}", fault.error or status, details
    )
    body: dict[str, Any] = error.body
    return body


def gemini_fault(fault: Fault) -> ApiError:
    body = fault.body if fault.body is not None else _fault_error(fault)
    return ApiError(status=fault.status, body=body)


# ---- the request ---------------------------------------------------------------------------


class _Invalid(Exception):
    """A 400 INVALID_ARGUMENT with this message."""


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def _fields(value: Any, allowed: frozenset[str], at: str) -> dict[str, Any]:
    """`value`'s fields under their camelCase names; an unknown one is Google's 400."""
    if not isinstance(value, Mapping):
        where = f" at '{at}'" if at else ""
        raise _Invalid(f"Invalid JSON payload received. Expected an object{where}.")
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = _camel(key) if "_" in key else key
        if name not in allowed:
            where = f" at '{at}'" if at else ""
            raise _Invalid(
                f'Invalid JSON payload received. Unknown name "{key}"{where}: Cannot find field.'
            )
        out[name] = item
    return out


def _list(value: Any, at: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Invalid(
            f"Invalid value at '{at}', Proto field is repeating, cannot start an object."
        )
    return value


def _check_schema(schema: Any, at: str) -> None:
    fields = _fields(schema, _SCHEMA, at)
    kind = fields.get("type")
    if isinstance(kind, list):
        raise _Invalid(
            f"Invalid JSON payload received. Unknown name \"type\" at '{at}': Proto field is "
            "not repeating, cannot start list."
        )
    if kind is not None and (not isinstance(kind, str) or kind.upper() not in _TYPES):
        raise _Invalid(f"Invalid value at '{at}.type' (type.googleapis.com/Type), {kind!r}")
    properties = fields.get("properties", {})
    if not isinstance(properties, Mapping):
        raise _Invalid(f"Invalid value at '{at}.properties', expected an object.")
    for i, item in enumerate(properties.values()):
        _check_schema(item, f"{at}.properties[{i}].value")
    if "items" in fields:
        _check_schema(fields["items"], f"{at}.items")
    for i, item in enumerate(_list(fields.get("anyOf"), f"{at}.any_of")):
        _check_schema(item, f"{at}.any_of[{i}]")


def _check_tools(tools: Any) -> list[Any]:
    out = []
    for i, tool in enumerate(_list(tools, "tools")):
        fields = _fields(tool, _TOOL, f"tools[{i}]")
        for j, declaration in enumerate(_list(fields.get("functionDeclarations"), "")):
            at = f"tools[{i}].function_declarations[{j}]"
            decl = _fields(declaration, _DECLARATION, at)
            if not isinstance(decl.get("name"), str) or not decl["name"]:
                raise _Invalid(f"* GenerateContentRequest.{at}.name: Function name is required.")
            if "parameters" in decl and "parametersJsonSchema" in decl:
                raise _Invalid(
                    f"* GenerateContentRequest.{at}: parameters and parameters_json_schema "
                    "cannot both be set."
                )
            if "parameters" in decl:
                _check_schema(decl["parameters"], f"{at}.parameters")
            elif not isinstance(decl.get("parametersJsonSchema", {}), Mapping):
                raise _Invalid(f"Invalid value at '{at}.parameters_json_schema'")
            out.append(decl)
    return out


def _check_tool_config(config: Any) -> str:
    if config is None:
        return "AUTO"
    fields = _fields(config, frozenset({"functionCallingConfig", "retrievalConfig"}), "tool_config")
    at = "tool_config.function_calling_config"
    calling = _fields(
        fields.get("functionCallingConfig", {}), frozenset({"mode", "allowedFunctionNames"}), at
    )
    mode = calling.get("mode", "AUTO")
    if mode not in _MODES:
        raise _Invalid(f"Invalid value at '{at}.mode' (type.googleapis.com/Mode), {mode!r}")
    if calling.get("allowedFunctionNames") and mode != "ANY":
        raise _Invalid(
            "* GenerateContentRequest.tool_config.function_calling_config.allowed_function_names"
            ": only allowed when mode is ANY."
        )
    return str(mode)


def _check_parts(parts: Any, at: str) -> list[dict[str, Any]]:
    out = []
    for j, part in enumerate(_list(parts, f"{at}.parts")):
        fields = _fields(part, _PART, f"{at}.parts[{j}]")
        data = [name for name in fields if name in _PART_DATA]
        if len(data) != 1:
            raise _Invalid(
                f"* GenerateContentRequest.{at}.parts[{j}].data: required oneof field 'data' "
                "must have one initialized field"
            )
        name = data[0]
        if name in _NESTED:
            _fields(fields[name], _NESTED[name], f"{at}.parts[{j}].{_snake(name)}")
        if name == "text" and not isinstance(fields["text"], str):
            raise _Invalid(f"Invalid value at '{at}.parts[{j}].text', expected a string.")
        out.append(fields)
    return out


def _normalise(role: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One turn in chat-completion shape, for the script and the prompt count."""
    if parts and all("functionResponse" in p for p in parts):
        responses = [json.dumps(p["functionResponse"].get("response")) for p in parts]
        return {"role": "tool", "content": "".join(responses)}
    content: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for part in parts:
        if part.get("thought"):
            continue  # earlier turns' thoughts are not context the model sees again
        if "text" in part:
            content.append({"type": "text", "text": part["text"]})
        elif "functionCall" in part:
            call = part["functionCall"]
            arguments = json.dumps(call.get("args", {}), ensure_ascii=False)
            calls.append({"function": {"name": call.get("name", ""), "arguments": arguments}})
        else:
            content.append({"type": "media"})
    out: dict[str, Any] = {"role": "assistant" if role == "model" else "user", "content": content}
    if calls:
        out["tool_calls"] = calls
    return out


def _check_contents(contents: Any) -> list[dict[str, Any]]:
    turns = _list(contents, "contents")
    if not turns:
        raise _Invalid("* GenerateContentRequest.contents: contents is not specified")
    messages = []
    for i, turn in enumerate(turns):
        fields = _fields(turn, _CONTENT, f"contents[{i}]")
        role = fields.get("role") or "user"
        if role not in ("user", "model"):
            raise _Invalid("Please use a valid role: user, model.")
        parts = _check_parts(fields.get("parts"), f"contents[{i}]")
        if not parts:
            raise _Invalid(
                f"* GenerateContentRequest.contents[{i}].parts: contents.parts must not be empty."
            )
        messages.append(_normalise(role, parts))
    return messages


@attrs.frozen(kw_only=True)
class GeminiRequest:
    chat: ChatRequest
    include_thoughts: bool


def _check_generation(config: Any, model: str) -> tuple[int | None, bool, bool]:
    """maxOutputTokens, thinking on, thoughts shown; what ``model`` refuses is refused."""
    fields = _fields(config or {}, _GENERATION, "generation_config")
    limit = fields.get("maxOutputTokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
        raise _Invalid("Invalid value at 'generation_config.max_output_tokens' (TYPE_INT32)")
    at = "generation_config.thinking_config"
    thinking = _fields(fields.get("thinkingConfig") or {}, _THINKING, at)
    if "thinkingBudget" in thinking and "thinkingLevel" in thinking:
        raise _Invalid(
            "Unable to submit request because thinking_budget and thinking_level are not "
            "supported together."
        )
    level = thinking.get("thinkingLevel")
    if level is not None and str(level).upper() not in _LEVELS:
        raise _Invalid(f"Invalid value at '{at}.thinking_level', {level!r}")
    refusal = gemini_refusal(model, thinking)
    if refusal is not None:
        raise _Invalid(refusal.message)
    return limit or None, gemini_thinks(thinking), bool(thinking.get("includeThoughts"))


def _validate(data: Mapping[str, Any], config: SimConfig, stream: bool) -> GeminiRequest:
    fields = _fields(data, _TOP, "")
    messages = _check_contents(fields.get("contents"))
    system = fields.get("systemInstruction")
    if system is not None:
        system_fields = _fields(system, _CONTENT, "system_instruction")
        parts = _check_parts(system_fields.get("parts"), "system_instruction")
        text = "".join(p.get("text", "") for p in parts)
        messages.insert(0, {"role": "system", "content": text})
    tools = _check_tools(fields.get("tools"))
    mode = _check_tool_config(fields.get("toolConfig"))
    limit, thinking, include_thoughts = _check_generation(
        fields.get("generationConfig"), config.served_model_name
    )
    prompt = count_prompt(messages, tools or None, thinking=True)
    if prompt.tokens >= config.max_model_len:
        raise _Invalid(
            f"The input token count ({prompt.tokens}) exceeds the maximum number of tokens "
            f"allowed ({config.max_model_len})."
        )
    room = config.max_model_len - prompt.tokens
    chat = ChatRequest(
        messages=tuple(messages),
        stream=stream,
        include_usage=False,
        continuous_usage=False,
        max_tokens=room if limit is None else min(limit, room),
        ignore_eos=False,
        thinking=thinking,
        parse_tools=bool(tools) and mode != "NONE",
        parallel_tool_calls=True,
        prompt=prompt,
        blank_after_think=False,
    )
    return GeminiRequest(chat=chat, include_thoughts=include_thoughts)


def parse_generate_request(
    body: bytes, config: SimConfig, route: GeminiRoute
) -> GeminiRequest | ApiError:
    if route.model != config.served_model_name:
        if route.vertex:
            name = (
                f"projects/{route.project}/locations/{route.location}/publishers/google/models/"
                f"{route.model}"
            )
            message = (
                f"Publisher Model `{name}` was not found or your project does not have access "
                "to it. Please ensure you are using a valid model version."
            )
        else:
            method = "streamGenerateContent" if route.stream else "generateContent"
            message = (
                f"models/{route.model} is not found for API version {route.version}, or is not "
                f"supported for {method}. Call ListModels to see the list of available models "
                "and their supported methods."
            )
        return google_error(404, message)
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return google_error(400, "Invalid JSON payload received. Unexpected token.")
    try:
        return _validate(data, config, route.stream)
    except _Invalid as problem:
        return google_error(400, str(problem))


# ---- the answer ----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class GeminiContext:
    response_id: str
    model: str
    prompt_tokens: int
    include_thoughts: bool
    thinking: bool
    sse: bool = True  # streamGenerateContent?alt=sse; else one JSON array, streamed


def _usage(ctx: GeminiContext, output: int, thoughts: int, cached: int) -> dict[str, Any]:
    usage: dict[str, Any] = {"promptTokenCount": ctx.prompt_tokens}
    if output - thoughts:
        usage["candidatesTokenCount"] = output - thoughts
    usage["totalTokenCount"] = ctx.prompt_tokens + output
    if cached:
        usage["cachedContentTokenCount"] = cached
    usage["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": ctx.prompt_tokens}]
    if thoughts:
        usage["thoughtsTokenCount"] = thoughts
    return usage


def _call_part(name: str, arguments: str, signed: bool) -> dict[str, Any]:
    try:
        args = json.loads(arguments)
    except ValueError:
        args = {}  # a scripted invalid-JSON argument string has no functionCall form
    part: dict[str, Any] = {"functionCall": {"name": name, "args": args}}
    if signed:
        # 2.5-class models sign the first function call of a turn after thinking.
        digest = hashlib.sha256(f"{name}|{arguments}".encode()).digest()
        part["thoughtSignature"] = base64.b64encode(digest).decode()
    return part


class _Parts:
    """Accumulates generated tokens into Gemini parts; a function call is one whole part."""

    def __init__(self, ctx: GeminiContext) -> None:
        self._ctx = ctx
        self.thoughts = 0
        self._call: tuple[str, list[str]] | None = None
        self._signed = False

    def _flush_call(self) -> list[dict[str, Any]]:
        if self._call is None:
            return []
        name, pieces = self._call
        self._call = None
        sign = self._ctx.thinking and not self._signed
        self._signed = True
        return [_call_part(name, "".join(pieces), sign)]

    def add(self, kind: str, text: str) -> list[dict[str, Any]]:
        if kind == "tool_args" and self._call is not None:
            self._call[1].append(text)
            return []
        parts = self._flush_call()
        if kind == "reasoning":
            self.thoughts += 1
            if self._ctx.include_thoughts:
                parts.append({"text": text, "thought": True})
        elif kind == "content" and text:
            parts.append({"text": text})
        elif kind == "tool_name":
            self._call = (text, [])
        return parts

    def end(self) -> list[dict[str, Any]]:
        return self._flush_call()


def finish_reason(generation: Generation) -> str:
    return generation.vendor_finish or _FINISH[generation.finish_reason]


def _response(
    ctx: GeminiContext, parts: list[dict[str, Any]], usage: dict[str, Any], finish: str | None
) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}}
    if finish is not None:
        candidate["finishReason"] = finish
        candidate["index"] = 0
    return {
        "candidates": [candidate],
        "usageMetadata": usage,
        "modelVersion": ctx.model,
        "responseId": ctx.response_id,
    }


class GeminiStream:
    """streamGenerateContent, one generated token at a time (feed 0, 1, ... in order). SSE
    frames end in CRLF CRLF and nothing marks the end but the close."""

    def __init__(self, ctx: GeminiContext, generation: Generation) -> None:
        self._ctx = ctx
        self._generation = generation
        self._parts = _Parts(ctx)
        self._cached = 0
        self._frames = 0

    def _frame(self, value: Any) -> bytes:
        self._frames += 1
        if self._ctx.sse:
            return b"data: " + dumps(value) + b"\r\n\r\n"
        return (b"[" if self._frames == 1 else b",\r\n") + dumps(value)

    def token(self, index: int, cached_tokens: int = 0) -> list[bytes]:
        if index == 0:
            self._cached = cached_tokens
        token = self._generation.tokens[index]
        parts = self._parts.add(token.kind, token.text)
        last = index == len(self._generation.tokens) - 1
        if last:
            parts += self._parts.end()
        if not parts and not last:
            return []
        usage = _usage(self._ctx, index + 1, self._parts.thoughts, self._cached)
        finish = finish_reason(self._generation) if last else None
        frames = [self._frame(_response(self._ctx, parts or [{"text": ""}], usage, finish))]
        if last and not self._ctx.sse:
            frames.append(b"]")
        return frames

    def stream_error(self, fault: Fault) -> list[bytes]:
        # Google ends a failing stream with one error object where the next chunk would be.
        body = gemini_fault(fault).body
        return [self._frame(body), b""] if self._ctx.sse else [self._frame(body), b"]"]


def response_body(
    ctx: GeminiContext, generation: Generation, produced: int, cached_tokens: int
) -> dict[str, Any]:
    """The whole generateContent answer after `produced` tokens: one part per kind."""
    acc = _Parts(ctx)
    parts: list[dict[str, Any]] = []
    for token in generation.tokens[:produced]:
        for part in acc.add(token.kind, token.text):
            merge = parts and "text" in part and "text" in parts[-1]
            if merge and part.get("thought") == parts[-1].get("thought"):
                parts[-1]["text"] += part["text"]
            else:
                parts.append(part)
    parts += acc.end()
    usage = _usage(ctx, produced, acc.thoughts, cached_tokens)
    return _response(ctx, parts, usage, finish_reason(generation))
