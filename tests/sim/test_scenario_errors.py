"""One-line errors for bad input: scenario files, ``run_scenario`` arguments and the other commands' flags, each
naming the file, field or flag and the value, with nothing written."""

from pathlib import Path

import pytest

from edgepop.cli import main
from sim.run import run_scenario


@pytest.mark.parametrize("table, text, message", [
    ("edge", 'router = "neerest"', r"s\.toml \[edge\]: field 'router': unknown routing policy 'neerest' \(known: "
                                   r"adapter-aware, latency-load, least-ttft, nearest-balanced, nearest-with-capacity, p2c, prefix-aware"),
    ("edge", 'router = "p2c"\nrouter_options = { kk = 2 }',
     r"s\.toml \[edge\] router_options: routing policy 'p2c' has no option 'kk' \(options: k\)"),
    ("edge", 'router = "p2c"\nrouter_options = { k = "2" }', r"option 'k' must be an integer, got '2'"),
    ("edge", 'router = "session-affinity"\nrouter_options = { fallback = "p2c", k = 1.5 }',
     r"session-affinity -> fallback 'p2c'.*option 'k' must be an integer"),
    ("edge", 'router = "session-affinity"\nrouter_options = { fallback = "nearest-balancd" }',
     r"s\.toml \[edge\] router_options \(session-affinity -> fallback 'nearest-balancd'\): unknown routing policy"),
    ("edge", 'router = "adapter-aware"\nrouter_options = { base = "p2cc" }', r"adapter-aware -> base 'p2cc'"),
    ("central", 'placement = "central"\nplacement_options = { scael = 2.0 }',
     r"s\.toml \[central\] placement_options: placement policy 'central' has no option 'scael' \(options: "
     r"baseline, budget, keep_groups, node, rack, scale, without_gpus\)"),
    ("edge", 'autoscaler = "reactiv"', r"field 'autoscaler': unknown autoscaling policy 'reactiv' \(known: none, "
                                       r"reactive, scheduled\)"),
    ("techniques", 'batch_policy = "nite"', r"field 'batch_policy': unknown batch policy 'nite' \(known: night, none\)"),
    # a table of rates replaces the default one: a task name typo would leave speculation off, silently
    # fields of the other deployment: ignored at the edge, or (central pops) an unequal budget
    ("edge", 'baseline = "nope"', r"\[edge\]: field 'baseline' sets the central deployment's regions or budget"),
    ("edge", 'gpu_scale = 5.0', r"\[edge\]: field 'gpu_scale' sets the central"),
    ("central", 'pops = ["FRA"]', r"\[central\]: field 'pops' is the edge's"),
    ("techniques", 'speculative = true\nspec_acceptance = { chat = 0.9 }',
     r"spec_acceptance\.chat: unknown task \(known: text-generation, "),
    ("techniques", 'speculative = true\nspec_acceptance = {}',
     r"s\.toml \[techniques\]: spec_acceptance is empty: give text-generation = rate in \[0, 1\)"),
    ("techniques", 'speculative = true\nspec_acceptance = { "text-embeddings" = 0.9 }',
     r"spec_acceptance\.text-embeddings: speculative decoding applies to text-generation only"),
    ("techniques", 'speculative = true\nchunked_prefill = true', "speculative and chunked_prefill cannot both be on"),
    ("techniques", 'lora = true\ndisaggregation = true', "lora and disaggregation cannot both be on"),
])
def test_policy_typos_fail_at_parse_time_naming_file_table_field_and_valid_names(tmp_path, monkeypatch, table, text,
                                                                                  message):
    """A typo in a policy name or option is caught when the scenario is read, before any workload exists."""
    import sim.workload
    from edgepop.errors import UserError
    from sim.scenario import load_scenario

    def no_workload(*a, **k):
        raise AssertionError("a workload was generated for a scenario with a typo")

    monkeypatch.setattr(sim.workload, "generate", no_workload)
    path = tmp_path / "s.toml"
    path.write_text(f'[workload]\nrequests = 10\nrps = 1.0\n[{table}]\n{text}\n')
    with pytest.raises(UserError, match=message) as info:
        load_scenario(path)
    assert "\n" not in str(info.value)


