"""Sweep grids: parsing and validation (axes, named variants, defaults, the embedded grid), each mistake one line
naming the grid file, key and value, before any variant runs."""

from __future__ import annotations

import pytest

from edgepop.errors import UserError
from sim.grid import load_grid, parse_grid

# 2 x 2 variants (the grid test_sweep.py runs)
GRID = {"base": "small", "requests": 250,
        "axes": {"edge.placement": ["everywhere-fits"], "edge.router": ["nearest-with-capacity", "p2c"],
                 "workload.rps": [20, 60.0]}}


def test_variants_are_the_ordered_product_with_seeds_innermost():
    g = parse_grid({**GRID, "seeds": [3, 4]}, "g.toml")
    assert len(g.variants) == 2 * 2 * 2
    assert [v.id for v in g.variants] == list(range(8))
    assert [v.seed for v in g.variants] == [3, 4] * 4
    assert [(v.values["edge.router"], v.values["workload.rps"]) for v in g.variants[::2]] == [
        ("nearest-with-capacity", 20), ("nearest-with-capacity", 60.0), ("p2c", 20), ("p2c", 60.0)]
    v = g.variants[5]
    assert v.scenario.edge.router == "p2c" and v.scenario.workload.rps == 20.0
    assert v.scenario.edge.placement == "everywhere-fits"
    assert v.scenario.central.router == "nearest-balanced"  # only the addressed table changes
    assert v.label == "edge.placement='everywhere-fits', edge.router='p2c', workload.rps=20, seed=4"
    assert g.axis_column("workload.rps") == [20.0, 60.0]  # one type per column: ints widened with floats


def test_an_option_axis_is_judged_with_the_axis_that_makes_it_valid():
    g = parse_grid({"base": "small", "axes": {"edge.router": ["p2c"], "edge.router_options.k": [2, 3]}}, "g.toml")
    assert [v.scenario.edge.router_options for v in g.variants] == [{"k": 2}, {"k": 3}]
    with pytest.raises(UserError, match=r"axis 'edge.router_options.k' value 2: .*no option 'k'"):
        parse_grid({"base": "small", "axes": {"edge.router": ["p2c", "nearest-with-capacity"],
                                              "edge.router_options.k": [2]}}, "g.toml")


def test_a_table_field_key_may_hold_dots():
    """A mix weight axis names a model id, and ids hold dots (llama-3.1, bge-base-en-v1.5)."""
    key = "workload.mix.@cf/meta/llama-3.2-1b-instruct"  # ablation's mix is llama-3.1-8b alone: a second model
    g = parse_grid({"base": "ablation", "axes": {key: [0.5, 2.0]}}, "g.toml")
    assert [v.scenario.workload.mix for v in g.variants] == [
        {"@cf/meta/llama-3.1-8b-instruct": 1.0, "@cf/meta/llama-3.2-1b-instruct": share} for share in (0.5, 2.0)]


def test_a_mix_key_needs_a_mix_table_in_the_base(tmp_path):
    """small has no mix (the default mix): a mix.<model> key would make that model the whole mix, every value
    of the axis the same 100% of it."""
    path = tmp_path / "g3.toml"
    path.write_text('base = "small"\nrequests = 300\n[axes]\n'
                    '"workload.mix.@cf/meta/llama-3.1-8b-instruct" = [0.2, 0.5]\n')
    with pytest.raises(UserError, match=r"^g3\.toml: axis 'workload\.mix\.@cf/meta/llama-3\.1-8b-instruct': base "
                                        r"scenario 'small' has no \[workload\] mix table: .*whole mix; give "
                                        r"workload\.mix whole"):
        load_grid(path)
    with pytest.raises(UserError, match=r"variant 'a' key 'workload\.mix\.@cf/meta/llama-3\.1-8b-instruct': base "
                                        r"scenario 'small' has no \[workload\] mix"):
        parse_grid({"base": "small", "variants": [{"name": "a", "workload.mix.@cf/meta/llama-3.1-8b-instruct": 1}]},
                   "g.toml")
    # tables whose absence means "the defaults" take a key: the rest stays default
    g = parse_grid({"base": "small", "axes": {"workload.tokens.text-generation": [{"output": {"median": 50}}],
                                              "techniques.spec_acceptance.text-generation": [0.5]}}, "g.toml")
    sc = g.variants[0].scenario
    assert sc.workload.tokens["text-generation"].output.median == 50 and len(sc.workload.tokens) > 1
    assert sc.techniques.spec_acceptance == {"text-generation": 0.5} and sc.workload.mix is None


