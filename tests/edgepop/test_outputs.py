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

    from edgepop.outputs import mark_folder

    tmp = Path(tempfile.mkdtemp(prefix=".edgepop-", dir=tmp_path))
    for name, text in files.items():
        if text is None:
            (tmp / name).mkdir()
            (tmp / name / "sweep.json").write_text("{}")
            mark_folder(tmp / name, "edgepop simulate --seeds")
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
    from edgepop.outputs import mark_folder, move_into_place

    out = tmp_path / "out"
    for name in ("sensitivity", "replicates"):
        (out / name).mkdir(parents=True)
        (out / name / "sweep.json").write_text("old")
        mark_folder(out / name, "edgepop simulate")
    owned = {"summary.json", "sensitivity/.edgepop-output", "replicates/.edgepop-output"}
    move_into_place(_staged(tmp_path, **{"summary.json": "{}", "sensitivity": None}), out, owned)
    assert sorted(p.name for p in out.iterdir()) == ["sensitivity", "summary.json"]
    assert (out / "sensitivity" / "sweep.json").read_text() == "{}"

    (out / "replicates").mkdir()
    (out / "replicates" / "notes.txt").write_text("mine")  # no marker: the user's folder
    (out / "extra").write_text("mine")
    for name, why in (("replicates", r"is a folder that is not an earlier run's \(no \.edgepop-output\)"),
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
        output_folder(tmp_path / "out", staged=True, writes={"sensitivity/.edgepop-output"})
    (tmp_path / "out" / "replicates").mkdir()
    (tmp_path / "out" / "replicates" / "sweep.json").write_text("{}")  # a sweep's, not a simulate's
    with pytest.raises(UserError, match=r"replicates is a folder that is not an earlier run's "
                                        r"\(no \.edgepop-output\)"):
        output_folder(tmp_path / "out", staged=True, writes={"replicates/.edgepop-output"})
    from edgepop.outputs import mark_folder

    mark_folder(tmp_path / "out" / "replicates", "edgepop simulate --seeds")
    output_folder(tmp_path / "out", staged=True, writes={"report.md", "replicates/.edgepop-output"})


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


@pytest.mark.parametrize("argv", [
    ["simulate", "--scenario", "small", "--requests", "300"],
    ["simulate", "--scenario", "small", "--requests", "300", "--seeds", "1,2"],
    ["sweep", "--grid", "GRID", "--workers", "1"],
    ["frontier", "--scenario", "small", "--requests", "300", "--budgets", "0.001,0.004", "--max-steps", "0",
     "--workers", "1"],
    ["ablation", "--requests", "200", "--workers", "1"],
    ["topology"],
    ["place", "--policy", "everywhere-fits", "--rps", "1500"],
    ["validate", "--in-sample"],
], ids=["simulate", "simulate-seeds", "sweep", "frontier", "ablation", "topology", "place", "validate"])
def test_every_staging_command_writes_a_nested_out_that_does_not_exist(tmp_path, capsys, argv):
    """The check removes the folders it probed; staging creates them again (simulate's extra runs too)."""
    grid = tmp_path / "g.toml"
    grid.write_text('base = "small"\nrequests = 60\ndeployments = ["edge"]\n[axes]\n"slo.ttft_ms" = [200.0]\n')
    argv = [str(grid) if a == "GRID" else a for a in argv]
    assert main([*argv, "--out", str(tmp_path / "t1" / "new" / "sub")]) == 0, capsys.readouterr().err
    assert [p.name for p in (tmp_path / "t1").iterdir()] == ["new"]  # no staging folder left behind
    assert [p.name for p in (tmp_path / "t1" / "new").iterdir()] == ["sub"]
    assert any((tmp_path / "t1" / "new" / "sub").iterdir())


def test_a_users_sweep_folder_is_not_simulates_and_stays(tmp_path, capsys):
    """A folder named like simulate's holding a sweep.json (the user's own `edgepop sweep --out out/sensitivity`)
    is not an earlier simulate's: a plain run leaves it whole, a --sensitivity run refuses it up front."""
    out = tmp_path / "r6"
    (out / "sensitivity").mkdir(parents=True)
    (out / "sensitivity" / "sweep.json").write_text("{}")
    (out / "sensitivity" / "mine.txt").write_text("mine")
    assert main(["simulate", "--scenario", "small", "--requests", "300", "--out", str(out)]) == 0
    assert sorted(p.name for p in (out / "sensitivity").iterdir()) == ["mine.txt", "sweep.json"]
    capsys.readouterr()
    assert main(["simulate", "--scenario", "small", "--requests", "300", "--seeds", "1,2", "--sensitivity",
                 "--out", str(out)]) == 2
    assert "sensitivity is a folder that is not an earlier run's (no .edgepop-output)" in capsys.readouterr().err


def test_an_earlier_runs_folder_holding_a_users_file_is_never_removed(tmp_path):
    """A file the marker does not list is the user's: replacing its folder is a conflict (results kept, the file
    named); a run that writes no such folder removes only the files the marker lists."""
    from edgepop.outputs import OutputConflict, mark_folder, move_into_place, output_folder

    out = tmp_path / "out"
    (out / "replicates").mkdir(parents=True)
    (out / "replicates" / "sweep.json").write_text("old")
    mark_folder(out / "replicates", "edgepop simulate --seeds")
    (out / "replicates" / "notes.txt").write_text("mine")
    owned = {"summary.json", "replicates/.edgepop-output"}
    notes = out / "replicates" / "notes.txt"
    with pytest.raises(UserError, match=f"replicates holds {notes}, which no earlier run wrote, where the command"):
        output_folder(out, staged=True, writes=owned)
    with pytest.raises(OutputConflict, match=f"replicates: holds {notes}, which no earlier run wrote, where this "
                                             "run writes a folder; nothing was moved"):
        move_into_place(_staged(tmp_path, **{"summary.json": "{}", "replicates": None}), out, owned)
    move_into_place(_staged(tmp_path, **{"summary.json": "{}"}), out, owned)
    assert sorted(p.name for p in (out / "replicates").iterdir()) == ["notes.txt"]  # the earlier run's files went
    assert notes.read_text() == "mine"


def test_out_dot_works_on_the_resolved_path(tmp_path, monkeypatch, capsys):
    from edgepop.outputs import staged_output

    (tmp_path / "dot").mkdir()
    monkeypatch.chdir(tmp_path / "dot")
    with staged_output(Path("."), {"summary.json"}) as tmp:
        (tmp / "summary.json").write_text("{}")
    assert (tmp_path / "dot" / "summary.json").read_text() == "{}"
    (tmp_path / "dot" / "report.md").mkdir()
    with pytest.raises(UserError, match=r"nothing was moved into .*dot: the results are in .*dot\.edgepop-results-1"):
        with staged_output(Path("."), {"report.md"}) as tmp:
            (tmp / "report.md").write_text("new")
    (tmp_path / "dot" / "report.md").rmdir()
    (tmp_path / "dot" / "ttft_gain_map.png").mkdir()  # written only by some runs: still refused up front
    assert main(["simulate", "--scenario", "small", "--requests", "300", "--out", "."]) == 2
    assert "ttft_gain_map.png is a folder, where the command writes a file" in capsys.readouterr().err


def test_an_out_folder_whose_parent_takes_no_folder_stages_inside_itself(tmp_path, monkeypatch):
    """``--out .`` in a home folder under a root-owned /home: the parent cannot take the staging folder, so the
    files are staged in a hidden folder inside ``--out`` and moved out of it (refused before, after the work)."""
    from edgepop import outputs

    out = tmp_path / "home"
    out.mkdir()
    (out / "mine.txt").write_text("mine")
    monkeypatch.setattr(outputs, "_can_stage_in", lambda folder: Path(folder) != tmp_path)
    assert outputs.output_folder(out, staged=True) == out
    assert main(["topology", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [".edgepop-runs", "map.png", "mine.txt", "summary.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]
    (out / "summary.json").unlink()
    (out / "summary.json").mkdir()  # a conflict: nothing moves, the results are kept where the message says
    with pytest.raises(outputs.OutputConflict, match=r"the results (not moved )?are in") as e:
        with outputs.staged_output(out, {"summary.json"}) as tmp:
            (tmp / "summary.json").write_text("{}")
    assert (e.value.kept / "summary.json").read_text() == "{}" and (out / "summary.json").is_dir()


def test_a_dangling_link_as_out_is_refused_up_front(tmp_path):
    (tmp_path / "d1").symlink_to("d1target")
    with pytest.raises(UserError, match=r"^--out .*d1: is a link to d1target, which does not exist"):
        output_folder(tmp_path / "d1", staged=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d1"]


def test_a_link_as_out_stages_beside_its_target(tmp_path):
    from edgepop.outputs import staged_output

    (tmp_path / "fs2" / "x").mkdir(parents=True)
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "x1").symlink_to(tmp_path / "fs2" / "x")
    with staged_output(tmp_path / "here" / "x1", {"summary.json"}) as tmp:
        assert tmp.parent == tmp_path / "fs2"  # the target's file system: the move is a rename
        (tmp / "summary.json").write_text("{}")
    assert (tmp_path / "fs2" / "x" / "summary.json").read_text() == "{}"


def test_an_os_error_while_moving_keeps_the_results(tmp_path, monkeypatch):
    from edgepop.outputs import OutputConflict, staged_output

    real_replace = Path.replace

    def cross_device(self, target):
        if Path(target).name == "summary.json":
            raise OSError(18, "Invalid cross-device link")
        return real_replace(self, target)

    (tmp_path / "out").mkdir()
    monkeypatch.setattr(Path, "replace", cross_device)
    with pytest.raises(OutputConflict, match=r"Invalid cross-device link.*the results not moved are in "
                                             r".*out\.edgepop-results-1$") as err:
        with staged_output(tmp_path / "out", {"summary.json"}) as tmp:
            (tmp / "summary.json").write_text("{}")
    assert (err.value.kept / "summary.json").read_text() == "{}"


def test_a_command_does_not_replace_the_files_another_command_wrote(tmp_path, capsys):
    """simulate, topology and place all write summary.json: into a folder holding a simulate run, topology and
    place are refused before any work (they replaced its summary.json, leaving a folder of mixed runs); a
    command whose names do not meet joins it, and the record in the folder lists both."""
    import json

    from edgepop.outputs import staged_output

    out = tmp_path / "out"
    assert main(["simulate", "--scenario", "small", "--requests", "200", "--out", str(out)]) == 0
    before = (out / "summary.json").read_bytes()
    for argv in (["topology"], ["place", "--policy", "greedy-demand", "--rps", "100"]):
        capsys.readouterr()
        assert main([*argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"holds the output of `edgepop simulate`, whose summary.json `edgepop {argv[0]}` would replace" in err
        assert err.count("\n") == 1 and (out / "summary.json").read_bytes() == before
    with staged_output(output_folder(out, writes={"fidelity.json"}, command="validate"), {"fidelity.json"},
                       command="validate") as tmp:
        (tmp / "fidelity.json").write_text("{}")
    runs = json.loads((out / ".edgepop-runs").read_text())
    assert runs["validate"] == ["fidelity.json"] and "summary.json" in runs["simulate"]
    (out / "summary.json").unlink()  # the user moved it away: nothing of simulate's is in the way any more
    (out / "report.md").unlink()
    assert main(["topology", "--out", str(out)]) == 0
    runs = json.loads((out / ".edgepop-runs").read_text())
    assert runs["topology"] == ["map.png", "summary.json"] and "summary.json" not in runs["simulate"]
