"""``trio-gateway keys`` as an operator runs it: the keys file and the aliases come from the
gateway's own config, so a key the gateway would refuse is never written."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.e2e.test_cli import CLI, REPO


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=30, cwd=cwd)


def keyed_config(folder: Path) -> Path:
    """The starter config with keys required, from ``keys.toml`` next to it."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "gateway.toml"
    text = (REPO / "gateway.toml").read_text()
    config.write_text(text.replace("open = true", 'keys_file = "keys.toml"'))
    return config


def test_keys_new_refuses_an_alias_the_config_does_not_have(tmp_path: Path) -> None:
    keyed_config(tmp_path)
    keys = tmp_path / "keys.toml"
    made = run(
        "keys", "new", "bob", "--keys-file", "keys.toml", "--aliases", "agent-max", cwd=tmp_path
    )
    assert made.returncode == 2, made.stdout
    assert (
        "--aliases: unknown alias 'agent-max' (known in gateway.toml: agent-lite, prompt-enhance)"
    ) in made.stderr
    assert "nothing written" in made.stderr
    assert made.stdout == "" and not keys.exists()
    # The aliases the config has are taken, and the gateway's own check accepts the file.
    made = run(
        "keys", "new", "bob", "--keys-file", "keys.toml", "--aliases", "agent-lite", cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr
    assert 'aliases = ["agent-lite"]' in keys.read_text()
    assert run("check", cwd=tmp_path).returncode == 0


def test_keys_new_checks_against_the_config_it_is_given(tmp_path: Path) -> None:
    config = keyed_config(tmp_path / "etc")
    elsewhere = tmp_path / "home"
    elsewhere.mkdir()
    refused = run(
        "keys", "new", "bob", "--config", str(config), "--aliases", "a,agent-max", cwd=elsewhere
    )
    assert refused.returncode == 2
    assert "unknown aliases 'a', 'agent-max'" in refused.stderr
    # No --keys-file: the config's keys_file, read from the config's directory.
    made = run(
        "keys", "new", "bob", "--config", str(config), "--aliases", "prompt-enhance", cwd=elsewhere
    )
    assert made.returncode == 0, made.stderr
    assert f"created key 'bob' in {config.parent / 'keys.toml'}" in made.stdout
    assert (config.parent / "keys.toml").is_file() and not (elsewhere / "keys.toml").exists()


def test_keys_new_with_aliases_and_no_config_asks_for_one(tmp_path: Path) -> None:
    made = run(
        "keys", "new", "bob", "--keys-file", "keys.toml", "--aliases", "agent-lite", cwd=tmp_path
    )
    assert made.returncode == 2
    assert "no gateway.toml here to check them against; give --config FILE" in made.stderr
    assert not (tmp_path / "keys.toml").exists()
    # Without --aliases (every alias) there is nothing to check.
    assert run("keys", "new", "bob", "--keys-file", "keys.toml", cwd=tmp_path).returncode == 0


def test_keys_list_reads_the_keys_file_the_config_names(tmp_path: Path) -> None:
    keyed_config(tmp_path)
    assert run("keys", "new", "alice", cwd=tmp_path).returncode == 0
    listed = run("keys", "list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == ["alice  (aliases: all; rpm: -; tpm: -; budget: -)"]
    # Neither a keys file nor a config that names one: said, with what to give.
    bare = tmp_path / "bare"
    bare.mkdir()
    nothing = run("keys", "list", cwd=bare)
    assert nothing.returncode == 2
    assert "no gateway.toml here; give --keys-file PATH" in nothing.stderr
    (bare / "gateway.toml").write_text((REPO / "gateway.toml").read_text())
    open_config = run("keys", "list", cwd=bare)
    assert open_config.returncode == 2
    assert "gateway.toml has no [auth] keys_file; give --keys-file PATH" in open_config.stderr


def test_a_config_is_read_only_when_something_needs_it(tmp_path: Path) -> None:
    (tmp_path / "gateway.toml").write_text("[server\n")  # not TOML
    assert run("keys", "new", "bob", "--keys-file", "k.toml", cwd=tmp_path).returncode == 0
    assert run("keys", "list", "--keys-file", "k.toml", cwd=tmp_path).returncode == 0
    checked = run("keys", "new", "eve", "--keys-file", "k.toml", "--aliases", "a", cwd=tmp_path)
    assert checked.returncode == 2
    assert "gateway.toml: not valid TOML" in checked.stderr


def test_keys_new_takes_a_budget_period_and_the_admin_mark(tmp_path: Path) -> None:
    keyed_config(tmp_path)
    alone = run("keys", "new", "eve", "--budget-period", "day", cwd=tmp_path)
    assert alone.returncode == 2
    assert "--budget-period needs --budget" in alone.stderr
    assert not (tmp_path / "keys.toml").exists()
    made = run(
        "keys", "new", "ops", "--budget", "2", "--budget-period", "week", "--admin", cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr
    assert "(aliases: all; rpm: -; tpm: -; budget: 2; period: week; admin)" in made.stdout
    assert (
        'budget = 2.0\nbudget_period = "week"\nadmin = true\n'
        in (tmp_path / "keys.toml").read_text()
    )
    listed = run("keys", "list", cwd=tmp_path)
    assert listed.stdout.splitlines()[0].startswith("spend: from the usage ledger ")
    assert "; spent: 0.000000; remaining: 2.000000)" in listed.stdout
