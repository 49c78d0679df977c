"""Users' policies in a sweep's worker processes: registered in the sweep's process, known in its workers; one
no worker can import is refused before any variant runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest
from kit.plugins import ROOT, isolated_registries, write_module  # noqa: F401  (a fixture)

from edgepop.errors import UserError
from sim.grid import parse_grid

_SCRIPT = """
import json
import sys

from controlplane.routing import ROUTERS
from edgepop.errors import UserError
from sim.grid import parse_grid
from sim.sweep import run_sweep

if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])
    import plug_sweep  # registered in this process only, inside the guard: the workers never run this block

    axes = {"edge.placement": ["greedy-demand", "busiest-sites"], "edge.router": ["nearest-with-capacity",
                                                                                  "random-ready"]}
    grid = parse_grid({"base": "small", "requests": 200, "deployments": ["edge"], "axes": axes}, "mine.toml")
    result = run_sweep(grid, workers=2, out=sys.argv[1] + "/out", progress=False)
    print(json.dumps(result.summary[["variant", "placement", "ok"]].to_dict("records")))

    @ROUTERS.register("in-guard")  # defined inside the guard: a worker re-runs this file without it
    class InGuard(plug_sweep.RandomReady):
        pass

    grid = parse_grid({"base": "small", "requests": 200, "deployments": ["edge"],
                       "axes": {"edge.router": ["nearest-with-capacity", "in-guard"]}}, "guard.toml")
    try:
        run_sweep(grid, workers=2, out=sys.argv[1] + "/out2", progress=False)
    except UserError as exc:
        print(exc)
"""


def test_a_policy_registered_inside_the_main_guard_reaches_the_pool_workers(tmp_path):
    write_module(tmp_path, "plug_sweep")
    script = tmp_path / "run.py"
    script.write_text(_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows, refusal = proc.stdout.strip().splitlines()
    assert [(r["variant"], r["placement"], r["ok"]) for r in json.loads(rows)] == [
        (0, "greedy-demand", 200), (1, "greedy-demand", 200), (2, "busiest-sites", 200), (3, "busiest-sites", 200)]
    assert refusal == (
        "guard.toml: variant 1 (edge.router='in-guard', seed=7) failed: routing policy 'in-guard' registered in the "
        "sweep's process but not in its worker processes: register it at the top level of a .py module (not inside "
        "an `if __name__ == '__main__':` block) and import that module, or run the sweep with workers=1 (in this "
        "process)")
    assert not (tmp_path / "out2").exists()


@pytest.fixture
def notebook_router(monkeypatch, isolated_registries):  # noqa: F811
    """A router defined in a notebook cell: module ``__main__``, which has no file there."""
    from controlplane.routing import ROUTERS
    from controlplane.routing.nearest import NearestWithCapacity

    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    cls = type("FromCell", (NearestWithCapacity,), {"__module__": "__main__"})
    ROUTERS.register("from-cell")(cls)
    return cls


def _grid(router: str):
    return parse_grid({"base": "small", "requests": 50, "deployments": ["edge"],
                       "axes": {"edge.router": ["nearest-with-capacity", router]}}, "cells.toml")


def test_a_notebook_policy_is_refused_before_any_variant_when_workers_would_run_it(tmp_path, monkeypatch,
                                                                                   notebook_router):
    import sim.sweep as sweep

    monkeypatch.setattr(sweep, "run_variant", lambda *a, **k: pytest.fail("a variant ran"))
    monkeypatch.setattr(sweep, "local_pool", lambda *a, **k: pytest.fail("a pool started"))
    with pytest.raises(UserError) as info:
        sweep.run_sweep(_grid("from-cell"), workers=2, out=tmp_path / "out", progress=False)
    assert str(info.value) == (
        "cells.toml: variant 1 (edge.router='from-cell', seed=7): routing policy 'from-cell' is defined in __main__ "
        "without a file (a notebook or `python -c`), which sweep worker processes cannot import: put it in a .py "
        "module and import that, or run the sweep with workers=1 (in this process)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("router, workers", [("from-cell", 1), ("p2c", 2)])
def test_a_notebook_policy_runs_in_process_and_one_the_grid_does_not_use_is_no_obstacle(
        tmp_path, monkeypatch, notebook_router, router, workers):
    import sim.sweep as sweep

    ran = []

    def run_local(tasks, *args, **kwargs):  # (where the variants would start)
        ran.extend(t.variant.id for t in tasks)
        raise UserError("stopped here")

    monkeypatch.setattr(sweep, "_run_local", run_local)
    with pytest.raises(UserError, match="^stopped here$"):
        sweep.run_sweep(_grid(router), workers=workers, out=tmp_path / "out", progress=False)
    assert ran == [0, 1]


def test_worker_modules_lists_plugins_and_users_entries_not_notebook_ones(tmp_path, notebook_router):
    from edgepop.plugins import load_plugin, worker_modules

    path = write_module(tmp_path, "plug_listed")
    load_plugin(str(path))
    listed = worker_modules()
    assert ("plug_listed", str(path)) in listed
    assert all(name != "__main__" and name.split(".")[0] not in ("controlplane", "sim") for name, _ in listed)


def test_a_worker_imports_a_module_off_its_path_from_its_file(tmp_path, isolated_registries):  # noqa: F811
    """A ``--plugin`` file's module name is not on a worker's path: the worker loads it from the file."""
    from controlplane.placement import PLACEMENTS
    from edgepop.plugins import import_worker_modules

    path = write_module(tmp_path, "plug_off_path")
    assert "plug_off_path" not in sys.modules and "busiest-sites" not in PLACEMENTS
    assert import_worker_modules([("plug_off_path", str(path))]) == []
    assert PLACEMENTS.get("busiest-sites").__module__ == "plug_off_path"
    problems = import_worker_modules([("plug_gone", str(tmp_path / "plug_gone.py"))])
    assert len(problems) == 1 and problems[0].startswith("a worker could not import 'plug_gone' (")


def test_a_sweep_with_workers_from_a_script_on_standard_input_is_refused_before_a_pool_starts(monkeypatch):
    """``python - < script.py``: spawned workers ran __main__ again from '<stdin>' and died, and the error blamed a
    missing __main__ guard, whatever the grid used (shipped routers too)."""
    import sys
    import types

    from sim.sweep import local_pool

    stdin_main = types.ModuleType("__main__")
    stdin_main.__file__, stdin_main.__spec__ = "<stdin>", None
    monkeypatch.setitem(sys.modules, "__main__", stdin_main)
    with pytest.raises(UserError, match=r"cannot start from a script read from standard input .*workers=1$"):
        local_pool(2)
