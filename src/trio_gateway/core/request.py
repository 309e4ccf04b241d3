"""A client's chat request: validated once at the front, read by routing and providers."""

from __future__ import annotations

from typing import Any

import attrs

from trio_gateway.core.body import CHAT_PARTS, JSONRefused, PartPaths, check_parts, loads
from trio_gateway.core.capability import Capability
from trio_gateway.core.errors import InvalidJSON, InvalidRequest, UnsupportedParameter
from trio_gateway.core.kind import RequestKind
from trio_gateway.core.usage import estimate_body_prompt
from trio_gateway.core.validation import validate_body, within_depth

# Anthropic's own fields the Messages front keeps for an Anthropic provider (cache_control
# breakpoints, context_management, the client's anthropic-beta flags): the Anthropic dialect
# merges them into its request (providers/anthropic/extras.py); every other provider never
# sees them.
ANTHROPIC_EXTRAS = "anthropic_extras"
# Gateway extensions in the request body; never sent to a provider as they are.
GATEWAY_FIELDS = frozenset({"reasoning", "priority", ANTHROPIC_EXTRAS})
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
_NOTHING_REQUIRED: frozenset[Capability] = frozenset()


@attrs.define(kw_only=True)
class ChatRequest:
    """A request to one of the OpenAI endpoints (``kind``; chat unless said otherwise): the
    name is the chat front's, which came first. Not frozen for one reason: ``release_body``."""

    alias: str
    # The parsed body, as validated; empty once released.
    body: dict[str, Any]
    stream: bool
    include_usage: bool
    # None: the provider's default; True/False: the client asked for reasoning on/off.
    reasoning: bool | None
    required: frozenset[Capability]
    # The API key's name (docs/accounting.md), set by the front once the key may use the alias;
    # None when the gateway serves without keys.
    key_name: str | None = None
    # The client's x-session-id header: which conversation this turn belongs to, so replica
    # affinity routing keeps it where its prefix is cached (docs/routing.md).
    session_id: str | None = None
    # The endpoint it came to: how a provider is asked and its answer read.
    kind: RequestKind = RequestKind.CHAT
    # The front that translated it into a chat request (``messages``, ``responses``), for the
    # usage record's ``endpoint``; None: the request's kind names it.
    front: str | None = None
    # The built-in (vendor-run) tools the front dropped from the request, by type (bounded: a
    # type the front knows, or "other"), for the usage record.
    dropped_tools: tuple[str, ...] = ()
    # Its priority class, lower first (core/priority.py): the key's or the alias's, or lower as
    # the client asked. Orders the gateway's queues, and goes to vLLM as its `priority`.
    priority: int = 0
    # The alias's input filters passed it (Router.screen): set where a front scanned it off
    # the event loop, so that planning does not scan it again.
    screened: bool = False
    # The prompt's estimate (usage.estimate_prompt_tokens), taken when the body is released.
    _prompt_estimate: int | None = attrs.field(default=None, init=False, repr=False)

    def release_body(self, provider_type: str | None = None) -> None:
        """Drop the parsed body, keeping the prompt's estimate for the provider (of
        ``provider_type``) whose answer has begun: no other attempt will translate the request,
        and only a usage record cut short reads it again. A long prompt is otherwise held for as
        long as its answer streams, thousands of answers at once."""
        if self._prompt_estimate is None:
            self._prompt_estimate = estimate_body_prompt(self.body, self.kind, (provider_type,))
            self.body = {}

    def prompt_estimate(self) -> int:
        """The prompt's tokens as estimated for a vendor that never counted them."""
        if self._prompt_estimate is not None:
            return self._prompt_estimate
        return estimate_body_prompt(self.body, self.kind)


def _reasoning_switch(body: dict[str, Any]) -> bool | None:
    switch = body.get("reasoning")
    if switch is not None and type(switch) is not bool:
        raise InvalidRequest("'reasoning' must be true or false", param="reasoning")
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise InvalidRequest(
            f"'reasoning_effort' must be one of {', '.join(REASONING_EFFORTS)}; got {effort!r}",
            param="reasoning_effort",
        )
    from_effort = None if effort is None else effort != "none"
    if switch is not None and from_effort is not None and switch != from_effort:
        raise InvalidRequest(
            f"'reasoning': {str(switch).lower()} contradicts 'reasoning_effort': {effort!r}",
            param="reasoning",
        )
    return switch if switch is not None else from_effort


