"""Write the notebooks in ``notebooks/`` from the cell sources below (nbformat v4, no outputs).

    python scripts/build_notebooks.py            # rewrite notebooks/*.ipynb
    python scripts/build_notebooks.py --check    # exit 1 if a committed notebook differs from what this writes

Each notebook starts with a cell tagged ``parameters`` that reads its sizes from ``EDGEPOP_NB_*`` environment
variables (defaults: a real, quick look), so the test suite runs them headless with small values. Cell ids are
derived from the notebook name and cell position, so rebuilding gives byte-identical files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

sys.path.insert(0, str(Path(__file__).resolve().parent))
from notebook_cells import NOTEBOOKS  # noqa: E402  (cell sources live beside this script)

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
KERNEL = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
          "language_info": {"name": "python"}}


def build(name: str, cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    """A notebook from (kind, source) pairs; kind is ``md``, ``code`` or ``params`` (the parameters cell)."""
    nb = new_notebook(metadata=KERNEL)
    for i, (kind, source) in enumerate(cells):
        source = source.strip("\n")
        cell_id = f"{name.replace('_', '-')}-{i:02d}"
        if kind == "md":
            cell = new_markdown_cell(source, id=cell_id)
        else:
            cell = new_code_cell(source, id=cell_id)
            if kind == "params":
                cell.metadata["tags"] = ["parameters"]
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed notebooks, write nothing")
    args = parser.parse_args(argv)
    stale = []
    NOTEBOOK_DIR.mkdir(exist_ok=True)
    for name, cells in NOTEBOOKS.items():
        path = NOTEBOOK_DIR / f"{name}.ipynb"
        text = render(build(name, cells))
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"out of date (run scripts/build_notebooks.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
