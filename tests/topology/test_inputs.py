"""Inputs the topology takes: PoP and region tables (countries, tiers), latency parameters, coordinates and the
demand threshold; each bad value is refused in one line naming where it came from."""

import json
import math

import numpy as np
import pytest

from edgepop.errors import DataFileError, UserError
from topology import LatencyParams, Topology, baseline, core_rtt_ms, load_demand_points, load_pops
from topology.borders import node_countries
from topology.latency import PARAMS_FILE
from topology.regions import load_regions

INDIA_BLANK = ["IXC", "CCU", "PAT", "DEL", "BOM", "MAA", "BLR", "HYD", "AMD", "NAG"]


def _write(path, table):
    table.to_csv(path, index=False)
    return path


def _countries(topo):
    nodes = topo.latency.backbone.nodes
    cc = node_countries(nodes.lat.to_numpy(), nodes.lon.to_numpy(), nodes.cc.to_numpy())
    return dict(zip(nodes.name, cc, strict=True))


def _rtt(topo, a, b):
    ids = topo.pops.id.tolist()
    return topo.latency.node_rtt_matrix(np.array([ids.index(a)]), np.array([ids.index(b)]))[0, 0]


def test_a_pop_without_a_country_takes_its_nearest_citys_not_a_pop_across_the_border(topo, tmp_path):
    pops = load_pops()
    pops.loc[pops.id.isin(INDIA_BLANK), "cc"] = ""  # Chandigarh is 200 km from Lahore, Kolkata 240 km from Dhaka
    blank = Topology.load(pops=_write(tmp_path / "pops.csv", pops.drop(columns=["tier"])))
    got = _countries(blank)
    assert {p: got[p] for p in ("IXC", "CCU", "PAT")} == {"IXC": "IN", "CCU": "IN", "PAT": "IN"}
    assert _rtt(blank, "LHE", "DEL") == pytest.approx(_rtt(topo, "LHE", "DEL"))


def test_regions_take_their_documented_country_not_a_nearby_pops(tmp_path):
    regions = load_regions().set_index("id")
    assert (regions.cc != "").all()
    # Microsoft's published coordinates of Israel Central lie in the Sinai; its country is Israel all the same.
    assert regions.cc["azure:israelcentral"] == "IL" and regions.cc["azure:koreasouth"] == "KR"
    pops = load_pops()
    mideast = pops[pops.id.isin(["AMM", "BEY", "RUH", "JED", "CAI"])].drop(columns=["tier"])
    topo = Topology.load(pops=_write(tmp_path / "pops.csv", mideast))
    got = _countries(topo)
    assert {r: got[r] for r in ("aws:il-central-1", "gcp:me-west1", "azure:israelcentral")} == dict.fromkeys(
        ("aws:il-central-1", "gcp:me-west1", "azure:israelcentral"), "IL")
    idx, _ = topo.ingress(np.array([32.0853]), np.array([34.7818]))  # Tel Aviv: not across the IL-JO border
    assert topo.pops.id.iloc[idx[0]] != "AMM"


@pytest.mark.parametrize("value", ["IND", "ZZZZ", "ZZ", "1N"])
def test_an_unknown_country_code_is_refused_in_one_line(tmp_path, value):
    pops = load_pops().drop(columns=["tier"])
    row = int(np.flatnonzero(pops.id == "DEL")[0])
    pops.loc[row, "cc"] = value
    path = _write(tmp_path / "pops.csv", pops)
    with pytest.raises(DataFileError) as exc:
        load_pops(path)
    msg = str(exc.value)
    assert str(path) in msg and f"row {row + 2}" in msg and "'cc'" in msg and repr(value) in msg
    assert "\n" not in msg
    regions = load_regions()
    regions.loc[0, "cc"] = value
    with pytest.raises(DataFileError, match="field 'cc'"):
        load_regions(_write(tmp_path / "regions.csv", regions))


def test_a_lower_case_country_code_is_read_as_its_upper_case(tmp_path):
    pops = load_pops().drop(columns=["tier"])
    pops.loc[pops.id == "DEL", "cc"] = " in"
    assert load_pops(_write(tmp_path / "pops.csv", pops)).set_index("id").cc["DEL"] == "IN"


