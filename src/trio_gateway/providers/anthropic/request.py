"""An OpenAI chat body → an Anthropic Messages body (``POST /v1/messages``). Pure.

The body arrives validated by OpenAI's rules (``validation.py``), so shapes are known; what is
raised here is only what Anthropic cannot express. Anthropic rejects unknown top-level fields
(``Extra inputs are not permitted``), so the body is built from nothing, field by field: a field
not translated below is never sent. Every OpenAI field, and what Anthropic gets:

=========================  ======================================================================
``model``                  ``provider.model``
``messages``               ``system`` + alternating ``messages`` (see :func:`translate_messages`)
``max_completion_tokens``  ``max_tokens`` (preferred over ``max_tokens``, as at OpenAI), else
``max_tokens``             ``provider.default_max_tokens``; at most the model's output cap;
                           the thinking budget comes out of it
``temperature``            as is, clamped to 1 (Anthropic's range is 0..1); unset with thinking
``top_p``                  as is; raised to 0.95 with thinking (the least Anthropic then takes)
``top_k`` (vLLM's)         as is when positive (-1 and 0 are vLLM's "off"); unset with thinking
``stop``                   ``stop_sequences`` (always a list); whitespace-only ones dropped
``user``                   ``metadata.user_id``; ``safety_identifier`` when there is no ``user``
``tools``                  ``{name, description, input_schema, strict}``
``tool_choice``            ``{"type": auto|none|any|tool}``; any/tool become auto with thinking
``parallel_tool_calls``    ``false`` → ``tool_choice.disable_parallel_tool_use: true``
``response_format``        ``json_schema`` → ``output_config.format``; ``text`` dropped (the
                           default); ``json_object`` refused (no schemaless JSON mode)
``reasoning_effort``,      ``thinking`` (:func:`thinking_config`); off mid tool loop
``reasoning`` (gateway's)  (:func:`in_tool_loop`) unless the assistant message sent back its
                           ``reasoning_details`` (``reasoning.py``)
``stream``                 always ``true``
everything else            dropped (:data:`DROPPED_FIELDS`) or refused (:data:`REFUSED_FIELDS`)
=========================  ======================================================================

``temperature``, ``top_p`` and ``top_k`` are sent as the client gave them, but the newest models
refuse them (the ``anthropic`` SDK 2.x no longer has them at all): a provider serving such a model
lists them in ``strip_fields``, which are removed before anything is translated.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.capability import Capability
from trio_gateway.core.errors import InvalidRequest, UnsupportedParameter
from trio_gateway.core.request import ChatRequest
from trio_gateway.providers.anthropic.extras import extras_fields, mark_tools, read_extras
from trio_gateway.providers.anthropic.reasoning import (
    resumes_thinking,
    thinking_blocks,
    without_thinking,
)
from trio_gateway.providers.output_caps import client_output_limit, model_output_cap
from trio_gateway.providers.translate import (
    budget_for,
    content_texts,
    parse_data_url,
    stop_sequences,
    tool_arguments_object,
)

Block = dict[str, Any]

# OpenAI fields with no Anthropic counterpart, dropped so "ignored" never looks like "applied".
DROPPED_FIELDS: Final = frozenset(
    {
        # Anthropic always reports usage in its stream; the front decides what the client sees.
        "stream_options",
        # The gateway refuses n > 1 and logprobs before any provider is picked: what is left
        # (n: 1, logprobs: false) asks for nothing.
        "n",
        "logprobs",
        "top_logprobs",
        # No such sampling controls; logit_bias's keys are OpenAI tokenizer ids besides.
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "seed",
        # OpenAI's stored completions; Anthropic's metadata only holds user_id (from `user`).
        "store",
        "metadata",
        # OpenAI's capacity tiers and prompt-cache hints: the operator's business at Anthropic
        # (cache_control breakpoints), not the client's.
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
# Anthropic's first message must be the user's; an OpenAI conversation may open with the
# assistant (a greeting). Empty text is rejected, so the stand-in turn holds one character.
LEADING_USER_TEXT: Final = "."
# Anthropic's tool_use ids must match this; other vendors' ids (and clients' own) may not.
_TOOL_ID_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")
# Anthropic's least thinking budget (``budget_tokens: Input should be greater than or equal to
# 1024``): a limit that leaves less turns thinking off.
MIN_THINKING_BUDGET: Final = 1024
# With thinking on, Anthropic takes top_p only in [0.95, 1].
THINKING_MIN_TOP_P: Final = 0.95


def _given(body: Mapping[str, Any], key: str) -> Any:
    # Null is "not given", as at OpenAI.
    return body.get(key)


def tool_use_id(openai_id: str) -> str:
    """A client's tool call id as Anthropic accepts it; the same mapping is applied to the
    ``tool_call_id`` of its result, so the pair still matches."""
    return _TOOL_ID_UNSAFE.sub("_", openai_id) or "_"


# --- messages ----------------------------------------------------------------------------------


def _image_block(url: str, param: str) -> Block:
    inline = parse_data_url(url, param=param)
    if inline is None:
        return {"type": "image", "source": {"type": "url", "url": url}}
    source = {"type": "base64", "media_type": inline.mime_type, "data": inline.data}
    return {"type": "image", "source": source}


def _document_block(file: Mapping[str, Any], param: str) -> Block:
    data = _given(file, "file_data")
    if not isinstance(data, str):
        raise UnsupportedParameter(
            "anthropic cannot read OpenAI file ids; send the file inline as file_data",
            param=f"{param}.file",
        )
    # OpenAI takes PDFs in file parts, as a data URL or as bare base64.
    if not data.startswith("data:"):
        data = "data:application/pdf;base64," + data
    inline = parse_data_url(data, param=f"{param}.file.file_data")
    if inline is None:  # unreachable: data now starts with "data:"
        raise InvalidRequest("expected a data URL", param=f"{param}.file.file_data")
    if inline.mime_type != "application/pdf":
        raise UnsupportedParameter(
            f"anthropic reads PDF files only, not {inline.mime_type}",
            param=f"{param}.file.file_data",
        )
    source = {"type": "base64", "media_type": inline.mime_type, "data": inline.data}
    return {"type": "document", "source": source}


def _user_blocks(content: object, path: str) -> list[Block]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[Block] = []
    for j, part in enumerate(content if isinstance(content, list) else ()):
        param = f"{path}.content[{j}]"
        kind = part.get("type")
        if kind == "text":
            if part["text"]:
                blocks.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            # `detail` has no Anthropic counterpart: images are sized by the vendor.
            blocks.append(_image_block(part["image_url"]["url"], f"{param}.image_url.url"))
        elif kind == "file":
            blocks.append(_document_block(part["file"], param))
        else:
            raise UnsupportedParameter(
                f"anthropic does not accept {kind!r} content parts", param=f"{param}.type"
            )
    return blocks


def _assistant_blocks(message: Mapping[str, Any], path: str) -> list[Block]:
    for key in ("function_call", "audio"):
        if _given(message, key) is not None:
            raise UnsupportedParameter(
                f"an assistant message's {key!r} cannot be sent to anthropic", param=f"{path}.{key}"
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
    blocks: list[Block] = [{"type": "text", "text": text} for text in texts]
    for k, call in enumerate(_given(message, "tool_calls") or ()):
        function = call["function"]
        arguments = tool_arguments_object(
            function["arguments"], param=f"{path}.tool_calls[{k}].function.arguments"
        )
        blocks.append(
            {
                "type": "tool_use",
                "id": tool_use_id(call["id"]),
                "name": function["name"],
                "input": arguments,
            }
        )
    # Its signed thinking first, where Anthropic had it (dropped again if this request does not
    # think: build_body).
    return thinking_blocks(message) + blocks if blocks else blocks


def _tool_result_block(message: Mapping[str, Any]) -> Block:
    block: Block = {"type": "tool_result", "tool_use_id": tool_use_id(message["tool_call_id"])}
    texts = content_texts(_given(message, "content"))
    # An empty result is sent without content: an empty text block would be rejected, and the
    # tool_use still needs its result.
    if len(texts) == 1:
        block["content"] = texts[0]
    elif texts:
        block["content"] = [{"type": "text", "text": text} for text in texts]
    return block


def _tool_results_first(blocks: list[Block]) -> list[Block]:
    # Anthropic wants a user turn's tool_result blocks before any other block in it.
    results = [b for b in blocks if b["type"] == "tool_result"]
    if not results:
        return blocks
    return results + [b for b in blocks if b["type"] != "tool_result"]


def translate_messages(
    messages: list[dict[str, Any]], marks: Mapping[int, Block] | None = None
) -> tuple[list[Block], list[Block]]:
    """OpenAI ``messages`` → Anthropic's ``system`` text blocks and its ``messages``.

    - ``system`` and ``developer`` messages, wherever they stand, become the top-level system
      text, in order (Anthropic has no system role in a conversation).
    - ``tool`` messages become ``tool_result`` blocks of a user turn.
    - Consecutive turns of one role are merged, so roles alternate (tool results after an
      assistant's calls, and a user message after them, make one user turn).
    - Empty texts are dropped (Anthropic rejects them), and a message left with nothing is
      dropped with them.
    - A conversation that opens with the assistant gets a one-character user turn before it
      (:data:`LEADING_USER_TEXT`): Anthropic requires the user to speak first.
    - A conversation that ends with the assistant is sent as is: Anthropic continues that text
      (prefill), and models without prefill answer 400, passed on as an invalid request.

    ``marks``: cache_control breakpoints by message index (the Messages front's, kept for
    Anthropic: ``extras.py``), each put on the last block built from that message.
    """
    system: list[Block] = []
    turns: list[Block] = []
    for i, message in enumerate(messages):
        path = f"messages[{i}]"
        role = message["role"]
        if role in ("system", "developer"):
            texts = [{"type": "text", "text": t} for t in content_texts(message["content"])]
            _mark(texts, marks, i)
            system.extend(texts)
            continue
        if role == "user":
            blocks = _user_blocks(message["content"], path)
        elif role == "assistant":
            blocks = _assistant_blocks(message, path)
        elif role == "tool":
            role, blocks = "user", [_tool_result_block(message)]
        else:
            raise UnsupportedParameter(
                f"{role!r} messages cannot be sent to anthropic; use tool messages",
                param=f"{path}.role",
            )
        if not blocks:
            continue
        _mark(blocks, marks, i)
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    if not turns:
        raise InvalidRequest(
            "anthropic needs at least one user or assistant message with content",
            param="messages",
        )
    for turn in turns:
        if turn["role"] == "user":
            turn["content"] = _tool_results_first(turn["content"])
    if turns[0]["role"] == "assistant":
        turns.insert(0, {"role": "user", "content": [{"type": "text", "text": LEADING_USER_TEXT}]})
    return system, turns


def _mark(blocks: list[Block], marks: Mapping[int, Block] | None, index: int) -> None:
    if marks and index in marks and blocks:
        blocks[-1]["cache_control"] = dict(marks[index])


# --- tools -------------------------------------------------------------------------------------


def translate_tools(tools: list[dict[str, Any]]) -> list[Block]:
    translated = []
    for tool in tools:
        function = tool["function"]
        out: Block = {"name": function["name"]}
        description = _given(function, "description")
        if description:
            out["description"] = description
        # Anthropic requires a schema; OpenAI lets a function without parameters stand for
        # one that takes none.
        out["input_schema"] = _given(function, "parameters") or {"type": "object", "properties": {}}
        if _given(function, "strict") is True:
            out["strict"] = True
        translated.append(out)
    return translated


def translate_tool_choice(body: Mapping[str, Any], *, thinking: bool) -> Block | None:
    """OpenAI's ``tool_choice`` and ``parallel_tool_calls`` → Anthropic's ``tool_choice``.

    With thinking on, Anthropic refuses a forced tool: ``required`` and a named function
    become ``auto`` (the model may then answer without calling).
    """
    choice = _given(body, "tool_choice")
    serial = _given(body, "parallel_tool_calls") is False
    out: Block
    if choice == "none":
        # disable_parallel_tool_use has no meaning (and no place) in "none".
        return {"type": "none"}
    if choice is None:
        if not serial:
            return None
        out = {"type": "auto"}
    elif choice == "auto":
        out = {"type": "auto"}
    elif choice == "required":
        out = {"type": "any"}
    else:
        out = {"type": "tool", "name": choice["function"]["name"]}
    if thinking and out["type"] != "auto":
        out = {"type": "auto"}
    if serial:
        out["disable_parallel_tool_use"] = True
    return out


# --- the body ----------------------------------------------------------------------------------


def anthropic_stop_sequences(stop: object) -> list[str]:
    """OpenAI's ``stop`` as Anthropic takes it. Anthropic refuses a stop sequence with no
    non-whitespace character (``stop_sequences: each stop sequence must contain
    non-whitespace``), so those are dropped: ``"\\n"`` (a common "one line only") no longer
    stops the answer, which is documented, rather than the whole request failing."""
    return [s for s in stop_sequences(stop) if s.strip()]


def requested_max_tokens(body: Mapping[str, Any], provider: ProviderConfig) -> int:
    """The ``max_tokens`` to send: the client's limit (``max_completion_tokens``, else
    ``max_tokens``), else ``provider.default_max_tokens`` (Anthropic requires one), never past
    the model's output cap (``output_caps.py``): Anthropic refuses a larger one, and a model
    cannot write more anyway. ``body`` is the client's, with ``strip_fields`` removed."""
    limit = client_output_limit(body, provider)
    wanted = provider.default_max_tokens if limit is None else limit
    return min(wanted, model_output_cap(provider))