def test_defaults_table_keys_and_embedded_grid(tmp_path):
    g = parse_grid({"base": "small"}, "g.toml")
    assert len(g.variants) == 1 and g.seeds == (7,) and g.deployments == ("edge", "central")
    g = parse_grid({"base": "small", "deployments": ["central", "edge"],
                    "axes": {"edge.placement_options.min_gain_ms_per_gb": [1e-7, 1e-6], "slo.ttft_ms": [500.0],
                             "planning_rps": [30.0], "central.enabled": [True, False]}}, "g.toml")
    assert g.deployments == ("edge", "central")
    assert g.variants[0].scenario.edge.placement_options == {"min_gain_ms_per_gb": 1e-7}
    assert g.variants[0].scenario.slo.ttft_ms == 500.0 and g.variants[0].scenario.planning_rps == 30.0
    assert g.variants[1].scenario.central is None
    policies = load_grid("policies")
    assert len(policies.variants) == 6 and policies.requests == 2000
    (tmp_path / "mine.toml").write_text('[workload]\nrequests = 10\nrps = 3.0\n')
    (tmp_path / "grid.toml").write_text('base = "mine.toml"\n[axes]\n"workload.rps" = [1.0, 2.0]\n')
    g = load_grid(tmp_path / "grid.toml")  # a base path is relative to the grid file
    assert [v.scenario.workload.rps for v in g.variants] == [1.0, 2.0]


@pytest.mark.parametrize("doc, message", [
    ({"base": "small", "axes": {"edge.placment": ["x"]}}, r"unknown axis 'edge.placment': \[edge\] has no field"),
    ({"base": "small", "axes": {"cloud.router": ["p2c"]}}, r"unknown axis 'cloud.router'"),
    ({"base": "small", "axes": {"seed": [1, 2]}}, r"unknown axis 'seed'.*seeds = \[...\]"),
    ({"base": "small", "axes": {"edge.router.k": [1]}}, r"only table fields"),
    ({"base": "small", "axes": {"edge": {"placement": ["ilp"]}}}, r"quote dotted keys"),
    ({"base": "small", "variants": [{"name": "a", "edge": {"placement": "ilp"}}]},
     r"^grid\.toml \[\[variants\]\] 'a': key 'edge' must be a value; quote dotted keys"),
    ({"base": "small", "axes": {"edge.router": "p2c"}}, r"'edge.router' must be a non-empty list"),
    # policy options are typed and checked when the grid is parsed, before anything runs
    ({"base": "small", "axes": {"edge.placement_options.time_limit_s": [1.0]}},
     r"placement policy 'greedy-demand' has no option 'time_limit_s' \(options: min_gain_ms_per_gb, swap_passes, swap_trials\)"),
    ({"base": "small", "axes": {"edge.router_options.k": ["4"]}, "deployments": ["edge"]},
     r"routing policy 'nearest-balanced' has no option 'k'"),
    ({"base": "small", "axes": {"edge.router": []}}, r"'edge.router' must be a non-empty list"),
    ({"base": "small", "axes": {"edge.router": ["p2c", "p2c"]}}, r"repeats a value"),
    ({"base": "small", "axes": {"edge.placement": ["ilp", "nope"]}},
     r"axis 'edge.placement' value 'nope': .*\[edge\]: field 'placement': unknown placement policy 'nope'"),
    ({"base": "small", "axes": {"central.router": ["fastest"]}}, r"value 'fastest'.*unknown routing policy"),
    ({"base": "small", "axes": {"workload.rps": [10.0, -3.0]}}, r"axis 'workload.rps' value -3.0: .*rps must be in \(0, 1e\+07\]"),
    ({"base": "small", "axes": {"edge.queue_limit": ["big"]}}, r"value 'big': .*'queue_limit' must be a whole number"),
    ({"base": "small", "axes": {"workload.kind": ["azure"]}}, r"value 'azure': .*does not apply to kind"),
    ({"base": "small", "axes": {"faults": [["pop:FRA@bad"]]}}, r"axis 'faults' value \['pop:FRA@bad'\]"),
    ({"base": "nosuch"}, r"base 'nosuch' not found"),
    ({"axes": {}}, r"'base' is required"),
    ({"base": "small", "rquests": 5}, r"unknown key 'rquests'"),
    ({"base": "small", "requests": 0}, r"requests must be a positive integer"),
    ({"base": "small", "requests": 5, "duration_s": 2.0}, r"not both"),
    # the grid's size is set on every variant last: an axis or a variant varying it would be overridden silently
    ({"base": "small", "requests": 200, "axes": {"workload.requests": [100, 300]}},
     r"'workload.requests' varies the size, which the grid's requests = 200 sets"),
    ({"base": "small", "duration_s": 5.0, "variants": [{"name": "long", "workload.duration_s": 9.0}]},
     r"'workload.duration_s' varies the size"),
    ({"base": "small", "seeds": [1, 1]}, r"seeds must be a non-empty list of distinct"),
    ({"base": "small", "seeds": [2**64]}, r"seeds must be .* integers in \[0, 2\*\*63 - 1\]"),
    ({"base": "small", "deployments": ["edge", "cloud"]}, r"deployments must be"),
    # a baseline that is no name at all (a list or table is not hashable: it crashed the lookup)
    ({"base": "small", "baseline": [1], "variants": [{"name": "a"}]},
     r"^grid\.toml: baseline must be a variant name, got \[1\]$"),
    ({"base": "small", "baseline": {"name": "a"}, "variants": [{"name": "a"}]},
     r"^grid\.toml: baseline must be a variant name, got \{'name': 'a'\}$"),
    # an unquoted dotted key arrives as nested tables: the hint quotes its whole path
    ({"base": "small", "variants": [{"name": "a", "edge": {"router_options": {"window_ms": 5.0}}}]},
     r"key 'edge' must be a value; quote dotted keys, e.g. \"edge\.router_options\.window_ms\" = \.\.\.$"),
    # a quoted key whose value is a table is quoted already: an axis still needs a list of values
    ({"base": "small", "axes": {"edge.router_options": {"window_ms": 5.0}}},
     r"axis 'edge.router_options' must be a non-empty list of values, got \{'window_ms': 5.0\}$"),
    # a key of a deployment the grid does not simulate would label variants that run identically
    ({"base": "small", "deployments": ["edge"], "axes": {"central.baseline": ["big3", "global-12"]}},
     r"axis 'central.baseline' sets the central deployment, which deployments = \['edge'\] does not simulate"),
    ({"base": "small", "deployments": ["edge"], "variants": [{"name": "a", "central.enabled": False}]},
     r"variant 'a': key 'central.enabled' sets the central deployment"),
    ({"base": "small", "deployments": ["central"], "axes": {"edge.router": ["p2c", "nearest-balanced"]}},
     r"axis 'edge.router' sets the edge deployment, which deployments = \['central'\] does not simulate"),
    ({"base": "small", "deployments": ["central"], "axes": {"techniques.batch_policy": ["none", "night"]}},
     r"axis 'techniques.batch_policy' acts on the edge deployment, which deployments = \['central'\]"),
])
def test_bad_grids_are_one_line_errors_naming_key_and_value(doc, message):
    with pytest.raises(UserError, match=message) as info:
        parse_grid(doc, "grid.toml")
    text = str(info.value)
    assert text.startswith("grid.toml") and "\n" not in text


