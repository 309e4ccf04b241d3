"""The conversation every client of this tier has with the simulator, and the gateway's known
faults it runs into (issue 40), as the marks of the tests that fail today because of them.

The user's message holds the simulator's script: think, then call ``weather`` for Paris. The
tool's output holds the script of the answer (the simulator reads a script in a tool result
that ends the conversation), so the final text can only come from the tool's result having
gone back to the model."""

from __future__ import annotations

import pytest

from tests.e2e.harness import script

TOOL = "weather"
CITY = "Paris"
THOUGHT = "I should look it up"
AFTER_TOOL = "the tool said"
ANSWER = "It is sunny in Paris, says the tool"
CALL = script({"reasoning": THOUGHT}, {"tool_call": {"name": TOOL, "arguments": {"city": CITY}}})
TOOL_OUTPUT = "sunny, 24 degrees " + script({"reasoning": AFTER_TOOL}, {"text": ANSWER})
# Two calls in one turn (the simulator streams them one after the other: index 0, then 1).
OTHER_CITY = "Rome"
# The two calls' fragments interleaved (index 0, 1, 0, 1 …), as the Chat Completions stream
# allows (issue 40 item 2): each front must still give each call whole, in order.
TWO_CALLS = script(
    {"reasoning": THOUGHT},
    {
        "tool_calls": [
            {"name": TOOL, "arguments": {"city": CITY}},
            {"name": TOOL, "arguments": {"city": OTHER_CITY}},
        ],
        "interleave": True,
    },
)
# A chat of two turns, no tools.
FIRST = script({"reasoning": "a greeting"}, {"text": "Hello there"})
SECOND = script({"reasoning": "a second answer"}, {"text": "Hello again"})
# Reasoning an output filter holds a letter of back ("p" may begin "project-falcon"), then a call.
HELD_THOUGHT = "look up"
HELD = script(
    {"reasoning": HELD_THOUGHT}, {"tool_call": {"name": TOOL, "arguments": {"city": CITY}}}
)

ITEM_3 = pytest.mark.xfail(
    strict=True,
    reason="issue 40 item 3: the output filter releases the held-back reasoning after the "
    "tool_use block",
)
