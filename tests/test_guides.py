"""The reading guides stay true and complete.

Each package's ``__init__`` docstring is its reading guide: it names every module of the package (or points to
the docs page that does), and every file path and dotted name that the README, the docs pages and the guides
write down exists. Read with ``ast`` only, nothing imported, so the checks are fast.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = ("edgepop", "topology", "controlplane", "dataplane", "sim")
PACKAGES = sorted(p.parent.relative_to(ROOT) for top in TOP for p in (ROOT / top).rglob("__init__.py"))
TEXTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A path such as `sim/live/run.py`, and a dotted name such as `controlplane.deployment.build_deployment`
# (not a file name such as `topology.md`, nor part of a longer path or name).
PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(TOP)})/[\w/]*?\w+\.py)\b")
DOTTED = re.compile(rf"(?<![\w./-])((?:{'|'.join(TOP)})(?:\.\w+)+)")
FILE_SUFFIXES = {"md", "py", "toml", "json", "csv", "png", "parquet", "txt", "sqlite", "ipynb", "onnx", "html"}
DOCS_PAGE = re.compile(r"docs/([\w-]+\.md)")


def guide(package: Path) -> str:
    """The reading guide of a package: its ``__init__`` docstring."""
    return ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text())) or ""


def pages(text: str) -> list[Path]:
    """The docs pages a guide points to."""
    return [ROOT / "docs" / name for name in DOCS_PAGE.findall(text)]


def members(package: Path) -> list[tuple[str, Path]]:
    """(name, path) of every module and subpackage directly in a package."""
    out = [(p.stem, p) for p in sorted((ROOT / package).glob("*.py")) if p.name != "__init__.py"]
    out += [(d.name, d) for d in sorted((ROOT / package).iterdir()) if (d / "__init__.py").is_file()]
    return out


def named(package: Path, name: str, guide_text: str, page_texts: list[str]) -> bool:
    """Whether module ``name`` of ``package`` is named: by its dotted name in the guide, or by its dotted name,
    its path or its file name in a docs page the guide points to."""
    dotted = ".".join((*package.parts, name))
    if re.search(rf"{re.escape(dotted)}\b", guide_text):
        return True
    file = rf"(?<![\w.]){re.escape(name)}(?:\.py|/)(?!\w)"
    return any(re.search(rf"{re.escape(dotted)}\b", t) or re.search(file, t) for t in page_texts)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.as_posix())
def test_each_guide_names_every_module_of_its_package(package):
    text = guide(package)
    assert "start" in text.lower(), f"{package}: the guide says nowhere where to start"
    linked = pages(text)
    assert all(p.is_file() for p in linked), f"{package}: the guide points to a docs page that does not exist"
    page_texts = [p.read_text() for p in linked]
    missing = [name for name, _ in members(package) if not named(package, name, text, page_texts)]
    assert not missing, f"{package}/__init__.py names neither in its docstring nor in {[p.name for p in linked]}: {missing}"


@cache
def top_level_names(module: Path) -> frozenset[str]:
    """Names a module (a ``.py`` file or a package's ``__init__.py``) defines or imports at its top level."""
    tree = ast.parse(module.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.If | ast.Try):  # (optional imports, fallbacks)
            for sub in ast.walk(node):
                if isinstance(sub, ast.Import | ast.ImportFrom):
                    names.update((a.asname or a.name).split(".")[0] for a in sub.names)
                elif isinstance(sub, ast.FunctionDef | ast.ClassDef):
                    names.add(sub.name)
    return frozenset(names)


def class_attributes(module: Path, cls: str) -> frozenset[str] | None:
    """Names defined in the body of class ``cls`` of ``module`` (None: not a class there)."""
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            out = set()
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    out.add(sub.name)
                elif isinstance(sub, ast.Assign | ast.AnnAssign):
                    targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                    out.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            return frozenset(out)
    return None


def dotted_exists(name: str) -> bool:
    """Whether a dotted name is a module, a package, or a name a module defines (and, for a class, a name in its
    body), by the source files alone."""
    parts = name.split(".")
    i = 1
    while i < len(parts) and ((ROOT / Path(*parts[: i + 1])).is_dir() or (ROOT / Path(*parts[: i + 1])).with_suffix(".py").is_file()):
        i += 1
    base = ROOT / Path(*parts[:i])
    module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    if not module.is_file():
        return False
    rest = parts[i:]
    if not rest:
        return True
    if rest[0] not in top_level_names(module):
        return False
    if len(rest) == 1:
        return True
    attrs = class_attributes(module, rest[0])
    return attrs is None or rest[1] in attrs  # (an attribute of an imported or non-class name is not checked)


def references(text: str) -> tuple[set[str], set[str]]:
    """The ``pkg/module.py`` paths and dotted ``pkg.module`` names a text writes."""
    paths = set(PATH.findall(text))
    dotted = {d.rstrip(".") for d in DOTTED.findall(text)}
    dotted = {d for d in dotted if d.rsplit(".", 1)[-1] not in FILE_SUFFIXES}
    return paths, dotted


def sources() -> list[tuple[str, str]]:
    return ([(p.relative_to(ROOT).as_posix(), p.read_text()) for p in TEXTS]
            + [((pkg / "__init__.py").as_posix(), guide(pkg)) for pkg in PACKAGES])


@pytest.mark.parametrize("where,text", sources(), ids=[w for w, _ in sources()])
def test_every_written_path_and_dotted_name_exists(where, text):
    paths, dotted = references(text)
    bad = sorted(p for p in paths if not (ROOT / p).is_file())
    bad += sorted(d for d in dotted if not dotted_exists(d))
    bad += sorted(f"docs/{p.name}" for p in pages(text) if not p.is_file())
    assert not bad, f"{where} names what does not exist: {bad}"


def where_the_code_is(text: str) -> str:
    """The "Where the code is" paragraph of a docs page."""
    m = re.search(r"^Where the code is:(.*?)(?=\n\n|\Z)", text, flags=re.M | re.S)
    return m.group(1) if m else ""


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_where_the_code_is_names_only_files_that_exist(page):
    """A bare ``name.py`` in a page's "Where the code is" paragraph is a file of a package folder it names."""
    text = where_the_code_is(page.read_text())
    folders = [ROOT / d for d in re.findall(rf"(?<![\w/])((?:{'|'.join(TOP)})(?:/\w+)*)/", text)]
    bare = re.findall(r"(?<![\w/.])(\w+\.py)\b", text)
    missing = [f for f in bare if not any((d / f).is_file() for d in folders)]
    assert not missing, f"{page.name}: 'Where the code is' names files in none of {folders}: {missing}"


def test_the_checks_catch_what_they_should():
    assert dotted_exists("controlplane.deployment.build_deployment")
    assert dotted_exists("controlplane.plane.ControlPlane.submit")
    assert dotted_exists("sim.techniques.TECHNIQUES")
    assert not dotted_exists("controlplane.deployment.build_everything")
    assert not dotted_exists("sim.nonexistent")
    assert not dotted_exists("controlplane.plane.ControlPlane.no_such_method")
    paths, dotted = references("see `sim/live/run.py`, docs/topology.md, `topology.world` and [x](controlplane.md)")
    assert paths == {"sim/live/run.py"} and dotted == {"topology.world"}
    assert named(Path("sim/live"), "run", "", ["`sim/live/` (`run.py`: the driver)"])
    assert not named(Path("sim/live"), "run", ":mod:`sim.live.runner`", ["`rerun.py`"])


def test_public_module_level_names_outside_the_commands_say_what_they_are():
    """Every public function and class at the top of a library module has a docstring (``cli.py`` and
    ``cli_*.py``, the commands' composition roots, aside)."""
    missing = []
    for top in TOP:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path.stem == "cli" or path.stem.startswith("cli_"):
                continue
            for node in ast.parse(path.read_text()).body:
                if (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                        and not node.name.startswith("_") and not ast.get_docstring(node)):
                    missing.append(f"{path.relative_to(ROOT).as_posix()}:{node.lineno} {node.name}")
    assert not missing, f"public names without a docstring: {missing}"