@pytest.mark.parametrize("doc, message", [
    ({"axes": {"edge.router_options.window_ms": [1.0, 500.0], "edge.router_options": [{"window_ms": 50.0}]}},
     r"axis 'edge\.router_options\.window_ms' sets a key of 'edge\.router_options', which \[axes\] also varies as "
     r"a whole .*: drop one of them$"),
    ({"variants": [{"name": "a", "edge.router_options": {"window_ms": 50.0}}],
      "axes": {"edge.router_options.window_ms": [1.0, 500.0]}},
     r"variant 'a' sets 'edge\.router_options', which \[axes\] also varies as 'edge\.router_options\.window_ms'"),
    ({"variants": [{"name": "a", "edge.router_options.window_ms": 5.0}],
      "axes": {"edge.router_options": [{"window_ms": 50.0}]}},
     r"variant 'a' sets 'edge\.router_options\.window_ms', which \[axes\] also varies as 'edge\.router_options'"),
    ({"variants": [{"name": "a", "edge.router_options.window_ms": 5.0, "edge.router_options": {"window_ms": 50.0}}]},
     r"variant 'a' sets both 'edge\.router_options\.window_ms' and 'edge\.router_options'"),
])
def test_a_table_and_one_of_its_keys_are_not_set_together(doc, message):
    """The last one written would win, whole or in part: variants labelled with values they did not run."""
    with pytest.raises(UserError, match=message) as info:
        parse_grid({"base": "small", "requests": 100, **doc}, "g5.toml")
    assert str(info.value).startswith("g5.toml: ") and "\n" not in str(info.value)


