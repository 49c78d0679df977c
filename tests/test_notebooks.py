"""The notebooks in notebooks/ run headless (nbclient, kernel python3) with small parameters and draw their figures;
the committed files are what scripts/build_notebooks.py writes, without outputs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SMALL = {"EDGEPOP_NB_SCENARIO": "small", "EDGEPOP_NB_REQUESTS": "300", "EDGEPOP_NB_SEED": "3",
         "EDGEPOP_NB_ILP_TIME_S": "6", "EDGEPOP_NB_DEMAND_RPS": "2000", "EDGEPOP_NB_LOADS": "25,800",
         "EDGEPOP_NB_WORKERS": "1", "EDGEPOP_NB_EXTRA_SEEDS": "2"}
# Figures each notebook must show (matplotlib figures rendered as image/png outputs).
FIGURES = {"edge_vs_central": 5, "placement_policies": 3, "capacity_planning": 2}


def test_committed_notebooks_are_built_and_have_no_outputs():
    built = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_notebooks.py"), "--check"],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == sorted(FIGURES)
    for path in NOTEBOOKS.glob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        assert nb.cells[1].metadata.get("tags") == ["parameters"], path.name
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, path.name


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_notebook_runs_headless_and_draws_its_figures(name, monkeypatch, tmp_path):
    for key, value in SMALL.items():
        monkeypatch.setenv(key, value)
    # The kernel imports this checkout (not whatever edgepop is installed) and draws inline, not with Agg.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("MPLBACKEND", raising=False)
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    if name == "edge_vs_central":  # a last cell reads the per-continent chart's notes back from the kernel
        nb.cells.append(nbformat.v4.new_code_cell(
            'print("CHECK", [t.get_text() for t in b.texts].count("n<30"), int(continent_gain.isna().sum()))'))
    if name == "placement_policies":  # the planning problem's fleet against the one the simulations ran
        nb.cells.append(nbformat.v4.new_code_cell('print("CHECK", int(problem.fleet.nodes.gpus.sum()), '
                                                  '*{r.summary["deployments"]["edge"]["gpus"] for r in runs.values() '
                                                  'if "edge" in r.summary["deployments"]})'))
    NotebookClient(nb, kernel_name="python3", timeout=240, resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    if name == "placement_policies":  # (it planned for the full inventory, ten times the scenario's GPUs)
        check = next(o.text for o in outputs if o.output_type == "stream" and "CHECK" in o.text).split()
        assert check[1:] == ["228", "228"], check  # planned for = simulated (one count over every run)
    if name == "edge_vs_central":
        check = next(o.text for o in outputs if o.output_type == "stream" and "CHECK" in o.text).split()
        assert int(check[1]) == int(check[2]) > 0  # (300 requests: some continent has under 30) each one marked
        headline = next(o.data["text/plain"] for o in outputs if "GPU-hours" in o.get("data", {}).get("text/plain", ""))
        assert not re.search(r"\d\.\d{5,}", headline), headline  # values as the CLI prints them, not raw floats
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.get("data", {})]
    assert len(images) >= FIGURES[name], f"{name}: {len(images)} figures"
    tables = [o for o in outputs if o.output_type == "execute_result" and "text/html" in o.get("data", {})]
    assert tables, f"{name}: no table shown"


@pytest.mark.parametrize("name", ["edge_vs_central", "placement_policies"])
def test_notebook_needing_central_says_so_up_front(name, monkeypatch, tmp_path):
    """A scenario without a central deployment stops at the setup cell with one message (it failed cells later
    with KeyErrors, or with an error about CLI flags)."""
    for key, value in {**SMALL, "EDGEPOP_NB_SCENARIO": "ablation"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("MPLBACKEND", raising=False)
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    with pytest.raises(CellExecutionError):
        NotebookClient(nb, kernel_name="python3", timeout=240,
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [(i, o) for i, c in enumerate(nb.cells) if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert len(errors) == 1
    i, err = errors[0]
    assert i == 2 and err.ename == "UserError"  # the first cell after the parameters
    assert "scenario 'ablation' has no central deployment" in err.evalue and "EDGEPOP_NB_SCENARIO" in err.evalue


@pytest.mark.parametrize(("variable", "value"), [("EDGEPOP_NB_REQUESTS", "abc"), ("EDGEPOP_NB_EXTRA_SEEDS", "0")])
def test_a_bad_parameter_stops_the_notebook_at_the_top_naming_it(variable, value, monkeypatch, tmp_path):
    """EXTRA_SEEDS=0 ran every cell and failed in the last naming --seeds; REQUESTS=abc gave a bare ValueError."""
    for key, v in {**SMALL, variable: value}.items():
        monkeypatch.setenv(key, v)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(NOTEBOOKS / "edge_vs_central.ipynb", as_version=4)
    with pytest.raises(CellExecutionError):
        NotebookClient(nb, kernel_name="python3", timeout=240,
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [(i, o) for i, c in enumerate(nb.cells) if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert len(errors) == 1 and errors[0][0] == 1  # the parameters cell
    assert errors[0][1].evalue == f"{variable}={value!r}: expected a whole number >= 1"


def params_cell(name):
    return next(c.source for c in nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4).cells
                if c.metadata.get("tags") == ["parameters"])


@pytest.mark.parametrize(("name", "variable", "value", "want"), [
    ("capacity_planning", "EDGEPOP_NB_LOADS", "25,,100", "comma-separated finite numbers > 0"),
    ("capacity_planning", "EDGEPOP_NB_LOADS", "25,-100", "comma-separated finite numbers > 0"),
    ("capacity_planning", "EDGEPOP_NB_PLAN_RPS", "x", "a finite number > 0"),
    ("capacity_planning", "EDGEPOP_NB_PLAN_RPS", "nan", "a finite number > 0"),
    ("capacity_planning", "EDGEPOP_NB_REQUESTS", "2e3", "a whole number >= 1"),
    ("capacity_planning", "EDGEPOP_NB_WORKERS", "-1", "a whole number >= 0"),
    ("placement_policies", "EDGEPOP_NB_REQUESTS", "abc", "a whole number >= 1"),
    ("placement_policies", "EDGEPOP_NB_SEED", "-1", "a whole number >= 0"),
    ("placement_policies", "EDGEPOP_NB_DEMAND_RPS", "0", "a finite number > 0"),
    ("placement_policies", "EDGEPOP_NB_ILP_TIME_S", "inf", "a finite number > 0"),
])
def test_parameters_cell_names_a_bad_value(name, variable, value, want, monkeypatch):
    """Bad values gave bare ValueErrors (float('x')), or passed the parameters cell and failed cells later
    (WORKERS=-1): each now stops that cell with one line naming the variable and its value."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError) as err:
        exec(params_cell(name), {})
    assert str(err.value) == f"{variable}={value!r}: expected {want}"


def test_parameters_cells_read_good_values(monkeypatch):
    for key, value in {**SMALL, "EDGEPOP_NB_LOADS": " 25, 1e3", "EDGEPOP_NB_PLAN_RPS": "2.5",
                       "EDGEPOP_NB_WORKERS": "0"}.items():
        monkeypatch.setenv(key, value)
    capacity, placement = {}, {}
    exec(params_cell("capacity_planning"), capacity)
    exec(params_cell("placement_policies"), placement)
    assert (capacity["LOADS"], capacity["PLAN_RPS"], capacity["REQUESTS"], capacity["WORKERS"]) == \
        ([25.0, 1000.0], 2.5, 300, None)
    assert (placement["DEMAND_RPS"], placement["ILP_TIME_S"], placement["SEED"]) == (2000.0, 6.0, 3)