def test_perf_and_fault_policy_are_checked_at_parse_time(tmp_path):
    from edgepop.errors import UserError
    from sim.scenario import load_scenario

    path = tmp_path / "s.toml"
    path.write_text('perf = "roofline"\nfault_policy = "retyr"\n[workload]\nrequests = 10\nrps = 1.0\n')
    with pytest.raises(UserError, match=r"field 'fault_policy': unknown fault policy 'retyr' \(known: fail, retry\)"):
        load_scenario(path)
    path.write_text('perf = "rooflin"\n[workload]\nrequests = 10\nrps = 1.0\n')
    with pytest.raises(UserError, match=r"'rooflin' is neither a service-time model \(profile, roofline\) nor"):
        load_scenario(path)


@pytest.mark.parametrize("field", ["perf", "catalog"])
def test_a_missing_table_names_each_place_looked_at_once(tmp_path, monkeypatch, field):
    """Beside the scenario and in the working directory: one place when they are the same folder, two otherwise."""
    from edgepop.errors import UserError
    from sim.scenario import load_scenario

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "s.toml").write_text(f'{field} = "nope.csv"\n[workload]\nrequests = 10\nrps = 1.0\n')
    for cwd, scenario, folders in ((tmp_path / "run", "s.toml", ["."]), (tmp_path, "run/s.toml", [".", "run"])):
        monkeypatch.chdir(cwd)
        with pytest.raises(UserError) as info:
            load_scenario(scenario)
        looked = str(info.value).split("(looked for ")[-1]
        assert looked == " and ".join(str(Path.cwd() / f / "nope.csv") for f in folders) + ")"


@pytest.mark.parametrize("kw, words", [
    ({"duration_s": -3}, "duration must be positive, got -3"),
    ({"seed": "x"}, "seed must be an integer in [0, 2**63 - 1], got 'x'"),
    ({"seed": -1}, "seed must be an integer in [0, 2**63 - 1], got -1"),
    ({"seed": 2**64}, "seed must be an integer in [0, 2**63 - 1], got 18446744073709551616"),
    ({"deployments": ("edge", "moon")}, "deployments must be 'edge' and/or 'central'"),
    ({"deployments": ()}, "deployments must be 'edge' and/or 'central'"),
    ({"deployments": ("edge", "edge")}, "deployments must be 'edge' and/or 'central', each once"),  # rows twice
    # from Python: a NaN count hung the workload generator, a float count failed deep in pandas, True ran 1
    ({"requests": float("nan")}, "requests must be a positive integer, got nan"),
    ({"requests": 300.0}, "requests must be a positive integer, got 300.0"),
    ({"requests": True}, "requests must be a positive integer, got True"),
    ({"duration_s": "10"}, "duration must be a number of seconds, got '10'"),
    ({"faults": "pop:XXX@1+5"}, "pop:XXX"),  # one spec as a string, not a list of its characters
])
def test_run_scenario_arguments_give_one_line_errors(kw, words):
    import re

    from edgepop.errors import UserError

    with pytest.raises(UserError, match=re.escape(words)):
        run_scenario("small", **kw)


