"""``edgepop validate --out ~/dir --docs ~/page.md``: written to the expanded paths (not to a literal ./~)."""

from __future__ import annotations

from pathlib import Path

from edgepop.cli import main


def test_validate_out_and_docs_under_the_home_folder(tmp_path, monkeypatch):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    _quick_validate(monkeypatch)
    assert main(["validate", "--json", "--out", "~/v", "--docs", "~/d/page.md"]) == 0
    assert {p.name for p in (home / "v").iterdir()} == {"fidelity.json", "fidelity.png", ".edgepop-runs"}
    assert {p.name for p in (home / "d").iterdir()} == {"page.md", "page.png"}
    assert not (cwd / "~").exists()


def _quick_validate(monkeypatch, draw=None):
    """The tables' computation is not what these tests test: minutes of it are replaced by empty reports."""
    import controlplane.validation as validation
    from sim import load_validation, validate_plots

    def drawn(frames, path):
        Path(path).write_bytes(b"png")
        return Path(path)

    monkeypatch.setattr(validation, "fidelity_report", lambda **_: {})
    monkeypatch.setattr(validation, "render_markdown", lambda *a, **k: "page")
    monkeypatch.setattr(load_validation, "load_report", lambda: {})
    monkeypatch.setattr(load_validation, "render_markdown", lambda *a: "")
    monkeypatch.setattr(validate_plots, "draw_fidelity", draw or drawn)


def test_validate_refuses_a_folder_named_like_its_output_before_working(tmp_path, monkeypatch, capsys):
    _quick_validate(monkeypatch)
    (tmp_path / "out" / "fidelity.png").mkdir(parents=True)
    assert main(["validate", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "fidelity.png is a folder, where the command writes a file" in err and "\n" not in err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["fidelity.png"]  # no fidelity.json without its figure


def test_validate_writes_its_files_all_or_nothing(tmp_path, monkeypatch):
    """A run that fails while drawing leaves the earlier run's fidelity.json, not a new one beside an old figure."""
    def broken(frames, path):
        raise OSError(28, "No space left on device")

    _quick_validate(monkeypatch, broken)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "fidelity.json").write_text("earlier")
    assert main(["validate", "--out", str(tmp_path / "out")]) == 1
    assert (tmp_path / "out" / "fidelity.json").read_text() == "earlier"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
