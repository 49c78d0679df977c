"""`edgepop topology` end to end, and bad-file errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgepop.cli import main
from edgepop.errors import DataFileError
from topology import load_gpus, load_pops

POP_HEADER = "id,city,country,cc,continent,lat,lon,tz,metro_pop\n"


def test_topology_json_and_map(tmp_path, capsys):
    assert main(["topology", "--json", "--out", str(tmp_path)]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["pops"] >= 300 and sum(s["pops_per_continent"].values()) == s["pops"]
    assert s["edge"]["within_50ms"] > s["baselines"]["global-6"]["within_50ms"] > s["baselines"]["us-east"]["within_50ms"]
    png = tmp_path / "map.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 50_000
    assert json.loads((tmp_path / "summary.json").read_text())["pops"] == s["pops"]


def test_coverage_of_the_people_online(tmp_path, capsys):
    assert main(["topology", "--json", "--out", str(tmp_path / "p")]) == 0
    by_population = json.loads(capsys.readouterr().out)
    assert main(["topology", "--json", "--demand-weight", "internet_users", "--out", str(tmp_path / "o")]) == 0
    online = json.loads(capsys.readouterr().out)
    assert "demand_weight" not in by_population and online["demand_weight"] == "internet_users"
    # more of the people online live near the six regions than of the population (Europe and North America weigh
    # more, Africa less)
    assert online["baselines"]["global-6"]["within_50ms"] > by_population["baselines"]["global-6"]["within_50ms"]
    assert online["baselines"]["global-6"]["median_rtt_ms"] < by_population["baselines"]["global-6"]["median_rtt_ms"]
    assert main(["topology", "--demand-weight", "internet_users", "--out", str(tmp_path / "t")]) == 0
    assert "Share of the people online of" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("AAA,A,X,FR,EU,91,0,Europe/Paris,1000\n", "row 2, field 'lat'"),
        ("AAA,A,X,FR,EU,10,0,Europe/Paris,1000\nAAA,B,X,FR,EU,10,0,Europe/Paris,1000\n", "row 3, field 'id'"),
        ("AAA,A,X,FR,XX,10,0,Europe/Paris,1000\n", "field 'continent'"),
        ("AAA,A,X,FR,EU,ten,0,Europe/Paris,1000\n", "bad value 'ten'"),
        ("AAA,A,X,FR,EU,10,0,Mars/Olympus,1000\n", "unknown IANA time zone"),
        ("AAA,A,X,FR,EU,10,0,America,1000\n", "row 2, field 'tz': unknown IANA time zone 'America'"),  # a folder
        # a blank line is no row, but it is a line: the error names the line the bad row is on
        ("AAA,A,X,FR,EU,10,0,Europe/Paris,1000\n\nBBB,B,X,FR,EU,95,0,Europe/Paris,1000\n", "row 4, field 'lat'"),
    ],
)
def test_bad_pop_file_names_row_and_field(tmp_path, body, needle):
    f = tmp_path / "pops.csv"
    f.write_text(POP_HEADER + body)
    with pytest.raises(DataFileError) as exc:
        load_pops(f)
    assert str(f) in str(exc.value) and needle in str(exc.value)


def test_pop_file_header_with_a_byte_order_mark_or_a_column_twice(tmp_path):
    f = tmp_path / "pops.csv"
    row = "AAA,Paris,France,FR,EU,48.86,2.35,Europe/Paris,12000000\n"
    f.write_text("\ufeff" + POP_HEADER + row, encoding="utf-8")  # a spreadsheet's "CSV UTF-8"
    assert list(load_pops(f).id) == ["AAA"]
    f.write_text(POP_HEADER.strip() + ",,\n" + row.strip() + ",,\n")  # a spreadsheet's empty columns: fine
    assert list(load_pops(f).id) == ["AAA"]
    f.write_text("id," + POP_HEADER + "BBB," + row)  # the reader kept the last 'id' without a word
    with pytest.raises(DataFileError, match="row 1, field 'id': column appears more than once"):
        load_pops(f)


def test_tier_errors_name_the_line_in_the_file_not_the_sorted_row(tmp_path, capsys):
    f = tmp_path / "tiers.csv"
    f.write_text("tier,min_metro_pop,nodes\n5,0,Bogus9x1\n4,500000,L4x1\n3,1000000,L4x2\n")
    assert main(["topology", "--tiers", str(f), "--out", str(tmp_path / "o")]) == 2
    assert "row 2, field 'nodes': unknown GPU type 'Bogus9'" in capsys.readouterr().err
    # a --gpus file without a type the shipped tiers use: the error names that file too
    gpus = tmp_path / "gpus.csv"
    shipped = (Path(__file__).resolve().parents[2] / "topology" / "data" / "gpus.csv").read_text().splitlines()
    gpus.write_text("\n".join([shipped[0], *(line for line in shipped[1:] if line.startswith("H100,"))]) + "\n")
    assert main(["topology", "--gpus", str(gpus), "--out", str(tmp_path / "o")]) == 2
    assert f"unknown GPU type 'H200' (known: ['H100'], from {gpus})" in capsys.readouterr().err


def test_the_map_shows_pops_beyond_the_inhabited_band(tmp_path):
    from topology import Topology
    from topology.report import draw_map, map_latitudes

    f = tmp_path / "pops.csv"
    f.write_text(POP_HEADER + "AAA,McMurdo,Antarctica,AQ,AN,-77.85,166.67,Antarctica/McMurdo,1000\n"
                 "BBB,Paris,France,FR,EU,48.86,2.35,Europe/Paris,12000000\n")
    topo = Topology.load(pops=f)
    assert map_latitudes(topo)[0] <= -77.85 - 5 and map_latitudes(Topology.load()) == (-60.0, 80.0)
    assert draw_map(topo, tmp_path / "map.png").exists()


def test_an_empty_table_file_says_so(tmp_path):
    """A 0-byte file was reported as its first field missing from the header; /dev/null as no such file."""
    f = tmp_path / "pops.csv"
    f.write_text("")
    for path in (f, "/dev/null"):
        with pytest.raises(DataFileError, match=r"is empty \(expected a header line naming the columns"):
            load_pops(path)


def test_bad_gpu_file_missing_column(tmp_path):
    f = tmp_path / "gpus.csv"
    f.write_text("gpu,memory_gb\nX,80\n")
    with pytest.raises(DataFileError, match="field 'mem_bw_gbps': missing column"):
        load_gpus(f)


def test_cli_reports_bad_file_in_one_line_without_traceback(tmp_path):
    f = tmp_path / "regions.csv"
    f.write_text("id,provider,code,name,lat,lon\naws:x,aws,x,X,12,abc\n")
    r = subprocess.run([sys.executable, "-m", "edgepop", "topology", "--regions", str(f), "--out", str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
    assert "row 2, field 'lon'" in r.stderr
    assert not (tmp_path / "summary.json").exists()  # nothing half-written


def test_custom_pop_file_is_used(tmp_path, capsys):
    f = tmp_path / "pops.csv"
    f.write_text(POP_HEADER + "AAA,Paris,France,FR,EU,48.86,2.35,Europe/Paris,12000000\n"
                 "BBB,Tokyo,Japan,JP,AS,35.68,139.69,Asia/Tokyo,37000000\n")
    assert main(["topology", "--pops", str(f), "--json", "--out", str(tmp_path)]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["pops"] == 2 and s["pops_per_tier"] == {"1": 2}


def test_a_negative_last_mile_is_refused(tmp_path, capsys):
    assert main(["topology", "--last-mile-ms", "-5", "--out", str(tmp_path / "t")]) == 2
    assert capsys.readouterr().err.strip() == "edgepop: error: --last-mile-ms must be in [0, 86400000], got -5"
    assert not (tmp_path / "t").exists()



def test_a_region_table_without_a_baseline_sets_regions_reports_the_rest(tmp_path, capsys):
    from pathlib import Path

    shipped = Path(__file__).resolve().parents[2] / "topology" / "data" / "regions.csv"
    lines = shipped.read_text().splitlines()
    f = tmp_path / "noaws.csv"
    f.write_text("\n".join([lines[0], *(row for row in lines[1:] if not row.startswith("aws:"))]) + "\n")
    assert main(["topology", "--regions", str(f), "--json", "--out", str(tmp_path / "o")]) == 0
    s = json.loads(capsys.readouterr().out)
    assert "us-east" in s["baselines_skipped"] and "us-east" not in s["baselines"]
    assert (tmp_path / "o" / "map.png").is_file()


def test_median_rtt_is_over_the_population():
    from topology import Topology
    from topology.report import population_median, summary

    topo = Topology.load()
    s = summary(topo)
    lat, lon = topo.demand.lat.to_numpy(), topo.demand.lon.to_numpy()
    edge = topo.user_pop_rtt(lat, lon, 0.0).min(axis=1)
    w = topo.demand.population.to_numpy(dtype=float)
    m = population_median(topo, edge)
    assert w[edge <= m].sum() >= 0.5 * w.sum() > w[edge < m].sum()
    assert s["edge"]["median_rtt_ms"] == round(m, 1)


def test_two_tiers_starting_at_the_same_population_are_refused(tmp_path, capsys):
    f = tmp_path / "tiers.csv"
    f.write_text("tier,min_metro_pop,nodes\n1,10000000,H100x8\n2,10000000,L40Sx2\n3,0,L4x1\n")
    assert main(["topology", "--tiers", str(f), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "row 3, field 'min_metro_pop': tier 2 starts at 10000000 as tier 1 does" in err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_out_under_the_home_folder(tmp_path, monkeypatch, capsys):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    assert main(["topology", "--json", "--out", "~/t"]) == 0
    assert {p.name for p in (home / "t").iterdir()} == {"summary.json", "map.png", ".edgepop-runs"}
    assert not (cwd / "~").exists()


def _sigterm_wrapped(topo, path):
    """What a SIGTERM inside matplotlib's lazy import looked like: the handler's Terminated, raised, flagged and
    wrapped by the import machinery into another exception."""
    from edgepop.errors import Terminated, on_sigterm

    try:
        on_sigterm()
    except Terminated as exc:
        raise RuntimeError("Error calling __set_name__ on '_axis_method_wrapper' instance") from exc


def test_a_sigterm_wrapped_by_the_map_drawing_ends_with_143_and_writes_nothing(tmp_path, monkeypatch, capsys):
    import topology.report
    from edgepop.errors import forget_sigterm

    monkeypatch.setattr(topology.report, "draw_map", _sigterm_wrapped)
    try:
        assert main(["topology", "--out", str(tmp_path / "out")]) == 143
    finally:
        forget_sigterm()
    err = capsys.readouterr().err
    assert err.strip() == "edgepop: terminated" and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # no summary.json without its map, no staging folder left


def test_a_failed_map_leaves_the_earlier_outputs_and_a_folder_in_the_way_is_kept(tmp_path, monkeypatch, capsys):
    """Both files or neither: the summary is not written when the map fails; a folder named like an output is the
    user's: refused before the work and left as it is, never replaced by the file."""
    import topology.report

    out = tmp_path / "out"
    (out / "map.png").mkdir(parents=True)
    (out / "map.png" / "mine.png").write_text("mine")
    assert main(["topology", "--out", str(out)]) == 2
    assert "map.png is a folder, where the command writes a file" in capsys.readouterr().err
    assert (out / "map.png" / "mine.png").read_text() == "mine"
    (out / "map.png" / "mine.png").replace(out / "notes.txt")
    (out / "map.png").rmdir()
    (out / "map.png").write_text("earlier")

    def boom(topo, path):
        raise OSError(28, "No space left on device", str(path))

    with monkeypatch.context() as m:
        m.setattr(topology.report, "draw_map", boom)
        assert main(["topology", "--out", str(out)]) == 1
    assert "No space left" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in out.iterdir()) == ["map.png", "notes.txt"]
    assert (out / "map.png").read_text() == "earlier"
    assert main(["topology", "--json", "--out", str(out)]) == 0
    assert (out / "map.png").is_file() and (out / "summary.json").is_file() and (out / "notes.txt").exists()
