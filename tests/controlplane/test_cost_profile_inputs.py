"""Measured profiles, billing, fleets and capacity refuse bad input with one UserError naming what is wrong."""

import pandas as pd
import pytest

from controlplane.billing import fleet_cost, invoice_requests
from controlplane.catalog import default_catalog
from controlplane.fleet import central_fleet, edge_fleet
from controlplane.perf import Roofline, capacity_rps
from controlplane.perf_profile import MeasuredProfile
from edgepop.errors import DataFileError, UserError

HEADER = "model,phase,batch_size,tokens,context,ms,provider,host\n"
GOOD = ("gpt2-tiny,prefill,1,16,0,10,CPU,vm\ngpt2-tiny,prefill,1,128,0,40,CPU,vm\n"
        "gpt2-tiny,decode,1,1,64,5,CPU,vm\ngpt2-tiny,decode,8,1,256,12,CPU,vm\n")
TINY = "@edgepop/gpt2-tiny"


def write(tmp_path, rows: str):
    path = tmp_path / "profile.csv"
    path.write_text(HEADER + GOOD + rows)
    return path


@pytest.mark.parametrize(("row", "column", "got"), [
    ("gpt2-tiny,prefill,1,16,0,abc,CPU,vm", "ms", "'abc'"),
    ("gpt2-tiny,prefill,1,abc,0,3,CPU,vm", "tokens", "'abc'"),
    ("gpt2-tiny,prefill,1,-16,0,3,CPU,vm", "tokens", "-16"),
    ("gpt2-tiny,prefill,1,,0,3,CPU,vm", "tokens", "nothing"),
    ("gpt2-tiny,prefill,0,16,0,3,CPU,vm", "batch_size", "0"),
    ("gpt2-tiny,prefill,-2,16,0,3,CPU,vm", "batch_size", "-2"),
    ("gpt2-tiny,prefill,1.5,16,0,3,CPU,vm", "batch_size", "1.5"),
    ("gpt2-tiny,decode,1,1,x,3,CPU,vm", "context", "'x'")])
def test_a_bad_cell_fails_at_load_naming_file_row_and_column(tmp_path, row, column, got):
    path = write(tmp_path, row + "\n")
    with pytest.raises(DataFileError, match=rf"^{path}, row 6, field '{column}': must be .*, got {got}$"):
        MeasuredProfile.load(path)


def test_nan_arguments_are_refused(tmp_path):
    prof, spec = MeasuredProfile.load(write(tmp_path, "")), default_catalog()[TINY]
    assert prof.prefill_ms(spec, "x", 64) > 0 and prof.decode_step_ms(spec, "x", 2, 100) > 0
    with pytest.raises(UserError, match=r"token counts must be finite positive numbers, got \[nan\]"):
        prof.prefill_ms(spec, "x", float("nan"))
    with pytest.raises(UserError, match="decode needs a finite batch >= 1 and context >= 0, got batch 1, context nan"):
        prof.decode_step_ms(spec, "x", 1, float("nan"))
    with pytest.raises(UserError, match="decode needs a finite batch"):
        prof.decode_step_ms(spec, "x", float("nan"), 10)


# ---------------------------------------------------------------- billing
FRAME = pd.DataFrame({"neurons": [8000.0, 8000.0], "arrival_s": [0.0, 3601.0]})


@pytest.mark.parametrize(("frame", "kw", "message"), [
    (pd.DataFrame({"neurons": [1.0], "arrival_s": [float("nan")]}), {},
     "row 0: arrival_s must be a finite number of seconds, got nan"),
    (pd.DataFrame({"neurons": [-1e6], "arrival_s": [0.0]}), {},
     "row 0: neurons must be a finite non-negative number, got -1000000.0"),
    (pd.DataFrame({"neurons": [1.0]}), {}, "the requests table has no 'arrival_s' column"),
    (FRAME, {"day_s": 0}, "day_s must be a positive number of seconds, got 0"),
    (FRAME, {"start_utc": "yesterday"}, "start_utc must be a datetime or an ISO 8601 time, got 'yesterday'")])
def test_invoice_refuses_bad_requests_tables(frame, kw, message):
    with pytest.raises(UserError, match=f"^invoice: {message}"):
        invoice_requests(frame, **kw)
    assert invoice_requests(FRAME).neurons.sum() == 16000.0


