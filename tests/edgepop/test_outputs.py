"""Output paths are checked before the work starts: one line naming the path, nothing run, nothing left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgepop.cli import main
from edgepop.errors import UserError
from edgepop.outputs import output_file, output_folder


@pytest.mark.parametrize("staged", [False, True])
def test_a_check_leaves_nothing_behind(tmp_path, staged):
    assert output_folder(tmp_path / "a" / "b", staged=staged) == tmp_path / "a" / "b"
    assert list(tmp_path.iterdir()) == []  # the folders it made to probe are gone again
    (tmp_path / "c").mkdir()
    output_folder(tmp_path / "c", staged=staged)
    assert [p.name for p in tmp_path.iterdir()] == ["c"] and list((tmp_path / "c").iterdir()) == []


@pytest.mark.parametrize("staged", [False, True])
def test_a_file_in_the_way_is_named(tmp_path, staged):
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match=r"--out .*f: exists and is not a folder"):
        output_folder(tmp_path / "f", staged=staged)
    with pytest.raises(UserError, match=r"--out .*f/x/y: .*f is a file, not a folder"):
        output_folder(tmp_path / "f" / "x" / "y", staged=staged)
    assert (tmp_path / "f").read_text() == "x"


def test_output_file(tmp_path):
    assert output_file(tmp_path / "d" / "t.csv", "--table") == tmp_path / "d" / "t.csv"
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(UserError, match=r"--table .*: is a folder, expected a file name"):
        output_file(tmp_path, "--table")


@pytest.mark.parametrize("argv", [
    ["simulate", "--requests", "100"],
    ["sweep", "--grid", "policies"],
    ["ablation"],
    ["frontier"],
    ["validate", "--in-sample"],
    ["topology"],
])
def test_commands_refuse_an_unusable_out_before_working(tmp_path, capsys, argv):
    (tmp_path / "f").write_text("x")
    assert main([*argv, "--out", str(tmp_path / "f" / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is a file, not a folder" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]  # nothing written beside it


def test_an_os_error_is_one_line(monkeypatch, capsys):
    import topology.cli

    def boom(args):
        raise OSError(28, "No space left on device", "/data/out/summary.json")

    monkeypatch.setattr(topology.cli, "run", boom)
    assert main(["topology"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "edgepop: error: [Errno 28] No space left on device: '/data/out/summary.json'"


def test_a_new_output_folder_gets_the_umask_mode_not_the_temporary_folders(tmp_path):
    import os
    import stat
    import tempfile

    from edgepop.outputs import move_into_place

    old = os.umask(0o022)
    try:
        tmp = Path(tempfile.mkdtemp(dir=tmp_path))  # private, as the commands' staging folders are
        (tmp / "summary.json").write_text("{}")
        move_into_place(tmp, tmp_path / "out")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o755


@pytest.mark.parametrize("argv", [["simulate", "--requests", "100"], ["sweep", "--grid", "policies"], ["ablation"],
                                  ["frontier"]])
def test_a_tilde_naming_no_user_is_one_line(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--out", "~nosuchuser-edgepop/x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("edgepop: error: --out ~nosuchuser-edgepop/x: cannot expand '~'") and "\n" not in err
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(UserError, match=r"^--table ~nosuchuser-edgepop/t\.csv: cannot expand '~'"):
        output_file("~nosuchuser-edgepop/t.csv", "--table")