def in_tool_loop(messages: list[Block]) -> bool:
    """The last assistant turn called tools: the model is mid tool loop.

    With thinking on, Anthropic wants that turn to open with its thinking block, signed (``a
    final assistant message must start with a thinking block``). An OpenAI conversation
    carries them only as ``reasoning_details`` (:func:`reasoning.resumes_thinking`); without
    them such a request cannot think."""
    for turn in reversed(messages):
        if turn["role"] == "assistant":
            return any(block["type"] == "tool_use" for block in turn["content"])
    return False


def thinking_config(
    reasoning: bool | None, effort: str | None, provider: ProviderConfig, max_tokens: int
) -> Block | None:
    """The ``thinking`` field to send with ``max_tokens``.

    Reasoning on: ``{"type": "enabled", "budget_tokens": B}``, B from ``reasoning_effort``
    (``translate.EFFORT_BUDGET_TOKENS``; ``medium`` when none is given). Anthropic counts
    thinking inside ``max_tokens``, as OpenAI counts reasoning inside ``max_completion_tokens``,
    and wants 1024 <= B < max_tokens: so B comes out of the limit (at most ``max_tokens - 1``),
    never on top of it, and a limit too small for 1024 thinking tokens turns thinking off.

    Reasoning off: ``{"type": "disabled"}`` for a provider configured with the ``reasoning``
    capability (a model that may think by default must be told not to); omitted otherwise, so
    a model that cannot think is never sent a thinking field. Not said: omitted (the model's
    default).
    """
    if reasoning:
        budget = min(budget_for(effort), max_tokens - 1)
        if budget >= MIN_THINKING_BUDGET:
            return {"type": "enabled", "budget_tokens": budget}
        reasoning = False
    if reasoning is False and Capability.REASONING in provider.capabilities:
        return {"type": "disabled"}
    return None


