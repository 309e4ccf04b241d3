"""``check``, ``init`` and ``serve`` on what a new operator does in the first hour: a config in
another directory, the starter file edited in one place, a key that no longer does anything,
``--listen`` on a busy port, a directory given to ``init``."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from bench.processes import free_port

from tests.e2e.test_cli import CLI, REPO, default_config_on_free_ports
from trio_gateway.config.load import load_config


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=30, cwd=cwd)


def config_with_files(folder: Path) -> Path:
    """The starter config naming a keys file and a credential file, both by relative paths."""
    folder.mkdir(parents=True)
    text = (REPO / "gateway.toml").read_text()
    text = text.replace("open = true", 'keys_file = "keys.toml"')
    text = text.replace(
        'model = "qwen3-32b"  ', 'api_key_file = "secrets/vllm.key"\nmodel = "qwen3-32b"  '
    )
    text += '\n[usage]\nledger = "data/usage.sqlite3"\n'
    config = folder / "gateway.toml"
    config.write_text(text)
    return config


def test_relative_paths_are_read_from_the_config_file_s_directory(tmp_path: Path) -> None:
    config = config_with_files(tmp_path / "etc")
    (config.parent / "keys.toml").write_text("")
    (config.parent / "secrets").mkdir()
    (config.parent / "secrets" / "vllm.key").write_text("sim-key\n")
    elsewhere = tmp_path / "home"
    elsewhere.mkdir()
    checked = run("check", str(config), cwd=elsewhere)
    assert checked.returncode == 0, checked.stderr
    # The same from its own directory, by a relative name.
    assert run("check", "etc/gateway.toml", cwd=tmp_path).returncode == 0
    loaded = load_config(config)
    assert loaded.auth.keys_file == str(config.parent / "keys.toml")
    assert loaded.usage.ledger == str(config.parent / "data" / "usage.sqlite3")
    [provider] = loaded.providers().values()
    assert provider.api_key_file == str(config.parent / "secrets" / "vllm.key")


def test_a_file_the_config_names_is_missing_the_message_says_where_it_looked(
    tmp_path: Path,
) -> None:
    config = config_with_files(tmp_path / "etc")
    checked = run("check", str(config), cwd=tmp_path)
    assert checked.returncode == 2
    folder = config.parent
    assert f"auth.keys_file: {folder}/keys.toml: cannot read: No such file" in checked.stderr
    assert f"api_key_file: cannot read {folder}/secrets/vllm.key: No such file" in checked.stderr


def test_the_starter_config_defines_its_provider_once(tmp_path: Path) -> None:
    starter = tmp_path / "gateway.toml"
    assert run("init", cwd=tmp_path).returncode == 0
    text = starter.read_text()
    assert text.count('name = "vllm-local"') == 1
    # The edit a new operator makes: one place, and both aliases see it.
    starter.write_text(text.replace("max_inflight = 32", "max_inflight = 16", 1))
    checked = run("check", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout == "gateway.toml: ok (2 aliases, 1 provider)\n"
    config = load_config(starter)
    shared = [alias.providers for alias in config.aliases.values()]
    assert [[p.max_inflight for p in providers] for providers in shared] == [[16], [16]]


def test_check_warns_about_a_key_that_does_nothing(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    text = (REPO / "gateway.toml").read_text()
    config.write_text(text.replace("[server]\n", "[server]\nstream_buffer_events = 64\n"))
    checked = run("check", cwd=tmp_path)
    assert checked.returncode == 0
    assert checked.stderr == (
        "gateway.toml: warning: server.stream_buffer_events: has no effect: answers go to the "
        "client as they come, with no buffer of the gateway's own; remove it "
        "(docs/configuration.md)\n"
    )


def test_a_busy_listen_address_says_it_came_from_the_command_line(tmp_path: Path) -> None:
    config, _ = default_config_on_free_ports(tmp_path)
    port = free_port()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        result = run(
            "serve", "--config", str(config), "--listen", f"127.0.0.1:{port}", cwd=tmp_path
        )
    assert result.returncode == 1
    assert (
        f"cannot serve: cannot listen on 127.0.0.1:{port} (given by --listen): "
        "Address already in use"
    ) in result.stderr
    assert "server.listen" not in result.stderr


def test_init_into_a_directory_writes_its_gateway_toml(tmp_path: Path) -> None:
    folder = tmp_path / "conf"
    folder.mkdir()
    made = run("init", "conf/", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    written = folder / "gateway.toml"
    assert written.read_text() == (REPO / "gateway.toml").read_text()
    # Again: the file in it is kept, and --force replaces that file (not the directory).
    written.write_text("# mine\n")
    again = run("init", "conf", cwd=tmp_path)
    assert again.returncode == 1 and f"{written.relative_to(tmp_path)} exists" in again.stderr
    forced = run("init", "--force", "conf/", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert written.read_text() == (REPO / "gateway.toml").read_text()


def test_check_and_init_say_what_their_argument_is(tmp_path: Path) -> None:
    # argparse wraps its lines to the terminal: compare the words.
    check = " ".join(run("check", "--help", cwd=tmp_path).stdout.split())
    assert "FILE the config file (default: ./gateway.toml)" in check
    init = " ".join(run("init", "--help", cwd=tmp_path).stdout.split())
    assert "PATH the file to write (default: ./gateway.toml); an existing directory gets " in init
