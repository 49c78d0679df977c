"""A custom PoP file whose coordinates are no site (swapped, in the sea, a contradicting cc, one site twice) is
refused in one line; every PoP the project ships passes."""

from pathlib import Path

import pytest

from edgepop.cli import main
from edgepop.errors import DataFileError
from topology import load_pops
from topology.pop_sites import FAR_KM, check_sites
from topology.tables import DATA_DIR

SHIPPED = DATA_DIR / "pops.csv"
NL = "Netherlands,NL,EU,Europe"


def _file(tmp_path: Path, row: str) -> Path:
    """The first three rows of the shipped file (Amsterdam, Athens, Barcelona) and one more on line 5."""
    f = tmp_path / "pops.csv"
    f.write_text("\n".join(SHIPPED.read_text().splitlines()[:4] + [row]) + "\n")
    return f


@pytest.mark.parametrize(("row", "needle"), [
    (f"AMX,Amsterdam,{NL},4.88969,52.37403,Europe/Amsterdam,4552678,x",  # off Somalia
     "row 5: PoP 'AMX' at lat 4.88969, lon 52.37403 is 445 km from the nearest city of 15,000 people or more "
     "(at most 150 km is a site); lat and lon swapped? lat 52.37403, lon 4.88969 is 0 km from Amsterdam (NL)"),
    ("NEM,Point Nemo,,,OC,Oceania,-48.87,-123.39,Pacific/Pitcairn,1000,x",
     "row 5: PoP 'NEM' at lat -48.87, lon -123.39 is 2711 km from the nearest city of 15,000 people or more "
     "(at most 150 km is a site)"),
    ("AMX,Amsterdam,France,FR,EU,Europe,52.37403,4.88969,Europe/Amsterdam,4552678,x",
     "row 5, field 'cc': PoP 'AMX' says 'FR' but its nearest city, Amsterdam (0 km), is in 'NL' and none in 'FR' "
     "lies within 25 km (lat 52.37403, lon 4.88969)"),
    (f"AMX,Amsterdam,{NL},52.37403,4.88969,Europe/Amsterdam,4552678,x",
     "row 5: PoP 'AMX' at lat 52.37403, lon 4.88969 is 0.00 km from PoP 'AMS' (row 2): the same site twice"),
], ids=["swapped", "ocean", "cc", "twice"])
def test_a_pop_that_is_no_site_is_refused_in_one_line(tmp_path, capsys, row, needle):
    f = _file(tmp_path, row)
    with pytest.raises(DataFileError) as exc:
        load_pops(f)
    assert str(exc.value).startswith(f"{f}, {needle}")
    out = tmp_path / "out"
    assert main(["topology", "--pops", str(f), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err
    assert not out.exists()


def test_a_wrong_cc_across_a_barred_border_is_refused(tmp_path):
    lahore = "LHX,Lahore,India,IN,AS,Asia,31.558,74.35071,Asia/Karachi,11000000,x"  # Pakistan's, said India's
    with pytest.raises(DataFileError, match=r"row 5, field 'cc': PoP 'LHX' says 'IN' .* is in 'PK'"):
        load_pops(_file(tmp_path, lahore))


@pytest.mark.parametrize("cc", ["CH", "FR", "DE"])
def test_a_site_at_a_border_may_name_either_country(tmp_path, cc):
    # Basel's airport lies in France, nearest Saint-Louis (FR), 5 km from Basel (CH) and 8 km from Loerrach (DE).
    row = f"BSL,Basel,X,{cc},EU,Europe,47.59,7.529,Europe/Zurich,800000,x"
    assert load_pops(_file(tmp_path, row)).id.iloc[-1] == "BSL"


def test_every_shipped_pop_passes(tmp_path):
    pops = load_pops()
    check_sites(pops, SHIPPED, list(range(2, len(pops) + 2)))  # (not re-checked on each load of the shipped file)
    copy = tmp_path / "pops.csv"
    copy.write_text(SHIPPED.read_text())  # a copy is a custom file: checked on load
    assert load_pops(copy).equals(pops)


def test_a_pop_in_a_country_without_cities_is_not_held_to_the_distance(tmp_path):
    mcmurdo = "MCM,McMurdo,Antarctica,AQ,AN,Antarctica,-77.85,166.67,Antarctica/McMurdo,1000,x"  # 3,800 km away
    assert load_pops(_file(tmp_path, mcmurdo)).cc.iloc[-1] == "AQ"
    with pytest.raises(DataFileError, match=f"from the nearest city .* \\(at most {FAR_KM:.0f} km is a site\\)"):
        load_pops(_file(tmp_path, mcmurdo.replace(",AQ,", ",,")))  # without its cc: no exemption
