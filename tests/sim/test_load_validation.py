"""The closed-loop check of the simulated replica (``sim.load_validation``): the loop's own invariants, the KV
cache bounding what runs at once, the shipped table's checks, and a report whose figures follow from its points."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from controlplane.catalog import default_catalog
from controlplane.perf import Roofline
from controlplane.perf_rows import reference_gpus
from edgepop.errors import DataFileError
from sim.load_validation import METRICS, closed_loop, kv_capacity_tokens, load_report, load_table

LLAMA = "@cf/meta/llama-3.1-8b-instruct"


@pytest.fixture(scope="module")
def setup():
    return replace(default_catalog()[LLAMA], tensor_parallel=1), Roofline(reference_gpus())


def test_one_client_sees_a_lone_prefill_and_lone_decode_steps(setup):
    spec, perf = setup
    r = closed_loop(spec, "H100", perf, 1, 1000, 50, warmup=2, measured=5)
    assert r["ttft_ms"] == pytest.approx(perf.prefill_ms(spec, "H100", 1000))
    steps = [perf.decode_step_ms(spec, "H100", 1, 1000 + k) for k in (0, 49)]
    assert min(steps) * 0.99 <= r["itl_ms"] <= max(steps) * 1.01
    assert r["requests_per_s"] == pytest.approx(1e3 / r["e2e_ms"], rel=1e-6)


@pytest.mark.parametrize("clients,chunk", [(4, None), (32, None), (32, 2048)])
def test_closed_loop_obeys_littles_law(setup, clients, chunk):
    spec, perf = setup
    r = closed_loop(spec, "H100", perf, clients, 2000, 100, chunk_tokens=chunk)
    # Every client always has exactly one request in the system: throughput x latency = clients.
    assert r["requests_per_s"] * r["e2e_ms"] / 1e3 == pytest.approx(clients, rel=0.02)
    lone = closed_loop(spec, "H100", perf, 1, 2000, 100, warmup=2, measured=5)
    assert r["requests_per_s"] > lone["requests_per_s"] and r["itl_ms"] > lone["itl_ms"]


def test_a_full_kv_cache_holds_requests_back(setup):
    spec, perf = setup
    two = 2 * (2000 + 100)
    bounded = closed_loop(spec, "H100", perf, 4, 2000, 100, kv_tokens=two)
    pair = closed_loop(spec, "H100", perf, 2, 2000, 100)
    # Room for two at a time: four clients get what two get, and wait for it in their TTFT.
    assert bounded["requests_per_s"] == pytest.approx(pair["requests_per_s"], rel=0.01)
    assert bounded["ttft_ms"] > pair["ttft_ms"] + 0.5 * pair["e2e_ms"]
    # The capacity from memory: an 8B model in 16 bits leaves about 60 GB of an H100 for 128 KiB tokens.
    assert 3e5 < kv_capacity_tokens(perf, spec, "H100") < 5e5


def test_shipped_table_and_bad_rows(tmp_path):
    table = load_table()
    assert len(table) == 715 and set(table.concurrency) == {1, 2, 5, 10, 25, 50, 100, 150, 200, 250}
    bad = table.head(3).copy()
    bad.loc[1, "itl_ms"] = -1.0
    path = tmp_path / "runs.csv"
    bad.to_csv(path, index=False)
    with pytest.raises(DataFileError, match=r"row 3, field 'itl_ms'"):
        load_table(path)
    bad.drop(columns="runs").to_csv(path, index=False)
    with pytest.raises(DataFileError, match="expected columns"):
        load_table(path)


def test_report_figures_follow_from_its_points(tmp_path):
    table = load_table()
    small = table[(table.gpu == "H100") & (table.tp == 1) & (table.precision == "fp16")
                  & (table.prompt_tokens == 200) & (table.concurrency <= 25)]
    path = tmp_path / "runs.csv"
    small.to_csv(path, index=False)
    rep = load_report(path)
    assert rep["runs"] == len(small) == len(rep["points"])
    pts = pd.DataFrame(rep["points"])
    for name, reading in rep["readings"].items():
        for m in METRICS:
            err = pts[f"{m}_{name}"] / pts[m] - 1.0
            assert reading[m]["mape"] == pytest.approx(np.mean(np.abs(err)), rel=1e-3)
            assert sum(b["runs"] for b in reading[m]["by_concurrency"].values()) == len(small)


def test_docs_section_is_generated_from_the_current_code():
    """docs/fidelity-models.md's section on the replica under load is ``edgepop validate --docs``'s (the loop is
    deterministic: the same figures to the digit)."""
    import re
    from pathlib import Path

    from sim.load_validation import render_markdown

    page = (Path(__file__).resolve().parents[2] / "docs" / "fidelity-models.md").read_text()
    section = re.search(r"### The simulated replica under load\n.*?(?=\n## )", page, flags=re.S).group(0)
    assert section.strip() == "\n".join(render_markdown(load_report(), "###")).strip()