def _sampling(body: Mapping[str, Any], out: dict[str, Any], *, thinking: bool) -> None:
    temperature = _given(body, "temperature")
    # Anthropic's temperature runs 0..1, OpenAI's 0..2. Clamped, not scaled: over 0..1 both
    # mean the same softmax temperature, which is where nearly every client sets it; scaling
    # would make a client's 0.7 into 0.35. With thinking on, only 1 (or unset) is accepted.
    if temperature is not None and not thinking:
        out["temperature"] = min(float(temperature), 1.0)
    top_p = _given(body, "top_p")
    if top_p is not None:
        out["top_p"] = max(float(top_p), THINKING_MIN_TOP_P) if thinking else top_p
    top_k = _given(body, "top_k")
    if top_k is not None and not thinking:
        if type(top_k) is not int or top_k < -1:
            raise InvalidRequest("'top_k' must be a positive integer, or -1 for off", param="top_k")
        if top_k > 0:
            out["top_k"] = top_k


def _output_config(body: Mapping[str, Any]) -> Block | None:
    response_format = _given(body, "response_format")
    if response_format is None or response_format["type"] == "text":
        return None
    if response_format["type"] == "json_object":
        # Anthropic constrains output to a schema only: dropped, the answer would be free text
        # where the client asked for JSON.
        raise UnsupportedParameter(
            "anthropic has no JSON mode without a schema: 'response_format' of type "
            "'json_object' cannot be sent to it; give a json_schema with its schema",
            param="response_format",
        )
    schema = _given(response_format["json_schema"], "schema")
    if schema is None:
        raise InvalidRequest(
            "anthropic needs the JSON schema itself to constrain the output",
            param="response_format.json_schema.schema",
        )
    return {"format": {"type": "json_schema", "schema": schema}}


