"""A budget that nothing can spend: every provider its key's aliases reach is free (prices
default to 0). `check` and the start-up log warn of it."""

from __future__ import annotations

from pathlib import Path

from trio_gateway.config.load import parse_config
from trio_gateway.core.keys import hash_key

CONFIG = """
[server]
listen = "127.0.0.1:8080"
[auth]
keys_file = "{keys}"
[aliases.free]
[[aliases.free.providers]]
name = "vllm"
type = "openai_compatible"
base_url = "http://127.0.0.1:8001/v1"
model = "m"
[aliases.paid]
[[aliases.paid.providers]]
name = "vllm-again"
type = "openai_compatible"
base_url = "http://127.0.0.1:8002/v1"
model = "m"
price_cached_input_per_mtok = 0.1
"""


def warnings_for(tmp_path: Path, keys: str) -> list[str]:
    path = tmp_path / "keys.toml"
    path.write_text(keys)
    config = parse_config(CONFIG.format(keys=path), source="gateway.toml")
    return list(config.warnings)


def key(name: str, extra: str) -> str:
    return f'[keys.{name}]\nsha256 = "{hash_key(name)}"\n{extra}\n'


def test_a_budget_on_free_aliases_only_is_a_warning(tmp_path: Path) -> None:
    found = warnings_for(
        tmp_path,
        key("alice", 'aliases = ["free"]\nbudget = 5.0\nbudget_period = "day"')
        + key("bob", "budget = 5.0")  # every alias: "paid" has a price
        + key("carol", 'aliases = ["paid"]\nbudget = 1.0')
        + key("dave", 'aliases = ["free"]'),  # no budget: nothing to spend
    )
    assert found == [
        f"auth.keys_file: {tmp_path / 'keys.toml'}: keys.alice.budget: 5 a day, but every "
        "provider its aliases reach is free (free: vllm; every price_*_per_mtok is 0): nothing "
        "is ever billed to it; give the providers their prices (docs/accounting.md#budgets)"
    ]


def test_no_warning_once_a_price_is_set(tmp_path: Path) -> None:
    assert warnings_for(tmp_path, key("carol", 'aliases = ["paid"]\nbudget = 1.0')) == []
