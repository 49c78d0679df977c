"""Bringing your own trace and scenario: one-line errors that say what is wrong with the file as written (a
missing JSON key, a CSV header with spaces, a byte-order mark, a bad --trace), and the warning on a trace whose
implied rate says its timestamps are in another unit."""

import json

import pytest

from edgepop.errors import UserError
from sim.scenario import load_scenario
from sim.traces import TraceFileError, read_azure_trace, read_mooncake_trace

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROWS = "2023-11-16 18:15:46.68,100,10\n2023-11-16 18:15:47.00,200,20\n"


def test_a_jsonl_line_without_a_key_says_the_key_is_missing_and_lists_the_keys(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text(json.dumps({"ts": 0, "input_length": 5, "output_length": 1}) + "\n")
    with pytest.raises(TraceFileError) as err:
        read_mooncake_trace(p)
    msg = str(err.value)
    assert "line 1, field 'timestamp': missing key 'timestamp'" in msg, msg
    assert "'ts', 'input_length', 'output_length'" in msg and "None" not in msg
    p.write_text(json.dumps({"timestamp": 0, "output_length": 1}) + "\n")
    with pytest.raises(TraceFileError, match="field 'input_length': missing key 'input_length' "
                       r"\(the line has keys: 'timestamp', 'output_length'\)"):
        read_mooncake_trace(p)
    p.write_text(json.dumps({"timestamp": None, "input_length": 5, "output_length": 1}) + "\n")
    with pytest.raises(TraceFileError, match="None is not a non-negative number"):  # (present, but null)
        read_mooncake_trace(p)


def test_a_csv_header_with_spaces_after_the_commas_is_read(tmp_path):
    p = tmp_path / "s.csv"
    p.write_text("TIMESTAMP, ContextTokens, GeneratedTokens\n" + ROWS.replace(",", ", "))
    t = read_azure_trace(p)
    assert t.prompt_tokens.tolist() == [100, 200] and t.output_tokens.tolist() == [10, 20]


def test_a_missing_csv_column_shows_the_header_as_read(tmp_path):
    p = tmp_path / "c.csv"
    p.write_text("TIMESTAMP,Context,GeneratedTokens\n" + ROWS)
    with pytest.raises(TraceFileError) as err:
        read_azure_trace(p)
    assert "field 'ContextTokens': missing column" in str(err.value)
    assert "the header reads 'TIMESTAMP,Context,GeneratedTokens'" in str(err.value)


def test_a_scenario_and_a_grid_with_a_byte_order_mark_are_read(tmp_path):
    from sim.grid import load_grid

    (tmp_path / "s.toml").write_text('name = "bom"\n[workload]\nrequests = 10\n', encoding="utf-8-sig")
    assert load_scenario(tmp_path / "s.toml").workload.requests == 10
    (tmp_path / "g.toml").write_text('base = "s.toml"\nseeds = [1, 2]\n', encoding="utf-8-sig")
    assert len(load_grid(tmp_path / "g.toml").variants) == 2


def test_a_catalog_with_a_byte_order_mark_is_read(tmp_path):
    from controlplane.catalog import CATALOG_FILE, Catalog

    p = tmp_path / "cat.toml"
    p.write_text(CATALOG_FILE.read_text(), encoding="utf-8-sig")
    assert len(Catalog.load(p)) == len(Catalog.load())


def test_a_bad_trace_on_the_command_line_names_the_option_not_the_scenario(tmp_path, topo):
    from sim.run import run_scenario

    with pytest.raises(UserError) as err:
        run_scenario("small", topo=topo, trace=str(tmp_path / "nope.csv"))
    assert str(err.value) == f"--trace {tmp_path / 'nope.csv'}: no such file"
    (tmp_path / "bad.csv").write_text(HEADER + "2023-11-16 18:15:46,x,1\n")
    with pytest.raises(UserError, match=r"^--trace .*bad.csv, line 2, field 'ContextTokens'"):
        run_scenario("small", topo=topo, trace=str(tmp_path / "bad.csv"))
    (tmp_path / "t.toml").write_text(f'name = "t"\n[workload]\nkind = "azure"\ntrace = "{tmp_path / "nope.csv"}"\n')
    with pytest.raises(UserError, match=r"^t.toml \[workload\]: .*nope.csv: no such file"):
        run_scenario(tmp_path / "t.toml", topo=topo)
