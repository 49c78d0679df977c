"""``edgepop validate --out ~/dir --docs ~/page.md``: written to the expanded paths (not to a literal ./~)."""

from __future__ import annotations

from pathlib import Path

from edgepop.cli import main


def test_validate_out_and_docs_under_the_home_folder(tmp_path, monkeypatch):
    import controlplane.validation as validation
    from sim import load_validation, validate_plots

    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)

    def draw(frames, path):
        Path(path).write_bytes(b"png")
        return Path(path)

    # the tables' computation is not what is tested: minutes of it are replaced by empty reports
    monkeypatch.setattr(validation, "fidelity_report", lambda **_: {})
    monkeypatch.setattr(validation, "render_markdown", lambda *a, **k: "page")
    monkeypatch.setattr(load_validation, "load_report", lambda: {})
    monkeypatch.setattr(load_validation, "render_markdown", lambda *a: "")
    monkeypatch.setattr(validate_plots, "draw_fidelity", draw)
    assert main(["validate", "--json", "--out", "~/v", "--docs", "~/d/page.md"]) == 0
    assert {p.name for p in (home / "v").iterdir()} == {"fidelity.json", "fidelity.png"}
    assert {p.name for p in (home / "d").iterdir()} == {"page.md", "page.png"}
    assert not (cwd / "~").exists()
