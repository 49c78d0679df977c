"""Generated workloads: columns and invariants, determinism, Poisson statistics, diurnal shape, bursts, model mix,
token sizes, sessions and their prefix blocks, flags, parquet round trip, config validation."""

from datetime import timedelta

import numpy as np
import pandas as pd
import pytest

from controlplane.catalog import default_catalog
from controlplane.forecast import DEFAULT_MIX
from edgepop.errors import UserError
from sim.sessions import first_appearance_ids
from sim.traces import prefix_reuse_ratio
from sim.workload import COLUMNS, Workload, generate
from sim.workload_config import WorkloadConfig
from topology import demand_rates
from topology.demand import utc_offset_hours

CAT = default_catalog()


def make(topo, seed=0, **kw):
    return generate(WorkloadConfig.from_dict(kw, where="test [workload]"), topo, CAT, np.random.default_rng(seed))


@pytest.fixture(scope="module")
def default_wl(topo):
    return make(topo, seed=7, requests=20_000, rps=200)


@pytest.fixture(scope="module")
def session_wl(topo):
    return make(topo, seed=11, requests=30_000, rps=100, session_fraction=0.6, session_turns=5.0,
                think_time_s=15.0, block_tokens=256)


def test_columns_dtypes_and_invariants(default_wl, topo):
    r = default_wl.requests
    assert tuple(r.columns) == COLUMNS and len(r) == 20_000
    default_wl.check()
    for col in ("request_id", "city", "ingress", "prompt_tokens", "output_tokens", "session_id"):
        assert r[col].dtype == np.int64, col
    assert r.batch.dtype == bool and r.reject_if_busy.dtype == bool
    d = topo.demand
    city = r.city.to_numpy()
    assert (r.user_country.to_numpy() == d.cc.to_numpy()[city]).all()
    assert (r.user_continent.to_numpy() == d.continent.to_numpy()[city]).all()
    assert np.allclose(r.user_lat, d.lat.to_numpy()[city]) and np.allclose(r.user_lon, d.lon.to_numpy()[city])
    # Ingress and access RTT are the topology's anycast answer for the user's city.
    sample = r.sample(200, random_state=0)
    idx, rtt = topo.ingress(sample.user_lat.to_numpy(), sample.user_lon.to_numpy())
    assert (sample.ingress.to_numpy() == idx).all()
    assert np.allclose(sample.access_rtt_ms.to_numpy(), rtt, rtol=1e-6)
    assert (sample.ingress_pop.to_numpy() == topo.pops.id.to_numpy()[idx]).all()
    assert (r.task.to_numpy() == np.array([CAT[m].task for m in r.model])).all()


def test_same_seed_same_frame_other_seed_differs(topo, default_wl):
    again = make(topo, seed=7, requests=20_000, rps=200)
    pd.testing.assert_frame_equal(default_wl.requests, again.requests)
    other = make(topo, seed=8, requests=20_000, rps=200)
    assert not np.array_equal(other.requests.arrival_s, default_wl.requests.arrival_s)
    assert not np.array_equal(other.requests.city, default_wl.requests.city)
    assert default_wl.seed == 7


def test_flat_poisson_count_and_interarrival_cv(topo):
    w = make(topo, seed=1, duration_s=1000.0, rps=100.0, diurnal=False)
    n, expected = len(w), 100_000
    assert abs(n - expected) < 4 * np.sqrt(expected)
    gaps = np.diff(w.requests.arrival_s.to_numpy())
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.02  # exponential gaps: CV 1
    assert w.requests.arrival_s.max() < 1000.0
    # Thirds of the run see equal counts.
    thirds = np.histogram(w.requests.arrival_s, bins=3, range=(0, 1000))[0]
    assert np.abs(thirds - expected / 3).max() < 4 * np.sqrt(expected / 3)


def test_diurnal_total_rate_matches_the_topology_demand_curve(topo):
    cfg = WorkloadConfig.from_dict({"duration_s": 600.0, "rps": 150.0, "start_utc": "2024-07-01T03:00:00Z"})
    w = generate(cfg, topo, CAT, np.random.default_rng(2))
    rate = demand_rates(topo.demand, cfg.start_utc + timedelta(seconds=300), 150.0).sum()
    expected = rate * 600.0
    assert abs(rate / 150.0 - 1.0) > 0.05  # the global total really is off its daily mean at this hour
    assert abs(len(w) - expected) < 4 * np.sqrt(expected)


