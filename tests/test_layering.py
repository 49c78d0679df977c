"""The import layers, enforced: edgepop <- topology <- controlplane <- dataplane <- sim, and no import cycles.

Rules (walked with ``ast`` over every module of the five packages, imports inside functions included):

* a package imports only itself and the packages below it;
* the data-plane engines (``dataplane`` outside ``dataplane/gateway``) import only ``edgepop``;
* only ``dataplane/gateway`` imports ``controlplane`` (it may also use ``topology``);
* only ``sim/live`` imports ``dataplane``;
* command-line modules (``cli.py``, ``cli_*.py``) are composition roots and may import anything;
* no file-level import cycle anywhere (a package ``__init__`` counts as a file).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
ORDER = ("edgepop", "topology", "controlplane", "dataplane", "sim")


def modules() -> dict[str, Path]:
    out = {}
    for pkg in ORDER:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Project modules ``name`` imports (resolved to the deepest module that exists)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            # ``from pkg import sub`` depends on the submodule; ``from pkg import name`` on the package itself
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            if t.split(".")[0] not in ORDER:
                continue
            while t not in known and "." in t:
                t = t.rpartition(".")[0]
            if t in known and t != name:
                found.add(t)
    return found


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    known = modules()
    g = nx.DiGraph()
    for name, path in known.items():
        g.add_node(name)
        for target in imports(name, path, known):
            g.add_edge(name, target)
    return g


def allowed(src: str, dst: str) -> bool:
    a, b = src.split(".")[0], dst.split(".")[0]
    leaf = src.rpartition(".")[2]
    if leaf == "cli" or leaf.startswith("cli_"):
        return True  # composition roots
    if ORDER.index(b) > ORDER.index(a):
        return False  # upwards
    if a == "dataplane" and b in ("topology", "controlplane"):
        return src.startswith("dataplane.gateway")  # the engines stay free of the control plane
    if a == "sim" and b == "dataplane":
        return src.startswith("sim.live")  # only the sim-vs-live experiment touches the data plane
    return True


def test_no_import_points_up_a_layer(graph):
    bad = sorted(f"{s} -> {d}" for s, d in graph.edges if not allowed(s, d))
    assert not bad, "forbidden imports:\n" + "\n".join(bad)


def test_no_file_level_import_cycles(graph):
    cycles = sorted(sorted(c) for c in nx.simple_cycles(graph))
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_checker_sees_forbidden_edges_and_cycles():
    """The rules catch what they claim to (the walk is not vacuous)."""
    assert not allowed("controlplane.plane", "sim.run")
    assert not allowed("dataplane.engine_lm", "controlplane.plane")
    assert allowed("dataplane.gateway.backend", "controlplane.deployment")
    assert not allowed("sim.run", "dataplane.service") and allowed("sim.live.replay", "dataplane.gateway.sse")
    assert allowed("sim.cli", "dataplane.service") and allowed("dataplane.gateway.cli", "sim.scenario")
    g = nx.DiGraph([("a", "b"), ("b", "a")])
    assert list(nx.simple_cycles(g))
    known = modules()
    assert "controlplane.routing" in known and "sim.live.replay" in known
    edges = imports("sim.live.client", known["sim.live.client"], known)
    assert "dataplane.gateway.sse" in edges and "edgepop.errors" in edges
    assert "sim.live.fidelity" in imports("sim.live.run", known["sim.live.run"], known)