@pytest.mark.parametrize("seconds", [-3600, float("nan"), float("inf"), "1"])
def test_fleet_cost_needs_a_non_negative_duration(topo, seconds):
    fleet = edge_fleet(topo, ["AMS"])
    with pytest.raises(UserError, match="fleet cost: seconds must be a finite non-negative number"):
        fleet_cost(fleet, seconds)
    assert fleet_cost(fleet, 3600)["usd"] > 0


def test_numpy_numbers_are_numbers(topo):
    """A duration, a day length or a config field read from numpy (a frame's value) is a number like any other."""
    import numpy as np

    from controlplane.deployment import DeploymentConfig

    fleet = edge_fleet(topo, ["AMS"])
    assert fleet_cost(fleet, np.int64(3600)) == fleet_cost(fleet, 3600)
    assert invoice_requests(FRAME, day_s=np.int64(86_400)).equals(invoice_requests(FRAME, day_s=86_400))
    DeploymentConfig(init_s=np.int64(5), load_gbs=np.float32(2.0), queue_timeout_s=np.float64(30)).check("cfg")


# ---------------------------------------------------------------- fleets
def test_fleet_arguments(topo):
    with pytest.raises(UserError, match="central fleet: no regions given"):
        central_fleet(topo, [])
    with pytest.raises(UserError, match="central GPU scale must be positive .*got '2'"):
        central_fleet(topo, "big3", scale="2")
    with pytest.raises(UserError, match=r"pops must be a list of PoP ids, got the string 'AMS' \(write \['AMS'\]\)"):
        edge_fleet(topo, pops="AMS")
    assert list(edge_fleet(topo, pops=["AMS"]).sites.site_id) == ["AMS"]


def test_central_fleet_reads_a_baseline_string_as_baseline_does(topo):
    assert central_fleet(topo, " big3").name == central_fleet(topo, "big3").name
    assert central_fleet(topo, "aws:us-east-1, aws:eu-west-1").name == "central:aws:us-east-1+aws:eu-west-1"
    with pytest.raises(UserError, match=r"^baseline 'us-east,': an empty region id in the list \(a stray comma\?\)$"):
        central_fleet(topo, "us-east,")
    with pytest.raises(UserError, match=r"^central fleet: an empty region id in \['aws:us-east-1', ''\]"):
        central_fleet(topo, ["aws:us-east-1", ""])


# ---------------------------------------------------------------- capacity
def test_capacity_of_a_mean_prompt_past_the_window_is_computed(topo):
    """A replayed trace's mean prompt can pass the model's window (most requests fit, a few long ones are
    refused one by one): its capacity is computed, not refused, and falls with the size as any other."""
    spec, roof = default_catalog()["@cf/meta/llama-3.1-8b-instruct"], Roofline.from_topology(topo)
    inside = capacity_rps(roof, spec, "H100", spec.context_window, 128)
    assert 0 < capacity_rps(roof, spec, "H100", spec.context_window + 200, 128) < inside


def test_unknown_models_options_and_charges_are_one_line(topo):
    """An unknown model's neurons were NaN (billed as nothing), a negative charge a bare ValueError and an unknown
    keyword to PlacementProblem.build a raw TypeError."""
    from controlplane.billing import Ledger, neurons_array
    from controlplane.placement import PlacementProblem

    cat = default_catalog()
    with pytest.raises(UserError, match="neurons: no model '@cf/nope/x' in the catalog"):
        neurons_array(cat, ["@cf/meta/llama-3.1-8b-instruct", "@cf/nope/x"], [10, 10], [5, 5])
    assert neurons_array(cat, ["@cf/meta/llama-3.1-8b-instruct"], [10], [5])[0] > 0
    for amount in (-1.0, float("nan")):
        with pytest.raises(UserError, match="ledger: neurons charged must be a non-negative number"):
            Ledger().charge("a", 0, amount)
    with pytest.raises(UserError, match="PlacementProblem.build: unknown option 'utilization_cap' .*utilisation_cap"):
        PlacementProblem.build(topo, total_rps=100.0, utilization_cap=0.5)