BAD_FIELDS = [
    ("seed = 1.5\n", "'seed' must be a whole number"),
    ('catalog = 5\n', "'catalog' must be a string"),
    ('planning_rps = "abc"\n', "'planning_rps' must be a finite number"),
    ("planning_rps = -5.0\n", "'planning_rps' must not be negative"),
    ("faults = [5]\n", "'faults' must list"),
    ('faults = "pop:FRA@10+5"\n', "'faults' must be a list"),
    ("sample_s = 0.0\n", "'sample_s' must be positive"),
    ("sample_s = nan\n", "'sample_s' must be a finite number"),
    ("slo = 5\n", "'slo' must be a table"),
    ("[slo]\nttft_ms = 0.0\n", "'[slo] ttft_ms' must be positive"),
    ("[slo]\ntpot_ms = inf\n", "'tpot_ms' must be a finite number"),
    ("[edge]\nload_gbs = 0.0\n", "load_gbs must be a positive number"),
    ("[edge]\nqueue_timeout_s = nan\n", "'queue_timeout_s' must be a finite number"),
    ("[edge]\npops = []\n", "pops must be a non-empty list"),
    ('[edge]\npops = "FRA"\n', "'pops' must be a list"),
    ("[central]\ngpu_scale = nan\n", "'gpu_scale' must be a finite number"),
    ('[central]\nenabled = "no"\n', "'enabled' must be true or false"),
    ("[techniques]\nlora = true\nlora_slots = 0\n", "lora_slots must be an integer >= 1, got 0"),
    ("[techniques]\nspeculative = true\nspec_k = 1000000\n", "spec_k must be at most 32"),
    ("[techniques]\nspeculative = true\nspec_k = 0\n", "[techniques]: field 'spec_k' must be at least 1, got 0"),
    ("[techniques]\nspeculative = true\nspec_draft_cost = 1e300\n", "spec_draft_cost must be in [0, 1]"),
    ("[workload]\nmix = { '@cf/meta/llama-3.1-8b-instruct' = 1e308, '@cf/baai/bge-base-en-v1.5' = 1e308 }\n",
     "mix shares' sum overflows"),
    # sizes and values that would overflow, hang or exhaust memory
    ("sample_s = 1e-6\n", "'sample_s' must be at least 0.01"),
    ("gpu_inventory_scale = 1e9\n", "'gpu_inventory_scale' must be at most 100"),
    ("prefill_time_scale = 0.0\n", "mine.toml: field 'prefill_time_scale' must be positive, got 0.0"),
    ("decode_time_scale = 1e9\n", "mine.toml: field 'decode_time_scale' must be at most 100, got 1000000000.0"),
    ('decode_time_scale = "2"\n', "'decode_time_scale' must be a finite number, got '2'"),
    ("gpu_inventory_scale = 1e-9\n", "mine.toml: field 'gpu_inventory_scale': GPU inventory scale 1e-09 leaves no GPU"),
    ("seed = 18446744073709551616\n", "'seed' must be at most 2**63 - 1"),
    ("[workload]\nrps = 1e300\n", "rps must be in"),
    ("[workload]\nrps = 1e-300\n", "more than a year"),
    ('[workload]\nstart_utc = "9999-12-31T23:59:59Z"\n', "start_utc must fall in the years 1900-2200"),
    ("[workload]\nsession_fraction = 1.0\nsession_turns = 1e300\n", "session_turns must be in [1, 1000]"),
    ("[workload]\ntokens = { text-generation = { prompt = { median = 100, sigma = 1e300 } } }\n",
     "sigma must be in [0, 5]"),
    ("[workload]\ntokens = { text-generation = { prompt = { median = 0.001, min = 0 } } }\n",
     "prompt: min must be an integer >= 1"),
    ("[workload]\nbursts = [{ start_s = 0, duration_s = 1e300, multiplier = 2 }]\n", "duration_s must be in"),
    # policy options: a NaN passes every range check it meets, a negative bound refused every request in silence,
    # a half-given schedule or an infinite time limit crashed after the workload was generated
    ('[edge]\nrouter = "nearest-with-capacity"\nrouter_options = { max_rtt_ms = -1.0 }\n', "max_rtt_ms must be >= 0"),
    ('[edge]\nrouter = "session-affinity"\nrouter_options = { gate = nan }\n', "option 'gate' must be a number"),
    ('[edge]\nautoscaler = "reactive"\nautoscaler_options = { interval_s = nan }\n', "'interval_s' must be a number"),
    ('[edge]\nautoscaler = "reactive"\nautoscaler_options = { max_per_site = 0 }\n', "max_per_site must be at least 1"),
    # a poll every 0.1 ms was run at 1 ms (the simulator's clock step), silently and slowly
    ('[edge]\nautoscaler = "reactive"\nautoscaler_options = { interval_s = 0.0001 }\n',
     "interval_s must be at least 0.001 s (1 ms), got 0.0001"),
    ('[edge]\nautoscaler = "scheduled"\nautoscaler_options = { interval_s = 0.0001 }\n',
     "interval_s must be at least 0.001 s (1 ms), got 0.0001"),
    (f'faults = ["pop:FRA@1+{"9" * 400}"]\n', "start and duration must be finite numbers of seconds"),
    ('[edge]\nautoscaler = "scheduled"\nautoscaler_options = { warm_hours = [7] }\n', "warm_hours must be [start, end]"),
    ('[edge]\nautoscaler = "scheduled"\nautoscaler_options = { warm_hours = [9, 9] }\n',
     "warm_hours [9, 9] is an empty window (start = end)"),
    ('[edge]\nautoscaler = "scheduled"\nautoscaler_options = { day_s = 0.0 }\n', "day_s must be positive"),
    ('[edge]\nautoscaler = "scheduled"\nautoscaler_options = { start_utc = "bogus" }\n', "start_utc must be an ISO"),
    ('[edge]\nplacement = "ilp"\nplacement_options = { time_limit_s = inf }\n', "time_limit_s must be positive and"),
    ('[edge]\nplacement_options = { swap_passes = -1 }\n', "swap_passes must be >= 0"),
    ('[central]\nbaseline = "big3"\nplacement_options = { baseline = "us-east" }\n', "set baseline = 'us-east' there"),
    ('catalog = "nowhere.toml"\n', "field 'catalog': no catalog file 'nowhere.toml'"),
    ('perf = "nowhere.csv"\n', "field 'perf': 'nowhere.csv' is neither a service-time model"),
]