def test_compressed_day_has_more_evening_than_4am_arrivals(topo):
    w = make(topo, seed=3, duration_s=3600.0, rps=40.0, day_compression=3600.0)
    r, cfg = w.requests, w.config
    offset = utc_offset_hours(topo.demand.tz, cfg.start_utc)[r.city.to_numpy()]
    t0 = cfg.start_utc.hour + cfg.start_utc.minute / 60
    local = (t0 + offset + r.arrival_s.to_numpy() * 24.0 / 3600.0) % 24.0
    evening = ((local >= 19) & (local < 21)).sum()
    night = ((local >= 3) & (local < 5)).sum()
    assert 3.0 < evening / night < 4.4  # the curve's 19-21 h mean over its 03-05 h mean is ~3.6
    # Over one whole compressed day the mean rate is rps.
    assert abs(len(r) - 40 * 3600) < 5 * np.sqrt(40 * 3600)


def test_burst_multiplies_only_its_region(topo):
    w = make(topo, seed=4, duration_s=300.0, rps=200.0, diurnal=False,
             bursts=[{"start_s": 100.0, "duration_s": 100.0, "multiplier": 5.0, "continent": "EU"},
                     {"start_s": 0.0, "duration_s": 300.0, "multiplier": 3.0, "country": "JP"}])
    r = w.requests
    inside = (r.arrival_s >= 100) & (r.arrival_s < 200)
    eu = r.user_continent == "EU"
    jp = r.user_country == "JP"
    other = ~eu & ~jp
    ratio_eu = (eu & inside).sum() / ((eu & ~inside).sum() / 2)
    ratio_other = (other & inside).sum() / ((other & ~inside).sum() / 2)
    assert 4.3 < ratio_eu < 5.7 and 0.9 < ratio_other < 1.1
    jp_share = topo.demand.weight[topo.demand.cc == "JP"].sum()
    assert abs(jp.sum() / (200 * 300 * jp_share) - 3.0) < 0.3


def test_bursts_filter_that_matches_no_city_is_an_error(topo):
    with pytest.raises(UserError, match="matches"):
        make(topo, requests=10, bursts=[{"start_s": 0, "duration_s": 1, "multiplier": 2, "country": "ZZ"}])


def test_model_mix_shares(topo, default_wl):
    total = sum(DEFAULT_MIX.values())
    counts = default_wl.requests.model.value_counts()
    n = len(default_wl)
    for model, share in DEFAULT_MIX.items():
        p = share / total
        assert abs(counts.get(model, 0) / n - p) < 4 * np.sqrt(p * (1 - p) / n), model
    w = make(topo, seed=5, requests=20_000, mix={"@cf/baai/bge-m3": 3, "@cf/openai/whisper": 1})
    share = (w.requests.model == "@cf/baai/bge-m3").mean()
    assert abs(share - 0.75) < 4 * np.sqrt(0.75 * 0.25 / 20_000)