def test_a_given_tier_is_honoured_checked_and_derived_only_where_absent(tmp_path):
    pops = load_pops()
    derived = pops.set_index("id").tier
    pops["tier"] = ""
    pops.loc[pops.id == "FRA", "tier"] = "5"
    got = load_pops(_write(tmp_path / "pops.csv", pops)).set_index("id").tier
    assert got["FRA"] == 5 and derived["FRA"] != 5
    assert (got.drop("FRA") == derived.drop("FRA")).all()
    pops.loc[pops.id == "FRA", "tier"] = "9"
    with pytest.raises(DataFileError, match=r"row \d+, field 'tier': 9 is not a tier"):
        load_pops(_write(tmp_path / "pops.csv", pops))
    pops.loc[pops.id == "FRA", "tier"] = "big"
    with pytest.raises(DataFileError, match="field 'tier': bad value 'big'"):
        load_pops(_write(tmp_path / "pops.csv", pops))


@pytest.mark.parametrize(("field", "value"), [("alpha_land", 0.3), ("alpha_sea", 0.99), ("base_ms", -50.0),
                                              ("hop_ms", math.nan), ("attach_k", 0), ("attach_k", 1.5),
                                              ("knn", 0), ("max_link_km", math.inf), ("short_scale_km", 0.0),
                                              ("alpha_land", "1.5"), ("base_ms", True)])
def test_latency_parameters_out_of_the_calibrations_bounds_are_refused(tmp_path, field, value):
    with pytest.raises(UserError, match=f"'{field}'") as exc:
        LatencyParams(**{field: value})
    assert "\n" not in str(exc.value)
    raw = json.loads(PARAMS_FILE.read_text())
    raw[field] = value
    path = tmp_path / "params.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(DataFileError, match=f"{path}, field '{field}'"):
        LatencyParams.load(path)


def test_a_latency_parameter_file_with_an_unknown_key_or_no_object_is_refused(tmp_path):
    path = tmp_path / "params.json"
    path.write_text('{"alpha_lnd": 1.5}')
    with pytest.raises(DataFileError, match=r"field 'alpha_lnd': unknown"):
        LatencyParams.load(path)
    path.write_text("[1.5]")
    with pytest.raises(DataFileError, match="JSON object"):
        LatencyParams.load(path)
    with pytest.raises(UserError, match="params must be a LatencyParams"):
        Topology.load(params={"alpha_land": 1.5})
    assert LatencyParams(attach_k=2.0).attach_k == 2 and LatencyParams.load() == LatencyParams.load(PARAMS_FILE)


@pytest.mark.parametrize("lat", [95.0, -90.5, math.nan])
def test_the_module_level_core_rtt_refuses_bad_coordinates(lat):
    with pytest.raises(UserError, match="core_rtt_ms: latitudes must be in"):
        core_rtt_ms(lat, 0.0, 51.5, -0.12)
    with pytest.raises(UserError, match="core_rtt_ms"):
        core_rtt_ms(51.5, -0.12, np.array([10.0, lat]), np.array([0.0, 0.0]))


@pytest.mark.parametrize("value", [50_000_000, "30000", -1, math.nan, None, True])
def test_a_demand_threshold_that_is_no_number_or_leaves_no_city_is_refused(value):
    with pytest.raises(UserError, match="min_population") as exc:
        Topology.load(min_population=value)
    assert "\n" not in str(exc.value)
    with pytest.raises(UserError, match="min_population"):
        load_demand_points(value)


def test_a_baseline_set_whose_region_the_file_lacks_names_that_region():
    regions = load_regions()
    with pytest.raises(UserError) as exc:
        baseline("us-east", regions[regions.id != "aws:us-east-1"])
    msg = str(exc.value)
    assert "'aws:us-east-1'" in msg and "choose one of" not in msg
    with pytest.raises(UserError, match="unknown baseline 'nowhere'"):
        baseline("nowhere", regions)


@pytest.mark.parametrize("scale", [True, False, 0, -0.5, float("nan"), float("inf"), "1"])
def test_a_gpu_scale_that_is_no_positive_number_is_refused(topo, scale):
    """True compares equal to 1.0: it was taken as 'unscaled' instead of refused as a scale."""
    with pytest.raises(UserError, match="GPU inventory scale must be a positive number"):
        topo.with_gpu_scale(scale)
    assert topo.with_gpu_scale(1) is topo and topo.with_gpu_scale(1.0) is topo
