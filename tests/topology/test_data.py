"""PoPs, GPUs, regions, demand: counts, validity, inventory."""

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from edgepop.errors import UserError
from topology import BASELINE_SETS, baseline, diurnal_factor, load_gpus, load_pops, load_regions, local_hour


def test_at_least_300_real_pops_with_valid_fields():
    pops = load_pops()
    assert len(pops) >= 300
    assert pops.id.is_unique
    assert pops.lat.between(-90, 90).all() and pops.lon.between(-180, 180).all()
    assert set(pops.continent) <= {"AF", "AS", "EU", "NA", "OC", "SA"}
    assert (pops.metro_pop > 0).all()
    fra = pops.set_index("id").loc["FRA"]
    assert abs(fra.lat - 50.03) < 0.2 and abs(fra.lon - 8.56) < 0.2 and fra.tz == "Europe/Berlin"
    # Big metros get the top tier, small islands the bottom one.
    tiers = pops.set_index("id").tier
    assert tiers["NRT"] == 1 and tiers["GRU"] == 1 and tiers["GND"] == 5


def test_gpu_spec_table_has_published_figures():
    g = load_gpus().set_index("gpu")
    assert {"H100", "H200", "A100-80GB", "L40S", "L4", "T4"} <= set(g.index)
    assert g.loc["H100", "memory_gb"] == 80 and g.loc["H200", "memory_gb"] == 141
    assert g.loc["H200", "mem_bw_gbps"] > g.loc["H100", "mem_bw_gbps"] > g.loc["A100-80GB", "mem_bw_gbps"]
    assert g.loc["H100", "bf16_tflops"] > 3 * g.loc["A100-80GB", "bf16_tflops"] * 0.9


def test_inventory_follows_tiers(topo):
    per_pop = topo.nodes.groupby("pop_id").gpus.sum()
    tier = topo.pops.set_index("id").tier
    # Every PoP has at least one GPU and bigger tiers never have fewer GPUs than smaller ones.
    assert (per_pop.reindex(tier.index) >= 1).all()
    by_tier = per_pop.groupby(tier).min()
    assert list(by_tier.sort_index()) == sorted(by_tier, reverse=True)
    assert topo.nodes.node_id.is_unique


def test_baseline_sets_resolve():
    regions = load_regions()
    assert len(regions) >= 120
    assert list(baseline("big3", regions).id) == ["aws:us-east-1", "aws:us-west-2", "aws:eu-west-1"]
    assert len(baseline("global-6", regions)) == 6 and len(baseline("global-12", regions)) == 12
    assert set(BASELINE_SETS) == {"us-east", "big3", "global-6", "global-12"}
    assert set(BASELINE_SETS["global-6"]) < set(BASELINE_SETS["global-12"])
    east = baseline("us-east", regions).iloc[0]
    assert abs(east.lat - 39.0) < 0.5 and abs(east.lon + 77.5) < 0.5  # Ashburn, not a state centroid


def test_baseline_names_ignore_whitespace_and_errors_name_what_is_wrong():
    regions = load_regions()
    assert list(baseline(" big3 ", regions).id) == list(BASELINE_SETS["big3"])
    assert list(baseline(" aws:us-east-1 , aws:eu-west-1", regions).id) == ["aws:us-east-1", "aws:eu-west-1"]
    for name, message in [("us-east,", r"^baseline 'us-east,': an empty region id in the list \(a stray comma\?\)$"),
                          (" ", r"^baseline ' ' is empty: name a region set \(us-east, big3, .*\) or region ids$"),
                          ("aws:us-east-1, nope", r"^unknown baseline 'aws:us-east-1, nope': .*"
                                                  r"\(unknown region id\(s\): 'nope'\)$"),
                          (" mars ", r"^unknown baseline 'mars': choose one of us-east, big3, global-6, global-12 or "
                                     r"comma-separated region ids$")]:
        with pytest.raises(UserError, match=message):
            baseline(name, regions)


def test_demand_points_and_diurnal_curve(topo):
    d = topo.demand
    assert len(d) >= 5000 and d.id.is_unique
    assert abs(d.weight.sum() - 1) < 1e-9
    h = np.linspace(0, 24, 24 * 60, endpoint=False)
    f = diurnal_factor(h)
    assert abs(f.mean() - 1) < 1e-6
    assert 2 <= h[f.argmin()] <= 6 and 18 <= h[f.argmax()] <= 22
    # Noon UTC: evening in Tokyo, early morning in Los Angeles.
    hours = local_hour(["Asia/Tokyo", "America/Los_Angeles"], datetime(2024, 1, 15, 12, tzinfo=UTC))
    assert hours.tolist() == [21.0, 4.0]


@pytest.mark.parametrize("package", ["topology", "controlplane", "sim"])
def test_every_shipped_data_file_is_attributed(package):
    """Each file of a package's data folder is named in its ATTRIBUTION.md (its source and licence)."""
    folder = Path(__file__).resolve().parents[2] / package / "data"
    said = (folder / "ATTRIBUTION.md").read_text()
    files = [p.name for p in folder.iterdir() if p.is_file() and p.suffix not in (".py", ".md")
             and not p.name.startswith((".", "__"))]
    assert files and not [f for f in files if f"`{f}`" not in said]