def test_token_sizes_follow_defaults_and_fit_context_windows(topo):
    mix = {"@cf/meta/llama-3.1-8b-instruct": 4, "@edgepop/gpt2-tiny": 1, "@cf/mistral/mistral-7b-instruct-v0.1": 1,
           "@cf/baai/bge-base-en-v1.5": 1, "@cf/baai/bge-reranker-base": 1, "@cf/microsoft/resnet-50": 1,
           "@cf/openai/whisper": 1, "@cf/huggingface/distilbert-sst-2-int8": 1}
    w = make(topo, seed=6, requests=40_000, mix=mix, session_fraction=0.5)
    r = w.requests
    for model, g in r.groupby("model"):
        spec = CAT[model]
        if spec.generative:
            assert (g.prompt_tokens + g.output_tokens <= spec.context_window).all(), model
            assert (g.prompt_tokens >= 1).all() and (g.output_tokens >= 1).all()
        elif spec.unit == "token" and spec.task != "text-reranking":  # reranking: a sum over pairs
            assert (g.prompt_tokens <= spec.context_window).all() and (g.output_tokens == 0).all()
    tiny = r[r.model == "@edgepop/gpt2-tiny"]
    assert tiny.prompt_tokens.max() == 511  # median chat prompts do not fit 512 tokens: clipped
    llama = r[(r.model == "@cf/meta/llama-3.1-8b-instruct") & (r.session_id < 0)]
    assert abs(llama.prompt_tokens.median() / 1020 - 1) < 0.06 and abs(llama.output_tokens.median() / 129 - 1) < 0.06
    emb = r[r.task == "text-embeddings"].prompt_tokens
    assert 40 <= emb.median() <= 120
    assert (r[r.task == "image-classification"].prompt_tokens == 1).all()
    speech = r[r.task == "automatic-speech-recognition"].prompt_tokens  # audio seconds
    assert abs(speech.median() - 18) <= 2 and speech.max() <= 1800 and speech.min() >= 1
    rerank = r[r.task == "text-reranking"].prompt_tokens
    assert 600 < rerank.median() < 1100  # a query against ~8 passages of ~90 tokens
    # Each (query, passage) pair is clipped to the cross-encoder's window on its own.
    long = make(topo, seed=6, requests=2000, mix={"@cf/baai/bge-reranker-base": 1},
                tokens={"text-reranking": {"passage": {"median": 5000, "sigma": 0.1}}}).requests.prompt_tokens
    assert (long % 512 == 0).all() and abs(long.mean() / 512 - 8) < 0.3


