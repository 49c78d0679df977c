"""Users' policy modules in tests: docs/extending.md's example module written to a file, and a fixture that
leaves edgepop's registries, ``sys.modules`` and the loaded-plugin list as they were."""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def example_module() -> str:
    """The source of docs/extending.md's ``my_policies.py`` (registers ``busiest-sites`` and ``random-ready``)."""
    text = (ROOT / "docs" / "extending.md").read_text()
    return next(b for b in re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S) if "my_policies.py:" in b)


def write_module(folder: Path, name: str, extra: str = "") -> Path:
    """docs/extending.md's example module as ``folder/name.py``, with ``extra`` source appended."""
    path = folder / f"{name}.py"
    path.write_text(example_module() + extra)
    return path


@pytest.fixture
def isolated_registries():
    """Undo, after the test, every registration and plugin import it made in this process (and sys.path)."""
    from controlplane.placement import PLACEMENTS
    from controlplane.routing import ROUTERS
    from edgepop.registry import Registry

    plugins = importlib.import_module("edgepop.plugins") if importlib.util.find_spec("edgepop.plugins") else None
    registries = getattr(Registry, "instances", [PLACEMENTS, ROUTERS])  # (every registry made)
    saved = [(r, dict(r._entries)) for r in registries]
    count, modules, path = len(registries), set(sys.modules), list(sys.path)
    loaded = list(plugins._loaded) if plugins else []
    yield
    for registry, entries in saved:
        registry._entries = entries
    del registries[count:]
    for name in set(sys.modules) - modules:  # the test's own modules (in tmp_path), not libraries it imported
        file = str(getattr(sys.modules[name], "__file__", None) or "")
        if file and not file.startswith((sys.prefix, sys.base_prefix, str(ROOT))):
            del sys.modules[name]
    if plugins:
        plugins._loaded[:] = loaded
    sys.path[:] = path
