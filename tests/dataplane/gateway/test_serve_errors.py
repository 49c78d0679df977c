"""One-line start-up errors of ``edgepop serve`` that name the real cause."""

import socket

import pytest

from dataplane.gateway.auth import load_tokens_file
from dataplane.gateway.cli import check_bindable
from edgepop.errors import UserError


def _free_port() -> str:
    """A port nothing listens on now (these runs stop at a config error; a busy fixed port would fail them first,
    at the bind check, with another message)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_a_tokens_file_whose_account_is_not_a_string_says_so(tmp_path):
    f = tmp_path / "tokens.toml"
    f.write_text('[tokens]\n"tok-alice-0001" = 5\n')
    with pytest.raises(UserError, match=r"token 'tok-'\.\.\.: its account must be a non-empty string, got 5"):
        load_tokens_file(f)
    f.write_text('[tokens]\n"tok" = "alice"\n')
    with pytest.raises(UserError, match="tokens need 8\\+ characters"):
        load_tokens_file(f)


def test_a_host_this_machine_does_not_have_is_not_blamed_on_another_server(monkeypatch):
    import errno

    def refuse(self, addr):  # what bind answers for an address no interface has (a kernel that allows binding
        # non-local addresses would not refuse a real one, so the refusal is staged)
        raise OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")

    monkeypatch.setattr(socket.socket, "bind", refuse)
    with pytest.raises(UserError, match="is it an address of this machine") as err:
        check_bindable("192.0.2.1", 8080)  # TEST-NET-1: documentation addresses, never assigned to a host
    assert "another server" not in str(err.value)


def test_a_port_in_use_names_another_server():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(UserError, match="another server on that port"):
            check_bindable("127.0.0.1", busy.getsockname()[1])


def test_auth_flags_do_not_make_the_files_own_values_command_line_overrides(tmp_path, capsys, monkeypatch):
    from edgepop.cli import main

    bad = tmp_path / "p.toml"
    bad.write_text('pops = ["XXX"]\n')
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[tokens]\n"tok-alice-0001" = "alice"\n')
    for env, args in (("", ["--no-auth"]), ("tok-bob-00000001:bob", []), ("", ["--tokens", str(tokens)])):
        monkeypatch.setenv("EDGEPOP_TOKENS", env)
        assert main(["serve", "--config", str(bad), *args, "--port", _free_port(), "--no-warm"]) == 2, args
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and f"{bad}: field 'pops': unknown PoP id(s) 'XXX'" in lines[0], (args, lines)
    monkeypatch.setenv("EDGEPOP_TOKENS", "")
    assert main(["serve", "--config", str(bad), "--no-auth", "--threads", "1", "--port", _free_port(), "--no-warm"]) == 2
    assert f"{bad} with its command-line overrides: field 'pops'" in capsys.readouterr().err  # a real override


@pytest.mark.parametrize("text, needle", [
    ('[placement]\n"@cf/nope" = ["FRA"]\n', "field 'placement': '@cf/nope' is configured but not listed in 'models'"),
    ('[stand_ins]\n"@cf/nope" = "gpt2-tiny"\n', "field 'stand_ins': '@cf/nope' is configured but not listed"),
    ('[stand_ins]\n"@edgepop/gpt2-tiny" = "nope"\n', "field 'stand_ins': stand-in of '@edgepop/gpt2-tiny'"),
    ('router = "p2c"\nrouter_options = { nope = 1 }\n', "field 'router_options': routing policy 'p2c' has no option"),
    ('autoscaler_options = { nope = 1 }\n', "field 'autoscaler_options': "),
    ('placement_options = { nope = 1 }\n', "field 'placement_options': ")])
def test_config_errors_about_tables_name_the_field(tmp_path, capsys, monkeypatch, text, needle):
    from edgepop.cli import main

    config = tmp_path / "c.toml"
    config.write_text('pops = ["FRA"]\nmodels = ["@edgepop/gpt2-tiny"]\nno_auth = true\n' + text)
    monkeypatch.setenv("EDGEPOP_TOKENS", "")
    assert main(["serve", "--config", str(config), "--port", _free_port(), "--no-warm"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"{config}: {needle}" in lines[0], lines