def test_sessions_share_hash_id_prefixes(session_wl):
    r = session_wl.requests
    session_wl.check()
    gen = r[r.task == "text-generation"]
    assert abs((gen.session_id >= 0).mean() - 0.6) < 0.05
    B = 256
    assert all(len(h) == -(-p // B) for h, p in zip(gen.hash_ids, gen.prompt_tokens, strict=True))
    assert (r[r.task != "text-generation"].hash_ids.map(len) == 0).all()
    multi = 0
    for _, s in gen[gen.session_id >= 0].groupby("session_id"):
        assert s.city.nunique() == 1 and s.model.nunique() == 1
        prompts, hashes = s.prompt_tokens.to_numpy(), s.hash_ids.tolist()
        assert (np.diff(prompts) > 0).all()
        for k in range(1, len(s)):
            shared = prompts[k - 1] // B
            assert hashes[k][:shared] == hashes[k - 1][:shared]
            assert set(hashes[k][shared:]).isdisjoint(hashes[k - 1])
            # Turn k sends turn k-1's prompt and answer plus a new message.
            assert prompts[k] > prompts[k - 1] + s.output_tokens.iloc[k - 1]
        multi += len(s) > 1
    assert multi > 500
    # Different sessions and session-less requests never share a block.
    owner = {}
    for sid, rid, h in zip(gen.session_id, gen.request_id, gen.hash_ids, strict=True):
        who = sid if sid >= 0 else -1 - rid
        for b in h:
            assert owner.setdefault(b, who) == who
    # Block ids are numbered by first appearance, as in Mooncake traces.
    flat = np.concatenate([np.asarray(h) for h in gen.hash_ids])
    assert (first_appearance_ids(flat, np.ones(len(flat), bool)) == flat).all()
    reuse = prefix_reuse_ratio(gen.hash_ids, B, gen.prompt_tokens.to_numpy())
    assert 0.2 < reuse < 0.9


def test_no_sessions_no_reuse(default_wl):
    r = default_wl.requests
    gen = r[r.task == "text-generation"]
    assert (r.session_id == -1).all()
    assert prefix_reuse_ratio(gen.hash_ids, 512, gen.prompt_tokens.to_numpy()) == 0.0


def test_batch_and_reject_flags(topo):
    w = make(topo, seed=9, requests=20_000, batch_fraction=0.3, reject_if_busy_fraction=0.2, session_fraction=0.5)
    r = w.requests
    assert not r.batch[r.session_id >= 0].any()
    free = r[r.session_id < 0]
    assert abs(free.batch.mean() - 0.3) < 4 * np.sqrt(0.21 / len(free))
    assert abs(r.reject_if_busy.mean() - 0.2) < 4 * np.sqrt(0.16 / len(r))


def test_requests_and_duration_whichever_first(topo):
    assert len(make(topo, requests=500, duration_s=1e6, rps=10)) == 500
    w = make(topo, requests=10_000, duration_s=5.0, rps=100)
    assert len(w) < 1000 and w.requests.arrival_s.max() < 5.0


def test_parquet_round_trip_and_summary(tmp_path, session_wl):
    path = session_wl.to_parquet(tmp_path / "w.parquet")
    back = Workload.from_parquet(path)
    pd.testing.assert_frame_equal(back.requests, session_wl.requests)
    assert back.config == session_wl.config and back.seed == 11 and back.source == "poisson"
    s = session_wl.summary(bin_s=10.0)
    assert sum(s["per_model"].values()) == len(session_wl) == sum(s["per_continent"].values())
    assert abs(sum(s["rate"]["rps"]) * 10.0 - len(session_wl)) < 1e-6
    assert s["sessions"] == session_wl.requests.session_id.max() + 1


def test_config_round_trips_through_dict():
    cfg = WorkloadConfig.from_dict({"requests": 5, "mix": {"@cf/baai/bge-m3": 1.0}, "day_compression": 3600,
                                    "tokens": {"text-generation": {"prompt": {"median": 500}}},
                                    "bursts": [{"start_s": 1, "duration_s": 2, "multiplier": 3, "country": "DE"}]})
    assert WorkloadConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.tokens["text-generation"].prompt.sigma == 0.99  # unset fields keep their defaults
    trace = WorkloadConfig.from_dict({"kind": "azure", "trace_speed": 2.0})
    assert WorkloadConfig.from_dict(trace.to_dict()) == trace


@pytest.mark.parametrize("raw, words", [
    ({"requests": 10, "colour": 1}, ["colour"]),
    ({"kind": "uniform", "requests": 1}, ["kind", "uniform"]),
    ({"requests": 0}, ["requests", "0"]),
    ({"requests": 1.5}, ["requests", "1.5"]),
    ({"requests": 10, "rps": -1}, ["rps", "-1"]),
    ({"requests": 10, "rps": "fast"}, ["rps", "fast"]),
    ({"requests": 10, "start_utc": "yesterday"}, ["start_utc", "yesterday"]),
    ({"requests": 10, "day_compression": 10}, ["day_compression", "10"]),
    ({"requests": 10, "mix": {"@cf/a/b": -1}}, ["mix", "-1"]),
    ({"requests": 10, "session_fraction": 1.5}, ["session_fraction", "1.5"]),
    ({"requests": 10, "session_turns": 0.5}, ["session_turns", "0.5"]),
    ({"requests": 10, "batch_fraction": -0.1}, ["batch_fraction", "-0.1"]),
    ({"requests": 10, "diurnal": "yes"}, ["diurnal", "yes"]),
    ({"requests": 10, "bursts": [{"start_s": 0, "duration_s": 1}]}, ["bursts[0]", "multiplier"]),
    ({"requests": 10, "bursts": [{"start_s": 0, "duration_s": 1, "multiplier": 2, "continent": "XX"}]},
     ["continent", "XX"]),
    ({"requests": 10, "bursts": [{"start_s": 0, "duration_s": 1, "multiplier": 2, "country": "usa"}]},
     ["country", "usa"]),
    ({"requests": 10, "tokens": {"text-generation": {"prompt": {"median": 0}}}}, ["text-generation", "median"]),
    ({"requests": 10, "tokens": {"text-embeddings": {"output": {"median": 5}}}}, ["text-embeddings", "output"]),
    ({"requests": 10, "tokens": {"painting": {}}}, ["painting"]),
    ({"requests": 10, "trace": "x.csv"}, ["trace", "poisson"]),
    ({"kind": "azure", "mix": {"@cf/baai/bge-m3": 1}}, ["mix", "azure"]),
    ({"kind": "azure", "trace_speed": 0}, ["trace_speed", "0"]),
    ({"kind": "azure", "trace_model": "llama"}, ["trace_model", "llama"]),
    ({"kind": "mooncake", "trace_limit": -3}, ["trace_limit", "-3"]),
])
def test_bad_config_fields_give_one_line_errors(raw, words):
    with pytest.raises(UserError) as err:
        WorkloadConfig.from_dict(raw, where="s.toml [workload]")
    msg = str(err.value)
    assert msg.startswith("s.toml [workload]") and "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


def test_unknown_model_in_mix_is_a_user_error(topo):
    with pytest.raises(UserError, match="no-such-model"):
        make(topo, requests=10, mix={"@cf/acme/no-such-model": 1.0})


def test_a_toml_workload_table_parses(topo):
    import tomllib

    doc = tomllib.loads("""
[workload]
kind = "poisson"
requests = 3000
rps = 50.0
start_utc = 2024-06-21T18:00:00Z
day_compression = 3600
session_fraction = 0.3
mix = { "@cf/meta/llama-3.1-8b-instruct" = 0.7, "@cf/baai/bge-base-en-v1.5" = 0.3 }

[workload.tokens.text-generation]
prompt = { median = 800, sigma = 0.9 }

[[workload.bursts]]
start_s = 10.0
duration_s = 20.0
multiplier = 4.0
continent = "SA"
""")
    cfg = WorkloadConfig.from_dict(doc["workload"])
    assert cfg.start_utc.hour == 18 and cfg.bursts[0].continent == "SA" and cfg.tokens["text-generation"].prompt.median == 800
    w = generate(cfg, topo, CAT, 0)
    assert len(w) == 3000 and set(w.requests.model) == set(cfg.mix)


def test_hash_id_column_holds_each_requests_slice():
    """The Arrow column of flat ids and offsets reads back as each request's slice, from arrays or from tuples."""
    from sim.sessions import as_hash_id_column, hash_id_column

    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 5, 200)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    ids = rng.integers(0, 10**12, int(offsets[-1]))
    expected = [tuple(ids[a:b].tolist()) for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    for column in (hash_id_column(ids, offsets), as_hash_id_column(expected)):
        got = pd.Series(column)
        assert [tuple(h) for h in got] == expected and got.map(len).tolist() == lengths.tolist()
    assert len(as_hash_id_column([])) == 0


def test_a_poisson_workload_without_a_size_is_refused_when_generated(topo):
    cfg = WorkloadConfig.from_dict({"rps": 10})  # the size may come later, from the command line
    with pytest.raises(UserError, match="needs a size: requests"):
        generate(cfg, topo)


def test_a_workload_with_each_users_last_mile_checks_and_round_trips(tmp_path, topo):
    from sim.workload import Workload

    wl = generate(WorkloadConfig.from_dict({"requests": 300, "rps": 50.0}), topo.with_last_mile(10.0, "country"),
                  rng=1)
    assert "last_mile_ms" in wl.requests
    wl.check()
    wl.to_parquet(tmp_path / "w.parquet")
    back = Workload.from_parquet(tmp_path / "w.parquet")
    pd.testing.assert_frame_equal(back.requests, wl.requests)


def test_workload_errors_found_while_generating_name_the_scenario_file(tmp_path):
    from sim.run import run_scenario

    p = tmp_path / "s.toml"
    p.write_text('[workload]\nkind = "poisson"\nrequests = 100\nrps = 5.0\n'
                 'bursts = [{ start_s = 1.0, duration_s = 2.0, multiplier = 2.0, country = "XX" }]\n')
    with pytest.raises(UserError, match=r"s.toml \[workload\]: field bursts\[0\]: no demand city matches"):
        run_scenario(str(p), deployments=("edge",))


def test_a_session_that_outgrows_its_window_goes_on_as_a_new_chat():
    """Every drawn turn arrives (the workload keeps its rate and session share): a turn whose history would not
    fit the window opens a new chat with a fresh first message, and the session's later turns build on it."""
    from sim.sessions import expand_sessions
    from sim.tokens import DEFAULT_TOKENS

    rng = np.random.default_rng(3)
    n, ctx = 400, 600
    k_rng = np.random.default_rng(3)
    k = k_rng.geometric(1 / 12.0, n)  # the draw expand_sessions makes first, from the same seed
    tr = expand_sessions(np.zeros(n), np.full(n, ctx), DEFAULT_TOKENS["text-generation"], 12.0, 5.0, rng)
    assert len(tr.t) == k.sum()  # no turn dropped
    assert (tr.prompt <= ctx - 1).all() and (tr.prompt + tr.output <= ctx).all()
    assert tr.n_chats > n  # some sessions outgrew 600 tokens and went on in new chats
    new = np.flatnonzero(tr.turn == 0)
    assert len(new) == tr.n_chats and (np.diff(tr.chat[new]) == 1).all()
    later = tr.turn > 0  # within a chat, each turn's history grows
    assert (tr.prompt[later] > tr.prompt[np.flatnonzero(later) - 1]).all()
    assert (tr.session[tr.chat == tr.chat[new[-1]]] == tr.session[new[-1]]).all()  # a chat is one session's


def test_a_span_of_too_many_diurnal_minutes_is_refused_before_drawing(topo):
    """A year at a day per minute is ~10^9 one-minute bins of the diurnal clock: hours of drawing, refused at once."""
    cfg = WorkloadConfig.from_dict({"duration_s": 31_000_000.0, "rps": 0.01, "day_compression": 60})
    with pytest.raises(UserError, match="day_compression: .* minutes of the diurnal clock"):
        generate(cfg, topo, rng=1)


def test_a_few_requests_after_a_long_session_warm_up_are_drawn_in_rounds_that_count_each_arrival_once(topo,
                                                                                                   monkeypatch):
    # 100 requests after a warm-up of ~20,000 arrivals: hundreds of draw rounds. Each round used to recount every
    # part drawn so far (quadratic: 3.5 s here, 23 s for 10 requests of the default scenario); now each part is
    # counted once, which the number of times the parts' times are read shows without timing anything.
    import sim.workload as wl

    reads, parts = [0], [0]

    class Part(dict):
        def __getitem__(self, key):
            reads[0] += key == "t"
            return super().__getitem__(key)

    def counted(real):
        def draw(*args, **kw):
            out = real(*args, **kw)
            parts[0] += 1
            return (Part(out[0]), *out[1:]) if isinstance(out, tuple) else Part(out)
        return draw

    monkeypatch.setattr(wl, "_singles", counted(wl._singles))
    monkeypatch.setattr(wl, "_turns", counted(wl._turns))
    cfg = WorkloadConfig.from_dict({"requests": 100, "rps": 25, "session_fraction": 0.3, "session_turns": 20,
                                    "think_time_s": 240})
    w = generate(cfg, topo, rng=1)
    assert len(w.requests) == 100 and parts[0] > 300  # hundreds of rounds, two parts each
    assert reads[0] <= 3 * parts[0] + 10  # (the frame's assembly reads each part's times once more)
    assert w.requests.arrival_s.min() >= 0 and np.all(np.diff(w.requests.arrival_s.to_numpy()) >= 0)
    with pytest.raises(UserError, match=r"10 requests after a session warm-up of .* ask for at least \d+ requests, "
                                        "or give duration_s"):
        generate(WorkloadConfig.from_dict({"requests": 10, "rps": 0.01, "session_fraction": 1,
                                           "session_turns": 1000, "think_time_s": 86400}), topo, rng=1)


def test_summary_token_means_are_over_the_llm_requests_even_with_zero_outputs(topo, tmp_path):
    f = tmp_path / "azure.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,1000,0\n"
                 "2023-11-16 18:15:47.6805900,10,10\n")
    s = generate(WorkloadConfig.from_dict({"kind": "azure", "trace": str(f)}), topo, rng=1).summary()
    assert s["mean_prompt_tokens_llm"] == 505.0


def test_an_empty_mix_is_an_error_not_the_default(topo):
    """``WorkloadConfig(mix={})`` from Python generated the built-in mix (a scenario file's empty mix is refused)."""
    with pytest.raises(UserError, match=r"^workload: mix must be a non-empty table of model id = share, got \{\}$"):
        generate(WorkloadConfig(requests=100, rps=10.0, mix={}), topo, default_catalog(), np.random.default_rng(0))
