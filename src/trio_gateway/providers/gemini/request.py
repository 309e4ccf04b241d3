"""An OpenAI chat body → a Gemini ``GenerateContentRequest`` (AI Studio and Vertex AI). Pure.

The body arrives validated by OpenAI's rules (``validation.py``), so shapes are known; what is
raised here is only what Gemini cannot express. Gemini rejects unknown names everywhere (top
level, ``generationConfig``, parts, tools), so the body is built from nothing, field by field: a
field not translated below is never sent. Every OpenAI field, and what Gemini gets:

=========================  ======================================================================
``model``                  the URL's model (``provider.model``), never the body
``messages``               ``systemInstruction`` + ``contents`` (see :func:`translate_messages`)
``max_completion_tokens``  ``generationConfig.maxOutputTokens`` (preferred, as at OpenAI); Gemini
``max_tokens``             counts thinking inside it, as OpenAI counts reasoning; at most the
                           model's output cap
``temperature``            ``temperature`` as is (Gemini's range is OpenAI's, 0..2)
``top_p``                  ``topP`` as is
``top_k`` (vLLM's)         ``topK`` when positive (-1 and 0 are vLLM's "off")
``stop``                   ``stopSequences`` (always a list)
``seed``                   ``seed``, folded into Gemini's int32 (:func:`int32_seed`)
``presence_penalty``,      ``presencePenalty``, ``frequencyPenalty`` as is (some models refuse
``frequency_penalty``      penalties: name them in the provider's ``strip_fields``)
``response_format``        ``json_schema`` → ``responseMimeType: application/json`` +
                           ``responseJsonSchema``; ``json_object`` → the MIME type alone;
                           ``text`` → nothing
``tools``                  ``[{functionDeclarations: [{name, description, parametersJsonSchema}]}]``
                           (``parameters`` takes an OpenAPI subset only); ``strict`` dropped
``tool_choice``            ``toolConfig.functionCallingConfig``: auto → AUTO, none → NONE,
                           required → ANY, a named function → ANY + ``allowedFunctionNames``
``reasoning_effort``,      ``generationConfig.thinkingConfig``, as the model's family takes it
``reasoning`` (gateway's)  (``model_rules.thinking_config``)
``stream``                 the URL (``:streamGenerateContent?alt=sse``), always streamed
everything else            dropped (:data:`DROPPED_FIELDS`) or refused (:data:`REFUSED_FIELDS`)
=========================  ======================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.errors import InvalidRequest, UnsupportedParameter
from trio_gateway.core.request import ChatRequest
from trio_gateway.core.request import strict_loads as _strict_loads
from trio_gateway.providers.gemini.model_rules import output_cap, thinking_config
from trio_gateway.providers.gemini.signatures import message_signatures
from trio_gateway.providers.translate import (
    content_texts,
    image_type_from_url,
    parse_data_url,
    stop_sequences,
    tool_arguments_object,
)

Part = dict[str, Any]

# OpenAI fields with no Gemini counterpart, dropped so "ignored" never looks like "applied"
# (and because Gemini would refuse any name it does not know).
DROPPED_FIELDS: Final = frozenset(
    {
        # In the URL (the model) or always asked for (a stream, with usage on every chunk).
        "model",
        "stream",
        "stream_options",
        # Gemini chooses how many calls to make in one turn; there is no switch.
        "parallel_tool_calls",
        # The gateway refuses n > 1 and logprobs before any provider is picked: what is left
        # (n: 1, logprobs: false) asks for nothing.
        "n",
        "logprobs",
        "top_logprobs",
        # Keys are OpenAI tokenizer ids, meaningless to Gemini.
        "logit_bias",
        # OpenAI's stored completions, end-user ids and tracking: nothing to carry them in
        # (Vertex `labels` have their own key rules and are the operator's, not the client's).
        "store",
        "metadata",
        "user",
        "safety_identifier",
        # OpenAI's capacity tiers and prompt-cache hints: Gemini caches implicitly, and its
        # explicit caches (`cachedContent`) are the operator's business.
        "service_tier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "verbosity",
        # A latency optimisation only: the answer is the same without it.
        "prediction",
        "moderation",
        # Audio output settings: `modalities` asking for audio is refused instead.
        "audio",
        "modalities",
    }
)
# OpenAI fields whose loss would change the answer's meaning: refused, not dropped.
REFUSED_FIELDS: Final = frozenset({"functions", "function_call", "web_search_options"})
# Gemini 3 refuses a replayed functionCall part without the thoughtSignature it was sent with
# ("Function call is missing a thought_signature"). A client that sends back the answer's
# reasoning_details returns them (signatures.py); for a history without them, this is the value
# Google documents for history it did not sign
# (https://ai.google.dev/gemini-api/docs/thought-signatures). Earlier models ignore it.
SKIP_SIGNATURE: Final = "skip_thought_signature_validator"
# An image URL whose path names no known image type (translate.IMAGE_EXTENSION_TYPES) is sent
# as JPEG, the most common type of extension-less image URLs (CDNs, thumbnails).
DEFAULT_IMAGE_TYPE: Final = "image/jpeg"
AUDIO_TYPES: Final[Mapping[str, str]] = {"wav": "audio/wav", "mp3": "audio/mp3"}
TOOL_CHOICE_MODES: Final[Mapping[str, str]] = {"auto": "AUTO", "none": "NONE", "required": "ANY"}
INT32: Final = 2**32


def _given(body: Mapping[str, Any], key: str) -> Any:
    # Null is "not given", as at OpenAI.
    return body.get(key)


def int32_seed(seed: int) -> int:
    """OpenAI's int64 seed as Gemini's int32, by wrapping: equal seeds stay equal, which is
    all a seed promises."""
    return (seed + INT32 // 2) % INT32 - INT32 // 2


# --- messages ----------------------------------------------------------------------------------


def _image_part(url: str, param: str) -> Part:
    inline = parse_data_url(url, param=param)
    if inline is not None:
        return {"inlineData": {"mimeType": inline.mime_type, "data": inline.data}}
    mime_type = image_type_from_url(url) or DEFAULT_IMAGE_TYPE
    return {"fileData": {"mimeType": mime_type, "fileUri": url}}


def _file_part(file: Mapping[str, Any], param: str) -> Part:
    data = _given(file, "file_data")
    if not isinstance(data, str):
        raise UnsupportedParameter(
            "gemini cannot read OpenAI file ids; send the file inline as file_data",
            param=f"{param}.file",
        )
    # OpenAI takes PDFs in file parts, as a data URL or as bare base64.
    if not data.startswith("data:"):
        data = "data:application/pdf;base64," + data
    inline = parse_data_url(data, param=f"{param}.file.file_data")
    if inline is None:  # unreachable: data now starts with "data:"
        raise InvalidRequest("expected a data URL", param=f"{param}.file.file_data")
    return {"inlineData": {"mimeType": inline.mime_type, "data": inline.data}}


def _user_parts(content: object, path: str) -> list[Part]:
    if isinstance(content, str):
        # Gemini refuses an empty text ("empty text parameter").
        return [{"text": content}] if content else []
    parts: list[Part] = []
    for j, part in enumerate(content if isinstance(content, list) else ()):
        param = f"{path}.content[{j}]"
        kind = part.get("type")
        if kind == "text":
            if part["text"]:
                parts.append({"text": part["text"]})
        elif kind == "image_url":
            # `detail` has no counterpart in generateContent: Gemini sizes images itself.
            parts.append(_image_part(part["image_url"]["url"], f"{param}.image_url.url"))
        elif kind == "input_audio":
            audio = part["input_audio"]
            mime_type = AUDIO_TYPES[audio["format"]]
            # Checked as a data URL would be: Gemini refuses a payload that is not base64.
            data_param = f"{param}.input_audio.data"
            parse_data_url(f"data:{mime_type};base64,{audio['data']}", param=data_param)
            parts.append({"inlineData": {"mimeType": mime_type, "data": audio["data"]}})
        elif kind == "file":
            parts.append(_file_part(part["file"], param))
        else:
            raise UnsupportedParameter(
                f"gemini does not accept {kind!r} content parts", param=f"{param}.type"
            )
    return parts


def _model_parts(message: Mapping[str, Any], path: str) -> tuple[list[Part], dict[str, str]]:
    """An assistant message's parts, and its tool calls' names by id."""
    for key in ("function_call", "audio"):
        if _given(message, key) is not None:
            raise UnsupportedParameter(
                f"an assistant message's {key!r} cannot be sent to gemini", param=f"{path}.{key}"
            )
    content = _given(message, "content")
    texts: list[str] = []
    if isinstance(content, str):
        texts = [content] if content else []
    elif isinstance(content, list):
        # A refusal part is text the assistant said.
        for part in content:
            text = part.get("text") if part.get("type") == "text" else part.get("refusal")
            if text:
                texts.append(text)
    refusal = _given(message, "refusal")
    if isinstance(refusal, str) and refusal and not texts:
        texts = [refusal]
    parts: list[Part] = [{"text": text} for text in texts]
    signed = message_signatures(message)
    if signed is not None and signed.text is not None and parts:
        parts[-1]["thoughtSignature"] = signed.text
    names: dict[str, str] = {}
    calls = _given(message, "tool_calls") or ()
    # No signature for any of these calls (none sent back, or ids the client changed): Google's
    # placeholder on each, as for a history without signatures.
    by_call = {} if signed is None else signed.calls
    placeholder = not any(call["id"] in by_call for call in calls)
    for k, call in enumerate(calls):
        function = call["function"]
        args = tool_arguments_object(
            function["arguments"], param=f"{path}.tool_calls[{k}].function.arguments"
        )
        names[call["id"]] = function["name"]
        call_part: Part = {"functionCall": {"name": function["name"], "args": args}}
        # Each call with the signature Gemini sent it with (none on a parallel call Gemini did
        # not sign), or Google's placeholder.
        signature = SKIP_SIGNATURE if placeholder else by_call.get(call["id"])
        if signature is not None:
            call_part["thoughtSignature"] = signature
        parts.append(call_part)
    return parts, names


def function_response(content: object) -> dict[str, Any]:
    """A tool message's content as ``functionResponse.response``, which must be an object.

    A result that is a JSON object is sent as that object, so the model sees its fields;
    anything else (plain text, a JSON array or number) is ``{"output": text}``: ``output`` is
    the key Google documents for a function's output (FunctionResponse.response).
    """
    text = "".join(content_texts(content))
    if text.lstrip().startswith("{"):
        try:
            parsed = _strict_loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    return {"output": text}


def translate_messages(
    messages: list[dict[str, Any]],
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """OpenAI ``messages`` → Gemini's ``systemInstruction`` and ``contents``.

    - ``system`` and ``developer`` messages, wherever they stand, become the system instruction's
      text parts, in order (Gemini has no system role in a conversation).
    - ``user`` is role ``user``, ``assistant`` is role ``model``; a message's ``name`` is dropped.
    - ``tool`` messages become ``functionResponse`` parts of a user turn, named after the
      assistant's call with that ``tool_call_id`` (Gemini matches results to calls by name).
    - Consecutive turns of one role are merged (parallel calls' results make one user turn, as
      Gemini wants them).
    - Empty texts are dropped (Gemini refuses them), and a message left with nothing with them.
    """
    system: list[Part] = []
    contents: list[dict[str, Any]] = []
    call_names: dict[str, str] = {}
    for i, message in enumerate(messages):
        path = f"messages[{i}]"
        role = message["role"]
        if role in ("system", "developer"):
            system.extend({"text": text} for text in content_texts(message["content"]))
            continue
        if role == "user":
            parts = _user_parts(message["content"], path)
        elif role == "assistant":
            role = "model"
            parts, names = _model_parts(message, path)
            call_names.update(names)
        elif role == "tool":
            name = call_names.get(message["tool_call_id"])
            if name is None:
                raise InvalidRequest(
                    f"no earlier assistant tool call has the id {message['tool_call_id']!r}; "
                    "gemini needs the function's name for its result",
                    param=f"{path}.tool_call_id",
                )
            response = function_response(message["content"])
            role, parts = "user", [{"functionResponse": {"name": name, "response": response}}]
        else:
            raise UnsupportedParameter(
                f"{role!r} messages cannot be sent to gemini; use tool messages",
                param=f"{path}.role",
            )
        if not parts:
            continue
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": parts})
    if not contents:
        raise InvalidRequest(
            "gemini needs at least one user or assistant message with content", param="messages"
        )
    return ({"parts": system} if system else None), contents


# --- tools -------------------------------------------------------------------------------------


def translate_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    declarations = []
    for tool in tools:
        function = tool["function"]
        declaration: dict[str, Any] = {"name": function["name"]}
        description = _given(function, "description")
        if description:
            declaration["description"] = description
        parameters = _given(function, "parameters")
        # Without parameters the function takes none, as at OpenAI. `strict` has no
        # counterpart: Gemini's function calling is schema-guided but not switchable.
        if parameters is not None:
            declaration["parametersJsonSchema"] = parameters
        declarations.append(declaration)
    return [{"functionDeclarations": declarations}]


def translate_tool_choice(choice: object) -> dict[str, Any] | None:
    if choice is None:
        return None
    if isinstance(choice, str):
        config: dict[str, Any] = {"mode": TOOL_CHOICE_MODES[choice]}
    else:
        assert isinstance(choice, dict)  # validated: a string or a named function
        config = {"mode": "ANY", "allowedFunctionNames": [choice["function"]["name"]]}
    return {"functionCallingConfig": config}


# --- generation config -------------------------------------------------------------------------


def generation_config(request: ChatRequest, provider: ProviderConfig) -> dict[str, Any]:
    body = request.body
    out: dict[str, Any] = {}
    cap = output_cap(provider)
    for key in ("max_completion_tokens", "max_tokens"):
        if _given(body, key) is not None:
            # Past the model's cap is a limit it cannot reach: the same answer, without a 400.
            out["maxOutputTokens"] = body[key] if cap is None else min(body[key], cap)
            break
    for openai_key, gemini_key in (
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("presence_penalty", "presencePenalty"),
        ("frequency_penalty", "frequencyPenalty"),
    ):
        if _given(body, openai_key) is not None:
            out[gemini_key] = body[openai_key]
    top_k = _given(body, "top_k")
    if top_k is not None:
        if type(top_k) is not int or top_k < -1:
            raise InvalidRequest("'top_k' must be a positive integer, or -1 for off", param="top_k")
        if top_k > 0:
            out["topK"] = top_k
    stops = stop_sequences(_given(body, "stop"))
    if stops:
        out["stopSequences"] = stops
    seed = _given(body, "seed")
    if seed is not None:
        out["seed"] = int32_seed(seed)
    response_format = _given(body, "response_format")
    if response_format is not None and response_format["type"] != "text":
        out["responseMimeType"] = "application/json"
        if response_format["type"] == "json_schema":
            schema = _given(response_format["json_schema"], "schema")
            if schema is not None:
                out["responseJsonSchema"] = schema
    thinking = thinking_config(request, provider)
    if thinking is not None:
        out["thinkingConfig"] = thinking
    return out


# --- the body ----------------------------------------------------------------------------------


def build_body(request: ChatRequest, provider: ProviderConfig) -> dict[str, Any]:
    """The ``GenerateContentRequest`` for ``request`` (the model and the streaming are in the
    URL). ``provider.strip_fields`` are removed from the client's body first."""
    strip = frozenset(provider.strip_fields)
    body = {k: v for k, v in request.body.items() if k not in strip}
    for key in sorted(REFUSED_FIELDS):
        if _given(body, key) is not None:
            raise UnsupportedParameter(f"{key!r} cannot be sent to gemini", param=key)
    if "audio" in (_given(body, "modalities") or ()):
        raise UnsupportedParameter("the gateway cannot answer with audio", param="modalities")
    system, contents = translate_messages(body["messages"])
    out: dict[str, Any] = {"contents": contents}
    if system is not None:
        out["systemInstruction"] = system
    tools = _given(body, "tools")
    if tools:
        out["tools"] = translate_tools(tools)
        tool_config = translate_tool_choice(_given(body, "tool_choice"))
        if tool_config is not None:
            out["toolConfig"] = tool_config
    config = generation_config(attrs.evolve(request, body=body), provider)
    if config:
        out["generationConfig"] = config
    return out
