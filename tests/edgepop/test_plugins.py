"""Users' policy modules reach the ``edgepop`` command (``--plugin``, ``EDGEPOP_PLUGINS``), a module that cannot
be imported is one line naming it, and a user's placement policy that raises is one line naming the policy."""

from __future__ import annotations

import json
import re

import pytest
from kit.plugins import ROOT, isolated_registries, write_module  # noqa: F401  (a fixture)

from edgepop.cli import main

pytestmark = pytest.mark.usefixtures("isolated_registries")

RAISES = '''

@PLACEMENTS.register("always-fails")
@dataclass
class AlwaysFails(PlacementPolicy):
    """Fails at once (a test's broken policy)."""

    def place(self, problem, rng):
        raise RuntimeError("my policy blew up")
'''


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgepop: error: "), err
    return lines[0]


def test_plugin_args_are_the_ones_before_the_command():
    from edgepop.cli import plugin_args

    argv = ["--plugin", "a.py", "--plugin=b", "place", "--plugin", "c"]
    assert plugin_args(argv) == ["a.py", "b"]
    assert plugin_args(["place", "--policy", "x"]) == []


def test_a_plugin_file_registers_a_policy_that_place_uses(tmp_path, capsys):
    path = write_module(tmp_path, "plug_place")
    argv = ["--plugin", str(path), "place", "--policy", "busiest-sites", "--rps", "2000", "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["policy"] == "busiest-sites" and summary["replicas"] > 0


def test_a_plugin_policy_and_router_in_a_scenario_that_simulate_runs(tmp_path, capsys):
    path = write_module(tmp_path, "plug_sim")
    scenario = tmp_path / "mine.toml"
    small = (ROOT / "sim" / "scenarios" / "small.toml").read_text()
    scenario.write_text(small.replace('placement = "greedy-demand"\nrouter = "nearest-balanced"',
                                      'placement = "busiest-sites"\nplacement_options = { k = 10 }\n'
                                      'router = "random-ready"'))
    assert "busiest-sites" in scenario.read_text()
    argv = ["--plugin", str(path), "simulate", "--scenario", str(scenario), "--requests", "300", "--only", "edge",
            "--json", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    edge = json.loads(capsys.readouterr().out)["deployments"]["edge"]
    assert edge["placement"]["policy"] == "busiest-sites" and edge["requests"] == 300


def test_edgepop_plugins_names_modules_comma_separated(tmp_path, capsys, monkeypatch):
    first = write_module(tmp_path, "plug_env_a")
    second = tmp_path / "plug_env_b.py"
    second.write_text("from controlplane.placement import PLACEMENTS\nfrom plug_env_a import BusiestSites\n\n"
                      "PLACEMENTS.register('busiest-two')(type('BusiestTwo', (BusiestSites,), {}))\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # (the second is imported by its module name)
    monkeypatch.setenv("EDGEPOP_PLUGINS", f"{first}, plug_env_b")
    assert main(["place", "--list-policies", "--json"]) == 0
    names = json.loads(capsys.readouterr().out)
    assert {"busiest-sites", "busiest-two", "greedy-demand"} <= set(names)


@pytest.mark.parametrize("source, spec, message", [
    (None, "no_such_plugin_module", r"--plugin 'no_such_plugin_module': cannot import it: ModuleNotFoundError: "
                                    r"No module named 'no_such_plugin_module'$"),
    (None, "missing.py", r"--plugin '.*missing\.py': no such file$"),
    ("x = 1\ndef f(:\n    pass\n", "bad_syntax.py", r"--plugin '.*bad_syntax\.py': SyntaxError at "
                                                     r".*bad_syntax\.py:2: .*"),
    ("raise RuntimeError('not configured')\n", "bad_raise.py",
     r"--plugin '.*bad_raise\.py': RuntimeError while importing it: not configured \(EDGEPOP_TRACEBACK=1 shows "
     r"where\)$"),
    ("from controlplane.placement import PLACEMENTS\nPLACEMENTS.register(None)\n", "bad_name.py",
     r"--plugin '.*bad_name\.py': ValueError while importing it: placement policy name must be a non-empty "
     r"string without whitespace, commas or control characters, got None"),
])
def test_a_plugin_that_cannot_be_imported_is_one_line_naming_it(tmp_path, capsys, source, spec, message):
    if source is not None:
        (tmp_path / spec).write_text(source)
    if spec.endswith(".py"):
        spec = str(tmp_path / spec)
    assert main(["--plugin", spec, "place", "--list-policies"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    line = _one_line(captured.err)
    assert re.search(message, line), line


def test_a_bad_entry_of_edgepop_plugins_is_named_so(capsys, monkeypatch):
    monkeypatch.setenv("EDGEPOP_PLUGINS", "no_such_plugin_module")
    assert main(["place", "--list-policies"]) == 2
    assert _one_line(capsys.readouterr().err).startswith("edgepop: error: EDGEPOP_PLUGINS 'no_such_plugin_module'")


def test_a_users_placement_policy_that_raises_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    path = write_module(tmp_path, "plug_raise", RAISES)
    argv = ["--plugin", str(path), "place", "--policy", "always-fails", "--rps", "2000"]
    assert main(argv) == 2
    assert _one_line(capsys.readouterr().err) == (
        "edgepop: error: placement policy 'always-fails' (plug_raise.AlwaysFails) failed: RuntimeError: my policy "
        "blew up (EDGEPOP_TRACEBACK=1 shows where)")
    monkeypatch.setenv("EDGEPOP_TRACEBACK", "1")  # the whole chain, then the same line
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and 'raise RuntimeError("my policy blew up")' in err
    assert err.strip().splitlines()[-1].startswith("edgepop: error: placement policy 'always-fails'")


def test_a_shipped_policys_own_errors_are_not_rewrapped():
    """Only a policy from outside controlplane.placement is named as a user's failing policy."""
    import numpy as np

    from controlplane.placement import get_policy
    from controlplane.placement.base import run_policy

    class Problem:
        def network(self):
            raise KeyError("inside")

    with pytest.raises(KeyError):
        run_policy(get_policy("everywhere-fits"), Problem(), np.random.default_rng(0))


def test_a_plugin_file_imports_the_modules_beside_it(tmp_path, capsys):
    write_module(tmp_path, "plug_base")
    (tmp_path / "plug_more.py").write_text("from controlplane.placement import PLACEMENTS\nfrom plug_base import "
                                           "BusiestSites\n\nPLACEMENTS.register('busiest-more')("
                                           "type('BusiestMore', (BusiestSites,), {}))\n")
    assert main(["--plugin", str(tmp_path / "plug_more.py"), "place", "--list-policies", "--json"]) == 0
    assert {"busiest-sites", "busiest-more"} <= set(json.loads(capsys.readouterr().out))


def test_a_plugin_given_after_the_command_is_told_where_it_goes(capsys):
    """argparse said only 'unrecognized arguments: --plugin x.py'."""
    with pytest.raises(SystemExit) as exc:
        main(["place", "--plugin", "x.py", "--policy", "greedy-demand"])
    assert exc.value.code == 2
    assert "--plugin goes before the command: edgepop --plugin FILE.py place ..." in capsys.readouterr().err


@pytest.mark.parametrize("path, refused", [("<stdin>", True), (None, True), ("/no/such/script.py", True),
                                           (__file__, False)])
def test_a_main_module_read_from_standard_input_is_no_file_a_worker_can_run(monkeypatch, path, refused):
    """``python - < script.py``: __main__'s __file__ is '<stdin>', which spawned workers failed to run again (and
    the error blamed a missing __main__ guard) instead of the sweep refusing it up front."""
    import sys
    import types

    from edgepop.plugins import unshippable

    main_module = types.ModuleType("__main__")
    if path is not None:
        main_module.__file__ = path
    monkeypatch.setitem(sys.modules, "__main__", main_module)
    assert unshippable("__main__") is refused
