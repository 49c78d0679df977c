"""The tables' console: the terminal's width on a terminal; piped, wide enough not to wrap (wider if COLUMNS says)."""

from __future__ import annotations

from edgepop.console import table_console


def test_piped_console_is_wide(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert not table_console().is_terminal  # pytest captures stdout
    assert table_console().width == 150
    assert table_console(240).width == 240


def test_columns_widens_but_never_narrows(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    assert table_console().width == 250
    monkeypatch.setenv("COLUMNS", "80")  # (pytest-xdist exports 80 to its workers: a file still gets 150)
    assert table_console().width == 150
    monkeypatch.setenv("COLUMNS", "wide")  # not a number: ignored, as rich ignores it
    assert table_console().width == 150


def test_piped_headline_keeps_rows_whole(tmp_path, capsys, monkeypatch):
    """``edgepop simulate`` piped: each metric's row is one line, not wrapped over several as at 80 columns."""
    from edgepop.cli import main

    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["simulate", "--scenario", "small", "--requests", "300", "--out", str(tmp_path / "out")]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("│")]
    assert len(rows) > 15
    assert all(line.split("│")[1].strip() for line in rows)  # a wrapped row continues with an empty metric cell
    assert any(line.split("│")[1].strip() == "TTFT p95 incl. failures (ms)" for line in rows)