@pytest.mark.parametrize(("text", "needle"), BAD_FIELDS)
def test_bad_values_are_one_line_errors_before_any_work(tmp_path, capsys, text, needle):
    f = tmp_path / "mine.toml"
    if text.startswith("[workload]"):  # the workload's own fields, beside its size
        f.write_text(text.replace("[workload]\n", "[workload]\nrequests = 100\n", 1))
    else:
        f.write_text("[workload]\nrequests = 100\n" + text if text.startswith("[") else
                     text + "[workload]\nrequests = 100\n")
    assert main(["simulate", "--scenario", str(f), "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert needle in err and "mine.toml" in err and err.count("\n") == 1
    assert not (tmp_path / "a").exists()


def test_catalog_and_profile_paths_are_read_from_the_scenario_folder(tmp_path, monkeypatch):
    """As the workload's trace is: a scenario naming ``catalog = "cat.toml"`` finds the file beside it, whatever
    the working directory."""
    import shutil

    from controlplane.catalog import CATALOG_FILE
    from sim.scenario import load_scenario

    folder = tmp_path / "study"
    folder.mkdir()
    shutil.copyfile(CATALOG_FILE, folder / "cat.toml")
    (folder / "mine.toml").write_text('catalog = "cat.toml"\n[workload]\nrequests = 100\n')
    monkeypatch.chdir(tmp_path)
    assert load_scenario(str(folder / "mine.toml")).catalog == str(folder / "cat.toml")


def test_unreadable_files_and_impossible_runs_are_one_line_errors(tmp_path, capsys):
    f = tmp_path / "bytes.toml"
    f.write_bytes(b"seed = 1\n\xff\xfe bad = 1\n")
    off = tmp_path / "off.toml"
    off.write_text("[workload]\nrequests = 100\n\n[central]\nenabled = false\n")
    (tmp_path / "empty.toml").write_text("# nothing yet\n")  # (it ran on defaults no embedded scenario has)
    grids = Path(__file__).resolve().parents[2] / "sim" / "scenarios" / "grids"
    for argv, needle in ((["--scenario", str(f)], "not valid TOML"),
                         (["--scenario", str(tmp_path / "empty.toml")], "an empty scenario file (no fields); "
                          "start from a copy of an embedded one, e.g. "),
                         (["--scenario", str(tmp_path)], "is a folder; name a TOML file"),
                         (["--scenario", str(grids / "policies.toml")], "run it with `edgepop sweep --grid`"),
                         (["--scenario", "small", "--duration", "inf"], "--duration must be"),
                         (["--scenario", str(off), "--only", "central"], "no central deployment")):
        assert main(["simulate", *argv, "--out", str(tmp_path / "a")]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1
    assert not (tmp_path / "a").exists()


def test_other_commands_name_the_mistake_in_one_line(tmp_path, capsys):
    trace = tmp_path / "far.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                     '{"timestamp": 1e15, "input_length": 10, "output_length": 5}\n')
    out = str(tmp_path / "o")
    size = '[workload]\nrequests = 100\nrps = 10.0\n'
    (tmp_path / "pops.toml").write_text(size + '[edge]\npops = ["XXX"]\n')
    (tmp_path / "base.toml").write_text(size + '[central]\nbaseline = "nope"\n')
    (tmp_path / "cat.toml").write_text(f'catalog = "{tmp_path}"\n' + size)
    (tmp_path / "mix.toml").write_text(size + "mix = { '@cf/nope' = 1.0 }\n")
    for argv, needle in ((["simulate", "--scenario", str(tmp_path / "pops.toml"), "--out", out],
                          "pops.toml [edge]: field 'pops': unknown PoP id(s) 'XXX'"),
                         (["simulate", "--scenario", str(tmp_path / "base.toml"), "--out", out],
                          "base.toml [central]: field 'baseline': unknown baseline 'nope'"),
                         (["simulate", "--scenario", str(tmp_path / "cat.toml"), "--out", out],
                          f"cat.toml: field 'catalog': '{tmp_path}' is a folder; name a TOML catalog file"),
                         (["simulate", "--scenario", str(tmp_path / "mix.toml"), "--out", out],
                          "mix.toml [workload]: field 'mix': no model '@cf/nope' in the catalog"),
                         (["simulate", "--scenario", "small", "--trace", str(trace), "--out", out], "than a year"),
                         (["simulate", "--scenario", "small", "--trace", str(tmp_path), "--out", out], "is a folder"),
                         (["simulate", "--scenario", "small", "--duration", "0.0001", "--out", out], "no requests"),
                         (["place", "--policy", "ilp", "--time-limit", "0"], "time_limit_s must be positive"),
                         (["place", "--policy", "ilp", "--time-limit", "inf"], "at most 86,400 s"),  # (overflowed)
                         (["place", "--policy", "greedy-demand", "--rps", "0"], "--rps must be a positive number"),
                         (["place", "--policy", "central", "--baseline", "aws:us-east-1,,"], "a stray comma"),
                         (["topology", "--pops", str(tmp_path)], "is a folder, not a file"),
                         (["quantize", "gpt2-tiny", "--out", out, "--repeats", "100000000000"], "--repeats must be"),
                         (["simulate", "--scenario", "small", "--fail", "pop:XXX@10+5", "--out", out],
                          "--fail: fault 'pop:XXX': unknown PoP id"),
                         (["replay", "--live", "notaurl", "--trace", str(trace), "--no-sim", "--out", out],
                          "is not a URL"),
                         (["place", "--policy", "greedy-demand", "--models", ""], "no model ids"),
                         (["topology", "--last-mile", "country", "--last-mile-ms", "20", "--out", out],
                          "does not apply"),
                         # thread counts that would start tens of thousands of OS threads, or overflow onnxruntime
                         (["profile", "--models", "gpt2-tiny", "--quick", "--threads", "100000"], "from 0 (one per core)"),
                         (["quantize", "gpt2-tiny", "--out", out, "--threads", "99999999999"], "from 0 (one per core)"),
                         (["serve", "--pops", "FRA", "--threads", "100000"], "field 'threads'"),
                         (["serve", "--pops", ""], "--pops (field 'pops'): [] is not a non-empty list"),  # (not defaults)
                         (["serve", "--pops", "FRA,FRA"], "names a PoP twice"),
                         (["serve", "--pops", "FRA", "--models", "@cf/meta/llama-3.2-1b-instruct,"
                           "@cf/meta/llama-3.2-1b-instruct"], "names a model twice"),
                         # (split equally: a repeat got no more demand, 'A,A' planned A alone as if named once)
                         (["place", "--policy", "greedy-demand", "--models", "@cf/meta/llama-3.2-1b-instruct,"
                           "@cf/meta/llama-3.2-1b-instruct"], "more than once: give shares with --mix"),
                         (["serve", "--pops", "FRA", "--delay-scale", "1e300"], "is over 1000"),
                         (["serve", "--pops", "FRA", "--request-timeout", "1e300"], "is over 86400"),
                         (["lora-check", "--alpha", "nan"], "--alpha must be a finite number"),
                         (["lora-check", "--alpha", "0"], "--alpha must be a finite number in (0, 10000]"),
                         (["lora-check", "--alpha", "1e300"], "--alpha must be a finite number in (0, 10000]"),
                         (["lora-check", "--adapter", "a.npz", "--rank", "16"], "--adapter brings its own"),
                         (["profile", "--models", ""], "--models is empty"),  # (it profiled every default model)
                         (["simulate", "--scenario", "small", "--fail", "node:FRAX-0@0+10", "--out", out],
                          "fault node:FRAX-0: no node can have this id"),
                         (["speculate", "--max-tokens", "100000"], "leaving 495"),
                         (["speculate", "--prompt", "\udcff\udcfe"], "--prompt is not valid UTF-8"),  # argv bytes  # (the context is 512 tokens)
                         (["profile", "--models", "gpt2-tiny", "--quick", "--out", str(tmp_path / "p.xlsx")],
                          "name a .csv or a .parquet file")):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, (argv, err)
    for argv in (["place", "--policy", "greedy-demand", "--seed=-1"], ["lora-check", "--seed=-1"],
                 ["simulate", "--scenario", "small", "--seed=x"], ["place", "--policy", "greedy-demand", "--out", ""],
                 ["simulate", "--scenario", "small", f"--seed={2**64}"]):  # (no 64-bit seed column holds it)
        with pytest.raises(SystemExit) as exc:  # argparse: usage and one error line
            main(argv)
        assert exc.value.code == 2 and "error: argument" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
