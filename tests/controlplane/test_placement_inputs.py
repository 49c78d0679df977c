"""PlacementProblem and its model mix refuse bad input with one UserError naming the field and the value; so do
per-pop's options and ``edgepop place``. Which rules a policy packs under."""

import json

import numpy as np
import pandas as pd
import pytest

from controlplane.catalog import default_catalog
from controlplane.fleet import edge_fleet
from controlplane.placement import PlacementProblem
from edgepop.cli import main
from edgepop.errors import UserError

L8 = "@cf/meta/llama-3.1-8b-instruct"
E = "@cf/baai/bge-base-en-v1.5"
SITES = ["AMS", "FRA"]


@pytest.fixture(scope="module")
def fleet(topo):
    return edge_fleet(topo, SITES)


def problem(topo, fleet, demand=None, **options):
    demand = pd.DataFrame({L8: [5.0]}, index=["AMS"]) if demand is None else demand
    return PlacementProblem(topo=topo, catalog=default_catalog(), fleet=fleet, demand=demand, **options)


def test_a_valid_problem_is_accepted(topo, fleet):
    p = problem(topo, fleet, prompt_tokens={L8: 300}, output_tokens={L8: 0}, prompt_mix={L8: [(100, 1), (500, 0)]},
                rtt=np.zeros((len(topo.pops), len(SITES))), overcommit=True, overcommit_ratio=1.5)
    assert p.prompt_tokens[L8] == 300 and p.prompt_mix[L8] == ((100.0, 1.0), (500.0, 0.0))


@pytest.mark.parametrize("value", [-5.0, np.nan, np.inf])
def test_rtt_values_must_be_finite_and_non_negative(topo, fleet, value):
    rtt = np.ones((len(topo.pops), len(SITES)))
    rtt[3, 1] = value
    with pytest.raises(UserError, match=rf"rtt matrix: entry \(PoP '{topo.pops.id.iloc[3]}', site 'FRA'\) is "
                                        rf"{value}; RTTs must be finite and non-negative"):
        problem(topo, fleet, rtt=rtt)


@pytest.mark.parametrize(("field", "value", "need"), [
    ("prompt_tokens", -5000, "non-negative"), ("prompt_tokens", np.nan, "non-negative"),
    ("prompt_tokens", "512", "non-negative"), ("output_tokens", -1, "non-negative"),
    ("output_tokens", np.nan, "non-negative"), ("output_tokens", np.inf, "non-negative")])
def test_request_shape_sizes_must_be_finite(topo, fleet, field, value, need):
    with pytest.raises(UserError, match=rf"'{field}': size of '{L8}' must be a finite {need} number, "
                                        rf"got {value!r}"):
        problem(topo, fleet, **{field: {L8: value}})
    problem(topo, fleet, **{field: {L8: 0}})  # a trace's mean of 0 tokens is a size (capacity counts one token)


@pytest.mark.parametrize("field", ["prompt_tokens", "output_tokens", "prompt_mix"])
def test_shape_keys_must_name_catalog_models(topo, fleet, field):
    value = [(1.0, 1.0)] if field == "prompt_mix" else 5.0
    with pytest.raises(UserError, match=rf"placement field '{field}': no model '@cf/nope/x' in the catalog"):
        problem(topo, fleet, **{field: {"@cf/nope/x": value}})


@pytest.mark.parametrize(("mix", "message"), [
    ([1, 2], r"must list \(prompt units, share\) pairs, got \[1, 2\]"),
    ([(512, np.nan)], "each entry must be a pair of finite numbers"),
    ([(512, 1, 3)], "each entry must be a pair of finite numbers"),
    ([(512, "1")], "each entry must be a pair of finite numbers"),
    ([(0, 1)], "prompt units must be positive and shares non-negative"),
    ([(512, -1), (100, 2)], "prompt units must be positive and shares non-negative"),
    ([(512, 0)], "the shares sum to zero")])
