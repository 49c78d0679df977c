"""``edgepop place --out ~/dir``: the outputs go to the expanded folder (not to a literal ./~/dir)."""

from __future__ import annotations

import json

import pytest

from edgepop.cli import main


@pytest.mark.parametrize("form", ["separate", "equals"])
def test_place_out_under_the_home_folder(tmp_path, monkeypatch, capsys, form):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    out = ["--out", "~/dir"] if form == "separate" else ["--out=~/dir"]
    assert main(["place", "--policy", "everywhere-fits", "--rps", "1500", "--json", *out]) == 0
    assert (home / "dir" / "placement.parquet").is_file()
    assert json.loads((home / "dir" / "summary.json").read_text()) == json.loads(capsys.readouterr().out)
    assert not (cwd / "~").exists()


def test_place_writes_both_files_or_neither(tmp_path, monkeypatch, capsys):
    """A failure after placement.parquet leaves no half output; a folder named like an output is the user's: it is
    refused before the work and left as it is, never replaced by the file."""
    import types

    from controlplane.placement import cli as place_cli

    out = tmp_path / "out"
    (out / "summary.json").mkdir(parents=True)
    argv = ["place", "--policy", "everywhere-fits", "--rps", "1500", "--out", str(out)]
    assert main(argv) == 2
    assert "summary.json is a folder, where the command writes a file" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["summary.json"] and (out / "summary.json").is_dir()
    (out / "summary.json").rmdir()
    (out / "summary.json").write_text("earlier")

    def boom(*a, **k):
        raise OSError(28, "No space left on device", str(out / "summary.json"))

    with monkeypatch.context() as m:
        m.setattr(place_cli, "json", types.SimpleNamespace(dumps=boom, loads=json.loads))
        assert main(argv) == 1
    assert "No space left" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and [p.name for p in out.iterdir()] == ["summary.json"]
    assert (out / "summary.json").read_text() == "earlier"
    assert main(argv) == 0
    assert (out / "placement.parquet").is_file() and json.loads((out / "summary.json").read_text())["replicas"] > 0


def test_place_help_says_the_policy_is_required(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["place", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # (argparse wraps the help at the terminal's width)
    assert "--policy NAME required (unless listing)" in text
    assert main(["place"]) == 2
    assert capsys.readouterr().err.startswith("edgepop: error: --policy is required (one of: ")