def build_body(request: ChatRequest, provider: ProviderConfig) -> dict[str, Any]:
    """The Anthropic Messages body for ``request``, always streamed."""
    strip = frozenset(provider.strip_fields)
    body = {k: v for k, v in request.body.items() if k not in strip}
    for key in sorted(REFUSED_FIELDS):
        if _given(body, key) is not None:
            raise UnsupportedParameter(f"{key!r} cannot be sent to anthropic", param=key)
    if "audio" in (_given(body, "modalities") or ()):
        raise UnsupportedParameter("anthropic cannot answer with audio", param="modalities")

    extras = read_extras(request.body)
    system, messages = translate_messages(body["messages"], extras.messages)
    reasoning = request.reasoning
    if reasoning and in_tool_loop(messages) and not resumes_thinking(messages):
        # Without its signed thinking the turn cannot think: reasoning resumes with the next
        # user turn; this step of the loop answers unthinking rather than not at all.
        reasoning = False
    max_tokens = requested_max_tokens(body, provider)
    thinking = thinking_config(reasoning, _given(body, "reasoning_effort"), provider, max_tokens)
    thinking_on = thinking is not None and thinking["type"] == "enabled"
    if not thinking_on:
        messages = without_thinking(messages)
    out: dict[str, Any] = {"model": provider.model, "max_tokens": max_tokens}
    if system:
        out["system"] = system
    out["messages"] = messages
    tools = _given(body, "tools")
    if tools:
        out["tools"] = translate_tools(tools)
        mark_tools(out["tools"], extras)
        tool_choice = translate_tool_choice(body, thinking=thinking_on)
        if tool_choice is not None:
            out["tool_choice"] = tool_choice
    if thinking is not None:
        out["thinking"] = thinking
    _sampling(body, out, thinking=thinking_on)
    stops = anthropic_stop_sequences(_given(body, "stop"))
    if stops:
        out["stop_sequences"] = stops
    user = _given(body, "user") or _given(body, "safety_identifier")
    if user:
        out["metadata"] = {"user_id": user}
    output_config = _output_config(body)
    if output_config is not None:
        out["output_config"] = output_config
    out.update(extras_fields(extras, thinking_on=thinking_on))
    out["stream"] = True
    return out