def _has_image(messages: list[dict[str, Any]]) -> bool:
    # Validation admits OpenAI's one image part, "image_url", and refuses any other part type
    # (the Responses API's "input_image", Anthropic's "image"), so no other shape gets here.
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                if part.get("type") == "image_url":
                    return True
    return False


def strict_loads(raw: bytes | str) -> Any:
    """JSON as the RFC has it (:func:`trio_gateway.core.body.loads`): NaN and Infinity, lone
    surrogates, numbers no double or int holds are errors, and so is nesting too deep for the
    parser (a ValueError, not a crash)."""
    return loads(raw)


def parse_chat_request(raw: bytes) -> ChatRequest:
    """Validate a ``/v1/chat/completions`` body; raise a ``RequestError`` saying what is wrong."""
    return validate_chat_body(read_chat_json(raw), depth_known=within_depth(raw))


def read_chat_json(raw: bytes, parts: PartPaths = ()) -> Any:
    """A request body as JSON, not yet validated; :class:`InvalidJSON` when it is not JSON,
    saying where, and :class:`InvalidRequest` past :data:`~trio_gateway.core.body.
    MAX_CONTENT_PARTS` of the arrays at ``parts`` (the front's messages and their parts).
    Every front reads its body here, apart from its validation, to learn the alias it names
    (:func:`requested_alias`) before validation can refuse it."""
    try:
        return loads(raw, parts)
    except JSONRefused as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc}") from None
    except UnicodeDecodeError as exc:
        raise InvalidJSON(f"request body is not UTF-8: {exc.reason} at byte {exc.start}") from None


def requested_alias(body: object) -> str | None:
    """The ``model`` a decoded body names (an object with a non-empty string there), whatever
    else is wrong with it; None otherwise. The caller decides whether it is a known alias."""
    if not isinstance(body, dict):
        return None
    alias = body.get("model")
    return alias if isinstance(alias, str) and alias else None


def validate_chat_body(body: object, *, depth_known: bool = False) -> ChatRequest:
    """Validate a decoded chat body (the WebSocket front's ``body``, already JSON);
    ``depth_known`` as :func:`~trio_gateway.core.validation.validate_body` takes it."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    alias = requested_alias(body)
    if alias is None:
        raise InvalidRequest("'model' must be a non-empty string (an alias)", param="model")
    check_parts(body, CHAT_PARTS)
    # OpenAI's own rules, every field at once: after this, each field read below has its shape.
    validate_body(body, depth_known=depth_known)
    messages: list[dict[str, Any]] = body["messages"]
    # Null is "not given", as at OpenAI.
    stream = body.get("stream") is True
    stream_options = body.get("stream_options") or {}
    include_usage = stream_options.get("include_usage") is True
    # Valid at OpenAI, but the gateway's one event stream carries one choice and no logprobs.
    n = body.get("n")
    if n is not None and n != 1:
        raise UnsupportedParameter("only n=1 is supported", param="n")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise UnsupportedParameter("logprobs are not supported by the gateway", param="logprobs")

    required: set[Capability] = set()
    if body.get("tools"):
        required.add(Capability.TOOLS)
    if _has_image(messages):
        required.add(Capability.VISION)
    response_format = body.get("response_format")
    if response_format is not None and response_format["type"] == "json_schema":
        required.add(Capability.JSON_SCHEMA)
    reasoning = _reasoning_switch(body)
    if reasoning:
        required.add(Capability.REASONING)
    return ChatRequest(
        alias=alias,
        body=body,
        stream=stream,
        include_usage=stream and include_usage,
        reasoning=reasoning,
        # One empty set for all, not one each (thousands of open requests hold theirs).
        required=frozenset(required) if required else _NOTHING_REQUIRED,
    )
