"""Where a provider's credential comes from (``providers/credentials.py``): each source, and the
message of each way it cannot be read (it names the place, never the value).

Written for mutation testing (docs/testing.md): the config tests that also reach these are not
in the mutation selection.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.test_vertex_auth import KEY_FILE
from trio_gateway.config.schema import ProviderConfig, Secret
from trio_gateway.providers.credentials import CredentialError, credential_source, read_key_file
from trio_gateway.providers.gemini.vertex_auth import ServiceAccountTokens, StaticToken


def provider(**fields: Any) -> ProviderConfig:
    return ProviderConfig(
        name="p", type="vertex", model="m", project="x", location="global", **fields
    )


CLIENT = httpx.AsyncClient()


def test_a_key_file_is_read_and_stripped(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text("  sk-1\n", encoding="utf-8")
    assert read_key_file(str(path)) == Secret("sk-1")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read {path}: No such file or directory"),
        (b"\xff\xfe", "cannot read {path}: not UTF-8 text"),
        (b" \n", "{path} is empty"),
    ],
)
def test_a_key_file_that_cannot_be_read(
    tmp_path: Path, content: bytes | None, message: str
) -> None:
    path = tmp_path / "key"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CredentialError) as caught:
        read_key_file(str(path))
    assert str(caught.value) == message.format(path=path)


async def test_each_source_in_its_order(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("from-file", encoding="utf-8")
    account = tmp_path / "sa.json"
    account.write_text(json.dumps(KEY_FILE), encoding="utf-8")
    keys = {"p": Secret("from-env")}

    assert credential_source(provider(), {}, CLIENT) is None
    source = credential_source(provider(), keys, CLIENT)
    assert isinstance(source, StaticToken)
    assert await source.token() == "from-env"
    source = credential_source(provider(api_key_file=str(key)), keys, CLIENT)
    assert isinstance(source, StaticToken)
    assert await source.token() == "from-file"
    source = credential_source(
        provider(credentials_file=str(account), api_key_file=str(key)), keys, CLIENT
    )
    assert isinstance(source, ServiceAccountTokens)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read {path}: No such file or directory"),
        (b"\xff\xfe", "cannot read {path}: not UTF-8"),
        (b"[]", "{path}: not a JSON service-account key file"),
    ],
)
def test_a_service_account_file_that_cannot_be_read(
    tmp_path: Path, content: bytes | None, message: str
) -> None:
    path = tmp_path / "sa.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CredentialError) as caught:
        credential_source(provider(credentials_file=str(path)), {}, CLIENT)
    assert str(caught.value) == message.format(path=path)