@pytest.mark.parametrize("doc, message", [
    ({"axes": {"workload.rps": [20, 20.0]}}, r"^g\.toml \[axes\]: axis 'workload\.rps' repeats a value: \[20, 20\.0\]$"),
    ({"axes": {"edge.router_options": [{"window_ms": 5}, {"window_ms": 5.0}]}}, r"axis 'edge\.router_options' repeats"),
    ({"variants": [{"name": "a", "workload.rps": 20.0}, {"name": "b", "workload.rps": 20}]},
     r"^g\.toml \[\[variants\]\]: variants 'a' and 'b' set the same values: drop one of them$"),
    ({"variants": [{"name": "a"}, {"name": "b"}]}, r"variants 'a' and 'b' set the same values"),
])
def test_a_value_or_named_variant_that_repeats_is_refused(doc, message):
    with pytest.raises(UserError, match=message):
        parse_grid({"base": "small", **doc}, "g.toml")


def test_a_bool_is_not_the_number_one_when_values_are_compared():
    # not "repeats a value" / "set the same values": the 1 is a different value, which the scenario parser refuses
    for doc in ({"axes": {"techniques.prefix_cache": [True, 1]}},
                {"variants": [{"name": "on", "techniques.prefix_cache": True},
                              {"name": "one", "techniques.prefix_cache": 1}]}):
        with pytest.raises(UserError, match=r"'prefix_cache' must be true or false, got 1$"):
            parse_grid({"base": "small", **doc}, "g.toml")
    g = parse_grid({"base": "small", "axes": {"workload.rps": [20, 20.5]}}, "g.toml")
    assert [v.values["workload.rps"] for v in g.variants] == [20, 20.5]


def test_grid_refuses_a_variant_value_an_axis_would_overwrite():
    doc = {"base": "small", "requests": 100, "axes": {"edge.router": ["nearest-balanced", "p2c"]},
           "variants": [{"name": "a", "edge.router": "prefix-aware"}, {"name": "b"}]}
    with pytest.raises(UserError, match="variant 'a' sets 'edge.router', which \\[axes\\] also varies"):
        parse_grid(doc, source="t.toml")


TRACE_ROWS = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,100,10\n2023-11-16 18:15:47.00,200,20\n"


def _trace_grid(tmp_path, traces):
    (tmp_path / "good.csv").write_text(TRACE_ROWS)
    (tmp_path / "bad.csv").write_text(TRACE_ROWS + "2023-11-16 18:15:48,x,1\n")
    (tmp_path / "s.toml").write_text('name = "s"\n[workload]\nkind = "azure"\ntrace = "good.csv"\n')
    (tmp_path / "g.toml").write_text(f'base = "s.toml"\nseeds = [1, 2]\n[axes]\n"workload.trace" = {traces}\n'
                                     '"workload.trace_speed" = [1.0, 2.0]\n')
    return tmp_path / "g.toml"


@pytest.mark.parametrize("second, message", [
    ("nope.csv", r"g.toml: variant 4 \(workload.trace='nope.csv', workload.trace_speed=1.0, seed=1\): s.toml "
                 r"\[workload\]: .*nope.csv: no such file$"),
    ("bad.csv", r"g.toml: variant 4 .*: s.toml \[workload\]: .*bad.csv, line 4, field 'ContextTokens': 'x' is not")])
def test_every_trace_file_of_a_grid_is_read_before_any_variant_runs(tmp_path, second, message):
    with pytest.raises(UserError, match=message):
        load_grid(_trace_grid(tmp_path, f'["good.csv", "{second}"]'))


def test_a_grid_reads_each_trace_file_once_and_again_when_it_changes(tmp_path, monkeypatch):
    import os

    import sim.traces as traces

    reads = []
    entry = traces.TRACE_FORMATS.entry("azure")
    monkeypatch.setattr(entry, "target", lambda p, _read=entry.target: reads.append(p.name) or _read(p))
    path = _trace_grid(tmp_path, '["good.csv", "./good.csv"]')
    assert len(load_grid(path).variants) == 8 and reads == ["good.csv"]  # (8 variants, one file)
    load_grid(path)
    assert reads == ["good.csv"]  # unchanged: not read again
    good = tmp_path / "good.csv"
    good.write_text(TRACE_ROWS.replace(",x,", ",1,") + "2023-11-16 18:15:48,x,1\n")
    os.utime(good, ns=(good.stat().st_atime_ns, good.stat().st_mtime_ns + 10**9))
    with pytest.raises(UserError, match="good.csv, line 4"):
        load_grid(path)
    assert reads == ["good.csv", "good.csv"]
