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
