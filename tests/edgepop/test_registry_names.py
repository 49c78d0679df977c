"""Registry names: what a name may be, and when a name already taken may be registered again."""

from __future__ import annotations

import importlib
import re
import sys

import pytest
from kit.plugins import isolated_registries  # noqa: F401  (a fixture)

from edgepop.errors import UserError
from edgepop.registry import Registry

pytestmark = pytest.mark.usefixtures("isolated_registries")


def _target(module: str, qualname: str):
    def make(x: int = 1):
        return x

    make.__module__, make.__qualname__ = module, qualname
    return make


@pytest.mark.parametrize("name", [None, 5, "", "a,b", "a b", " a", "a\tb", "a\nb", "x\x00", "x\x1b[0m"])
def test_a_bad_name_is_refused_at_registration_naming_it(name):
    reg = Registry("thing")
    with pytest.raises(ValueError, match="^thing name must be a non-empty string without whitespace, commas or "
                                         "control characters, got " + re.escape(repr(name)) + "$"):
        reg.register(name)(_target("mine", "f"))
    assert reg.names() == []
    with pytest.raises(UserError, match=r"^unknown thing 'x' \(known: \)$"):  # (listing the names still works)
        reg.entry("x")


def test_good_names_are_kept():
    reg = Registry("thing")
    for name in ("p2c", "nearest-with-capacity", "prefix_cache", "my.policy", "@cf/x", "café"):
        reg.register(name)(_target("mine", name))
    assert len(reg.names()) == 6


def test_the_same_definition_again_replaces_the_entry():
    """A notebook cell run again (or importlib.reload) makes a new object of the same module and qualname."""
    reg = Registry("thing")
    first, again = _target("mine", "Policy"), _target("mine", "Policy")
    reg.register("p")(first)
    reg.register("p")(again)
    assert reg.get("p") is again


@pytest.mark.parametrize("module, qualname", [("mine", "Other"), ("yours", "Policy")])
def test_another_target_under_a_taken_name_is_refused(module, qualname):
    reg = Registry("thing")
    first = _target("mine", "Policy")
    reg.register("p")(first)
    with pytest.raises(ValueError, match=r"^thing 'p' registered twice: the name is taken \(mine\.Policy\); pick "
                                         r"another name$"):
        reg.register("p")(_target(module, qualname))
    assert reg.get("p") is first


def test_a_shipped_name_is_never_replaced_by_a_users_target():
    from controlplane.placement import PLACEMENTS
    from controlplane.placement.greedy import GreedyDemand

    with pytest.raises(ValueError, match=r"^placement policy 'greedy-demand' registered twice: the name is shipped "
                                         r"with edgepop \(controlplane\.placement\.greedy\.GreedyDemand\)"):
        PLACEMENTS.register("greedy-demand")(type("GreedyDemand", (GreedyDemand,), {"__module__": "mine"}))
    assert PLACEMENTS.get("greedy-demand") is GreedyDemand


def test_a_users_module_reloaded_registers_its_policies_again(tmp_path, monkeypatch):
    from kit.plugins import write_module

    from controlplane.placement import PLACEMENTS

    write_module(tmp_path, "plug_reload")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("plug_reload")
    before = PLACEMENTS.get("busiest-sites")
    importlib.reload(module)
    assert PLACEMENTS.get("busiest-sites") is module.BusiestSites is not before
    assert sys.modules["plug_reload"] is module


def test_the_options_in_effect_are_the_defaults_then_the_given_ones():
    from controlplane.routing import ROUTERS

    assert ROUTERS.options_in_effect("least-ttft") == {"window_ms": 10.0, "prefill_estimate_scale": 1.0}
    assert ROUTERS.options_in_effect("p2c", {"k": 3}) == {"k": 3}
    assert ROUTERS.options_in_effect("nearest-with-capacity") == {"max_rtt_ms": None}
