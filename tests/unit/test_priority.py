"""Where a request's priority comes from (the key, the alias, x-priority, the body's
``priority``), what the config and the keys file accept, and what goes to vLLM."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from trio_gateway.cli.keys import keys_main
from trio_gateway.config.load import parse_config
from trio_gateway.config.schema import AliasConfig, ConfigError, ProviderConfig
from trio_gateway.core.errors import InvalidRequest
from trio_gateway.core.keys import ApiKey, KeysFileError, parse_keys
from trio_gateway.core.priority import effective_priority
from trio_gateway.core.request import validate_chat_body
from trio_gateway.fronts.auth import prioritize
from trio_gateway.providers.openai_compatible.dialect import (
    build_body,
    build_completions_body,
    build_embeddings_body,
)

DIGEST = hashlib.sha256(b"k").hexdigest()
VLLM = ProviderConfig(name="v", type="openai_compatible", model="m", base_url="http://v/v1")
ALIASES = {
    "plain": AliasConfig(providers=(VLLM,)),
    "batch": AliasConfig(providers=(VLLM,), priority=10),
}


def chat(alias: str = "plain", **extra: object) -> dict[str, object]:
    return {"model": alias, "messages": [{"role": "user", "content": "hi"}], **extra}


def key(priority: int | None) -> ApiKey:
    line = "" if priority is None else f"priority = {priority}\n"
    [found] = parse_keys(f'[keys.alice]\nsha256 = "{DIGEST}"\n{line}')
    return found


@pytest.mark.parametrize(
    ("own", "header", "body", "expected"),
    [
        (0, None, None, 0),
        (3, None, None, 3),
        (0, "5", None, 5),
        (0, " +5 ", None, 5),
        (0, None, 7, 7),
        (0, "5", 7, 7),  # both asked: the larger number, the lower priority
        (2, "2", None, 2),
        (-4, "-1", None, -1),
    ],
)
def test_a_client_may_lower_its_priority(
    own: int, header: str | None, body: object, expected: int
) -> None:
    assert effective_priority(own, "key 'alice'", header, body) == expected


@pytest.mark.parametrize(
    ("own", "header", "body", "param", "words"),
    [
        (0, "-1", None, "x-priority", "x-priority -1 would put this request before its own"),
        (5, "4", None, "x-priority", "its own priority 5 (key 'alice')"),
        (5, None, 0, "priority", "priority 0 would put this request before"),
        (0, "high", None, "x-priority", "x-priority must be an integer from"),
        (0, "1.5", None, "x-priority", "x-priority must be an integer"),
        (0, "99999999999", None, "x-priority", "x-priority must be an integer"),
        (0, None, "1", "priority", "'priority' must be an integer"),
        (0, None, True, "priority", "'priority' must be an integer"),
        (0, None, 2**40, "priority", "'priority' must be an integer"),
    ],
)
def test_a_higher_priority_or_a_malformed_one_is_refused(
    own: int, header: str | None, body: object, param: str, words: str
) -> None:
    with pytest.raises(InvalidRequest) as info:
        effective_priority(own, "key 'alice'", header, body)
    assert info.value.param == param
    assert words in info.value.message
    assert info.value.status == 400


def test_the_keys_priority_wins_over_the_alias_and_the_alias_is_the_default() -> None:
    request = validate_chat_body(chat("batch"))
    assert prioritize(request, None, ALIASES).priority == 10
    assert prioritize(request, key(None), ALIASES).priority == 10
    assert prioritize(request, key(1), ALIASES).priority == 1
    assert prioritize(validate_chat_body(chat()), None, ALIASES).priority == 0
    lowered = prioritize(request, key(1), ALIASES, header="4")
    assert lowered.priority == 4
    with pytest.raises(InvalidRequest, match=r"its own priority 10 \(alias 'batch'\)"):
        prioritize(request, None, ALIASES, header="9")
    from_body = validate_chat_body(chat("batch", priority=12))
    assert prioritize(from_body, None, ALIASES).priority == 12


def test_the_keys_file_takes_a_priority() -> None:
    assert key(-3).priority == -3
    assert key(None).priority is None
    for bad, kind in (('"1"', "'1'"), ("1.5", "1.5"), ("true", "True"), ("4294967296", "")):
        with pytest.raises(KeysFileError) as info:
            parse_keys(f'[keys.alice]\nsha256 = "{DIGEST}"\npriority = {bad}\n')
        assert info.value.problems == [
            f"keys.alice.priority: must be an integer from -2147483648 to 2147483647, got {kind}"
            if kind
            else "keys.alice.priority: must be an integer from -2147483648 to 2147483647, "
            "got 4294967296"
        ]


CONFIG = """
[aliases.a]
{alias}
[[aliases.a.providers]]
name = "p"
type = "{kind}"
model = "m"
{provider}
"""


def config_problems(alias: str = "", provider: str = "", kind: str = "openai_compatible") -> str:
    text = CONFIG.format(alias=alias, provider=provider, kind=kind)
    if kind == "openai_compatible":
        text += 'base_url = "http://v/v1"\n'
    else:
        text += 'api_key_env = "K"\n'
    try:
        parse_config(text, environ={"K": "k"})
    except ConfigError as exc:
        return "\n".join(exc.problems)
    return ""


def test_the_config_reads_priorities_and_refuses_what_has_no_meaning() -> None:
    assert (
        config_problems("priority = 5\npriority_aging_s = 0.5", "priority_scheduling = true") == ""
    )
    config = parse_config(
        CONFIG.format(
            alias="priority = 5", provider="priority_scheduling = true", kind="openai_compatible"
        )
        + 'base_url = "http://v/v1"\n'
    )
    alias = config.aliases["a"]
    assert (alias.priority, alias.priority_aging_s) == (5, 2.0)
    assert alias.providers[0].priority_scheduling
    assert "aliases.a.priority_aging_s: must be greater than 0" in config_problems(
        "priority_aging_s = 0"
    )
    assert "aliases.a.priority: must be an integer from" in config_problems("priority = 2147483648")
    for kind in ("openai", "anthropic", "gemini"):
        assert (
            "aliases.a.providers[0].priority_scheduling: only for type 'openai_compatible' "
            f"(vLLM's `priority` field); type '{kind}' has no per-request priority"
        ) in config_problems(provider="priority_scheduling = true", kind=kind)


def test_vllm_gets_the_requests_priority_only_with_priority_scheduling() -> None:
    scheduled = ProviderConfig(
        name="v", type="openai_compatible", model="m", base_url="http://v/v1",
        priority_scheduling=True,
    )  # fmt: skip
    request = prioritize(validate_chat_body(chat(priority=3)), None, ALIASES)
    assert request.priority == 3
    # The client's own field is the gateway's to read, never sent as it came.
    assert "priority" not in build_body(request, VLLM)
    assert build_body(request, scheduled)["priority"] == 3
    assert build_completions_body(request, scheduled)["priority"] == 3
    assert build_embeddings_body(request, scheduled)["priority"] == 3
    plain = validate_chat_body(chat())
    assert build_body(plain, scheduled)["priority"] == 0


def test_keys_new_writes_a_priority_and_keys_list_shows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys_file = tmp_path / "keys.toml"
    assert keys_main(["new", "batch", "--keys-file", str(keys_file), "--priority", "5"]) == 0
    assert keys_main(["new", "plain", "--keys-file", str(keys_file)]) == 0
    made = capsys.readouterr().out
    assert "(aliases: all; rpm: -; tpm: -; budget: -; priority: 5)" in made
    ring = {k.name: k.priority for k in parse_keys(keys_file.read_text())}
    assert ring == {"batch": 5, "plain": None}
    assert keys_main(["list", "--keys-file", str(keys_file)]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed == [
        "batch  (aliases: all; rpm: -; tpm: -; budget: -; priority: 5)",
        "plain  (aliases: all; rpm: -; tpm: -; budget: -)",
    ]
    with pytest.raises(SystemExit):
        keys_main(["new", "x", "--keys-file", str(keys_file), "--priority", "first"])
