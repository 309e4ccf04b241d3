"""The simulated generateContent request: routes, the checks Google's proto-JSON parser makes
(unknown names refused everywhere, camelCase and snake_case both accepted), and its errors."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .config import SimConfig
from .errors import ApiError
from .gemini_signatures import PLACEHOLDERS, decode, issued
from .request import ChatRequest
from .text import count_prompt
from .vendor_models import gemini_refusal, gemini_thinks

_STUDIO = re.compile(
    r"/(v1|v1beta|v1alpha)/models/([^/:]+):(generateContent|streamGenerateContent)"
)
_VERTEX = re.compile(
    r"/(v1|v1beta1)/projects/([^/]+)/locations/([^/]+)/publishers/google/models/([^/:]+)"
    r":(generateContent|streamGenerateContent)"
)
_TOP = frozenset(
    {
        "contents", "systemInstruction", "tools", "toolConfig", "generationConfig",
        "safetySettings", "cachedContent", "labels", "model",
    }
)  # fmt: skip
_CONTENT = frozenset({"role", "parts"})
# The models that refuse a function call sent back without its thought signature (Gemini 3:
# https://ai.google.dev/gemini-api/docs/thought-signatures); earlier ones ignore a missing one.
SIGNING_MODELS = ("gemini-3",)
SIGNATURES_DOCS = "https://ai.google.dev/gemini-api/docs/thought-signatures"
# A signature Gemini did not issue, or altered, in each route's words (AI Studio:
# google-gemini/gemini-cli#13467; Vertex AI: RooCodeInc/Roo-Code#11716), both 400 INVALID_ARGUMENT.
CORRUPTED_SIGNATURE = "Corrupted thought signature."
VERTEX_INVALID_SIGNATURE = (
    "Unable to submit request because Thought signature is not valid.. Learn more: "
    "https://cloud.google.com/vertex-ai/generative-ai/docs/model-reference/gemini"
)
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
STATUSES: Mapping[int, tuple[str, str]] = {
    400: ("INVALID_ARGUMENT", "Request contains an invalid argument."),
    401: ("UNAUTHENTICATED", "Request had invalid authentication credentials."),
    403: ("PERMISSION_DENIED", "The caller does not have permission."),
    404: ("NOT_FOUND", "Requested entity was not found."),
    429: ("RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota)."),
    500: ("INTERNAL", "An internal error has occurred. Please retry or report it."),
    503: ("UNAVAILABLE", "The model is overloaded. Please try again later."),
    504: ("DEADLINE_EXCEEDED", "Deadline expired before operation could complete."),
}


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


def google_error(
    code: int, message: str, status: str | None = None, details: Sequence[Any] = ()
) -> ApiError:
    """A google.rpc Status answer. Google sends no Retry-After header, even on 429."""
    error: dict[str, Any] = {
        "code": code,
        "message": message,
        "status": status or STATUSES.get(code, ("UNKNOWN", ""))[0],
    }
    if details:
        error["details"] = list(details)
    return ApiError(status=code, body={"error": error})


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


def _check_signatures(turns: list[tuple[str, list[dict[str, Any]]]]) -> None:
    """Gemini 3's rule: in the current turn (since the last user content that is more than
    function responses), each model step's first functionCall part carries the
    thoughtSignature it was sent with (Google's placeholder for history it did not sign, too)."""
    start = 0
    for i, (role, parts) in enumerate(turns):
        if role == "user" and not all("functionResponse" in part for part in parts):
            start = i + 1
    for i in range(start, len(turns)):
        role, parts = turns[i]
        calls = [part for part in parts if "functionCall" in part]
        if role == "model" and calls and not calls[0].get("thoughtSignature"):
            name = calls[0]["functionCall"].get("name")
            raise _Invalid(
                "Function call is missing a thought_signature in functionCall parts. This is "
                "required for tools to work correctly, and missing thought_signature may lead "
                f"to degraded model performance. Additional data, function call `default_api:"
                f"{name}` , position {i + 1}. Please refer to {SIGNATURES_DOCS} for more details."
            )


@attrs.frozen(kw_only=True)
class _Signing:
    key: bytes  # the simulator's: the signatures it recognises as its own
    required: bool  # a Gemini 3 model: the current turn's calls must carry theirs
    vertex: bool  # whose words a bad signature is refused in


def _check_signature(value: Any, at: str, signing: _Signing) -> None:
    """A part's thoughtSignature is a proto ``bytes`` field, parsed first, then verified: Google
    refuses one it did not issue, or altered, from any turn (the missing check is Gemini 3's)."""
    if value == "" or value in PLACEHOLDERS:
        return  # empty bytes are no signature at all
    raw = decode(value) if isinstance(value, str) else None
    if raw is None:
        shown = value if isinstance(value, str) else json.dumps(value)
        raise _Invalid(
            f"Invalid value at '{at}.thought_signature' (TYPE_BYTES), Base64 decoding failed "
            f'for "{shown}"'
        )
    if not issued(signing.key, raw):
        raise _Invalid(VERTEX_INVALID_SIGNATURE if signing.vertex else CORRUPTED_SIGNATURE)


def _check_contents(contents: Any, signing: _Signing) -> list[dict[str, Any]]:
    turns = _list(contents, "contents")
    if not turns:
        raise _Invalid("* GenerateContentRequest.contents: contents is not specified")
    messages = []
    checked: list[tuple[str, list[dict[str, Any]]]] = []
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
        for j, part in enumerate(parts):
            if "thoughtSignature" in part:
                _check_signature(part["thoughtSignature"], f"contents[{i}].parts[{j}]", signing)
        checked.append((role, parts))
        messages.append(_normalise(role, parts))
    if signing.required:
        _check_signatures(checked)
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


def _validate(
    data: Mapping[str, Any], config: SimConfig, stream: bool, signing: _Signing
) -> GeminiRequest:
    fields = _fields(data, _TOP, "")
    messages = _check_contents(fields.get("contents"), signing)
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
    body: bytes, config: SimConfig, route: GeminiRoute, *, signing_key: bytes
) -> GeminiRequest | ApiError:
    """The request, or Google's refusal; `signing_key` is the one the simulator signs with."""
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
    signing = _Signing(
        key=signing_key,
        required=config.served_model_name.startswith(SIGNING_MODELS),
        vertex=route.vertex,
    )
    try:
        return _validate(data, config, route.stream, signing)
    except _Invalid as problem:
        return google_error(400, str(problem))