def test_prompt_mix_must_be_pairs_of_positive_sizes_and_shares(topo, fleet, mix, message):
    with pytest.raises(UserError, match=rf"placement field 'prompt_mix' of '{L8}'.*{message}"):
        problem(topo, fleet, prompt_mix={L8: mix})


@pytest.mark.parametrize(("options", "message"), [
    ({"utilisation_cap": "0.5"}, "'utilisation_cap' must be a positive number, got '0.5'"),
    ({"candidates_k": "3"}, "'candidates_k' must be a positive number, got '3'"),
    ({"unserved_penalty_ms": None}, "'unserved_penalty_ms' must be a positive number, got None"),
    ({"overcommit": True, "overcommit_ratio": np.inf}, "'overcommit_ratio' must be a finite number of at least 1"),
    ({"overcommit": True, "overcommit_ratio": np.nan}, "'overcommit_ratio' must be a finite number of at least 1"),
    ({"overcommit": True, "overcommit_ratio": "2"}, "'overcommit_ratio' must be a finite number of at least 1"),
    ({"overcommit": "yes"}, "'overcommit' must be true or false")])
def test_option_types_and_ranges(topo, fleet, options, message):
    with pytest.raises(UserError, match=f"placement option {message}"):
        problem(topo, fleet, **options)


def test_a_model_may_have_one_demand_column(topo, fleet):
    demand = pd.DataFrame([[1.0, 2.0]], index=["AMS"], columns=[L8, L8])
    with pytest.raises(UserError, match=f"demand: model '{L8}' has more than one column"):
        problem(topo, fleet, demand=demand)


def test_an_ingress_pop_may_have_one_demand_row(topo, fleet):
    demand = pd.DataFrame({L8: [1.0, 3.0, 2.0]}, index=["AMS", "FRA", "AMS"])
    with pytest.raises(UserError, match="^demand: ingress PoP 'AMS' has more than one row$"):
        problem(topo, fleet, demand=demand)


def test_demand_rates_must_be_numbers(topo, fleet):
    with pytest.raises(UserError, match="demand: every rate must be a number of requests/s"):
        problem(topo, fleet, demand=pd.DataFrame({L8: ["a"]}, index=["AMS"]))


# ---------------------------------------------------------------- the model mix of PlacementProblem.build
def test_an_empty_mix_is_an_error_and_none_is_the_default(topo, fleet):
    with pytest.raises(UserError, match="^the model mix is empty$"):
        PlacementProblem.build(topo, fleet=fleet, total_rps=10, mix={})
    assert L8 in PlacementProblem.build(topo, fleet=edge_fleet(topo), total_rps=100, mix=None).models


@pytest.mark.parametrize(("mix", "message"), [
    ({L8: "1"}, f"model mix: share of '{L8}' must be a non-negative number, got '1'"),
    ([L8], "the model mix must map model ids to shares"),
    (L8, "the model mix must map model ids to shares")])
def test_malformed_mixes(topo, fleet, mix, message):
    with pytest.raises(UserError, match=message):
        PlacementProblem.build(topo, fleet=fleet, total_rps=10, mix=mix)


def test_a_catalog_given_as_a_path_is_refused(topo, fleet):
    with pytest.raises(UserError, match="catalog must be a Catalog .*got 'x.toml'"):
        PlacementProblem.build(topo, catalog="x.toml", fleet=fleet, total_rps=10, mix={L8: 1.0})


