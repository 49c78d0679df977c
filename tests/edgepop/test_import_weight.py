"""What importing the CLI and the simulator loads: ``edgepop --help`` builds every sub-command's parser without
the libraries the commands use, and the simulator imports none of those only some of its options need (a spawned
sweep worker and every command pay its imports). Each check runs in a fresh interpreter and reads
``sys.modules``, never a clock."""

import json
import subprocess
import sys

import pytest

# Loaded only by the commands (or options) that use them.
HEAVY_FOR_HELP = ("pandas", "scipy", "networkx", "matplotlib", "onnx", "onnxruntime", "simpy", "pyarrow",
                  "controlplane.placement", "topology.world", "dataplane.runtime", "dataplane.gateway.config")
HEAVY_FOR_SIMULATOR = ("scipy.stats", "scipy.optimize", "networkx", "matplotlib", "onnx", "onnxruntime")


def loaded_after(code: str, names: tuple[str, ...]) -> list[str]:
    probe = f"import json, sys\n{code}\nprint(json.dumps([n for n in {list(names)!r} if n in sys.modules]))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_help_builds_every_parser_without_the_commands_libraries():
    code = "from edgepop.cli import build_parser\nparser = build_parser()\nparser.format_help()\n" \
           "[p.format_help() for p in parser.commands.values()]"
    assert loaded_after(code, HEAVY_FOR_HELP) == []


def test_the_simulator_imports_no_library_only_some_options_need():
    assert loaded_after("import sim.run, sim.outputs, sim.sweep", HEAVY_FOR_SIMULATOR) == []


def test_the_probe_sees_what_is_imported():
    """The check above can fail: a module that does import them is seen."""
    assert loaded_after("import controlplane.placement", ("pandas", "controlplane.placement")) == \
        ["pandas", "controlplane.placement"]


@pytest.mark.parametrize("name", ["Topology", "core_rtt_ms", "BASELINE_SETS", "load_pops"])
def test_topologys_public_names_load_on_first_use(name):
    import topology

    assert name in topology.__all__ and name in dir(topology)
    value = getattr(topology, name)
    assert value is not None and topology.__dict__[name] is value  # kept: the next read is a plain lookup
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        topology.no_such_name  # noqa: B018
