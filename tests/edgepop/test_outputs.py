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


def _staged(tmp_path, **files) -> Path:
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix=".edgepop-", dir=tmp_path))
    for name, text in files.items():
        if text is None:
            (tmp / name).mkdir()
            (tmp / name / "sweep.json").write_text("{}")
        else:
            (tmp / name).write_text(text)
    return tmp


def test_a_users_folder_named_like_an_output_file_is_never_deleted(tmp_path):
    """A produced file never replaces a folder: nothing is moved, the user's folder stays, and the finished results
    are kept beside ``out`` under a name the error gives."""
    from edgepop.outputs import staged_output

    out = tmp_path / "out"
    (out / "summary.json").mkdir(parents=True)
    (out / "summary.json" / "mine.txt").write_text("keep me")
    (out / "report.md").write_text("earlier")
    with pytest.raises(UserError) as err:
        with staged_output(out, {"summary.json", "report.md"}) as tmp:
            (tmp / "report.md").write_text("new")
            (tmp / "summary.json").write_text("{}")
    kept = tmp_path / "out.edgepop-results-1"
    assert str(err.value) == (f"{out / 'summary.json'}: is a folder, where this run writes a file; nothing was "
                              f"moved into {out}: the results are in {kept}")
    assert (out / "summary.json" / "mine.txt").read_text() == "keep me"
    assert (out / "report.md").read_text() == "earlier"  # every conflict is found before anything moves
    assert sorted(p.name for p in kept.iterdir()) == ["report.md", "summary.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "out.edgepop-results-1"]
    with pytest.raises(UserError, match=r"results are in .*out\.edgepop-results-2$"):  # a second one: a new name
        with staged_output(out, {"summary.json"}) as tmp:
            (tmp / "summary.json").write_text("{}")


def test_folders_replace_only_an_earlier_runs_folder(tmp_path):
    """A produced folder replaces an earlier run's folder of an owned name (``name/marker``: it holds the marker),
    never a user's file or a folder that is not an earlier run's; an earlier run's folder not produced again goes."""
    from edgepop.outputs import move_into_place

    out = tmp_path / "out"
    (out / "sensitivity").mkdir(parents=True)
    (out / "sensitivity" / "sweep.json").write_text("old")
    (out / "replicates").mkdir()
    (out / "replicates" / "sweep.json").write_text("old")
    owned = {"summary.json", "sensitivity/sweep.json", "replicates/sweep.json"}
    move_into_place(_staged(tmp_path, **{"summary.json": "{}", "sensitivity": None}), out, owned)
    assert sorted(p.name for p in out.iterdir()) == ["sensitivity", "summary.json"]
    assert (out / "sensitivity" / "sweep.json").read_text() == "{}"

    (out / "replicates").mkdir()
    (out / "replicates" / "notes.txt").write_text("mine")  # no sweep.json: the user's folder
    (out / "extra").write_text("mine")
    for name, why in (("replicates", r"is a folder that is not an earlier run's \(no sweep\.json\)"),
                      ("extra", "is a file")):
        with pytest.raises(UserError, match=f"{name}: {why}, where this run writes a folder; nothing was moved"):
            move_into_place(_staged(tmp_path, **{"summary.json": "[]", name: None}), out, owned)
        assert (out / "summary.json").read_text() == "{}"
    assert (out / "replicates" / "notes.txt").read_text() == "mine" and (out / "extra").read_text() == "mine"
    move_into_place(_staged(tmp_path, **{"summary.json": "[]"}), out, owned)  # a user's folder is not stale
    assert (out / "replicates" / "notes.txt").read_text() == "mine" and not (out / "sensitivity").exists()


def test_output_folder_refuses_a_wrong_kind_up_front(tmp_path):
    (tmp_path / "out" / "summary.json").mkdir(parents=True)
    (tmp_path / "out" / "sensitivity").write_text("x")
    with pytest.raises(UserError, match=r"^--out .*out: .*summary\.json is a folder, where the command writes a "
                                        r"file \(move it away or choose another --out\)$"):
        output_folder(tmp_path / "out", staged=True, writes={"report.md", "summary.json"})
    with pytest.raises(UserError, match=r"sensitivity is a file, where the command writes a folder"):
        output_folder(tmp_path / "out", staged=True, writes={"sensitivity/sweep.json"})
    (tmp_path / "out" / "replicates").mkdir()
    with pytest.raises(UserError, match=r"replicates is a folder that is not an earlier run's \(no sweep\.json\)"):
        output_folder(tmp_path / "out", staged=True, writes={"replicates/sweep.json"})
    (tmp_path / "out" / "replicates" / "sweep.json").write_text("{}")
    output_folder(tmp_path / "out", staged=True, writes={"report.md", "replicates/sweep.json"})


@pytest.mark.parametrize("argv", [["simulate", "--requests", "100"], ["topology"], ["sweep", "--grid", "policies"],
                                  ["ablation"], ["frontier"], ["place", "--policy", "greedy-demand"]])
def test_commands_refuse_a_folder_named_like_their_output_before_working(tmp_path, capsys, argv):
    from sim.frontier import FRONTIER_OUTPUTS
    from sim.outputs import OUTPUT_NAMES
    from sim.sweep import SWEEP_OUTPUTS

    name = sorted({"simulate": OUTPUT_NAMES, "topology": {"summary.json"}, "sweep": SWEEP_OUTPUTS,
                   "ablation": SWEEP_OUTPUTS, "frontier": FRONTIER_OUTPUTS, "place": {"summary.json"}}[argv[0]])[0]
    (tmp_path / "out" / name).mkdir(parents=True)
    (tmp_path / "out" / name / "mine.txt").write_text("keep me")
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{name} is a folder, where the command writes a file" in err, err
    assert (tmp_path / "out" / name / "mine.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [name]