def test_place_with_another_catalog_and_the_default_mix_names_the_mix(tmp_path, capsys):
    spec = default_catalog()[E]
    (tmp_path / "own.toml").write_text(
        f'[models."@my/org/enc"]\ntask = "text-embeddings"\nfamily = "bert"\nparameters = {spec.parameters}\n'
        f'precision = "fp16"\ncontext_window = 512\nlayers = 12\nhidden = 768\nneurons_per_m_input = 100\n'
        'stand_in = "minilm-l6-v2"\n')
    assert main(["place", "--policy", "greedy-demand", "--catalog", str(tmp_path / "own.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert "has no model '@cf/meta/llama-3.1-8b-instruct', which the default mix uses: pass --models or --mix" in err
    assert "\n" not in err


@pytest.mark.parametrize("mix,message", [
    ({L8: 0.5, E: -0.5}, f"share of '{E}' must be a non-negative number, got -0.5"),
    ({L8: 3, "nope": 1}, "no model 'nope' in the catalog"),
    ({L8: 0, E: 0}, "shares sum to zero"),
])
def test_every_mix_file_error_names_the_file(tmp_path, capsys, mix, message):
    (tmp_path / "mix.json").write_text(json.dumps(mix))
    out = tmp_path / "out"
    assert main(["place", "--policy", "everywhere-fits", "--mix", str(tmp_path / "mix.json"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"edgepop: error: --mix {str(tmp_path / 'mix.json')!r}: {message}") and "\n" not in err
    assert not out.exists()


# ------------------------------------------------------------- policy options
@pytest.mark.parametrize(("pops", "message"), [
    ({L8: ["AMS", "FRA", "AMS", "AMS"]}, rf"pops\.{L8} names PoP\(s\) AMS more than once$"),
    ({L8: []}, rf"pops\.{L8} is empty: list the PoPs that hold it, or leave it out to place it at every PoP$")])
def test_per_pop_lists_with_repeats_or_nothing_are_refused_when_read(topo, fleet, pops, message):
    from controlplane.deployment import DeploymentConfig
    from controlplane.placement import get_policy

    with pytest.raises(UserError, match=r"^s\.toml \[edge\] placement_options: placement policy 'per-pop': " + message):
        DeploymentConfig(placement="per-pop", placement_options={"pops": pops}).check("s.toml [edge]")
    with pytest.raises(UserError, match=message):
        get_policy("per-pop", pops=pops)
    with pytest.raises(UserError, match=message):  # (a policy whose options were changed after it was made)
        policy = get_policy("per-pop")
        policy.pops = pops
        policy.place(problem(topo, fleet), np.random.default_rng(0))


@pytest.mark.parametrize(("argv", "message"), [
    (["--policy", "foo", "--time-limit", "3"], "unknown placement policy 'foo' (known: central, "),
    (["--policy", "foo", "--baseline", "big3"], "unknown placement policy 'foo' (known: central, "),
    (["--policy", "central", "--baseline", "us-east,"], "baseline 'us-east,': an empty region id in the list "
                                                        "(a stray comma?)"),
    (["--policy", "central", "--baseline", "us-east,nope"], "(unknown region id(s): 'us-east', 'nope')"),
    (["--policy", "central", "--baseline", " "], "baseline ' ' is empty: name a region set")])
def test_place_names_what_is_wrong(argv, message, capsys):
    assert main(["place", *argv, "--models", E, "--rps", "10"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("edgepop: error: ") and message in err and err.count("\n") == 1, err


def test_place_reads_a_baseline_with_spaces_around_it(capsys):
    assert main(["place", "--policy", "central", "--baseline", " big3", "--models", E, "--rps", "10", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fleet"] == "central:big3"


def test_everywhere_fits_follows_the_problems_one_llm_per_gpu(topo):
    """Memory alone decides only where the problem says so: deployments build it without one LLM per GPU."""
    from controlplane.placement import get_policy

    catalog = default_catalog()
    mix = {m: 1.0 for m in (L8, "@cf/meta/llama-3.2-1b-instruct", "@cf/meta/llama-3.2-3b-instruct", E)}
    policy = get_policy("everywhere-fits")
    assert policy.memory_only
    most = {}
    for one in (False, True):
        p = PlacementProblem.build(topo, fleet=edge_fleet(topo, SITES), total_rps=10.0, mix=mix, one_llm_per_gpu=one)
        table = policy.place(p, np.random.default_rng(0)).table
        llms = table[[catalog[m].generative for m in table.model]].explode("gpu_index")
        most[one] = int(llms.groupby(["node", "gpu_index"]).size().max())
    assert most == {False: 3, True: 1}
