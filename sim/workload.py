"""Workloads: the requests a simulation serves, one row per request, generated or replayed from a trace.

``generate(config, topo, catalog, rng)`` returns a :class:`Workload` whose frame has exactly ``COLUMNS``, sorted by
arrival. Invariants: ``request_id`` is 0..n-1 in arrival order; arrivals are non-decreasing and non-negative;
``output_tokens`` is 0 for tasks other than text generation; turns of one session share city and model; generated
LLM requests fit their model's context window (replayed traces keep their sizes); every row's user, ingress and
access RTT are those of its city. ``Workload.check`` asserts all but the last, which needs the topology.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path

import numpy as np
import pandas as pd

from controlplane.catalog import Catalog, default_catalog
from controlplane.forecast import DEFAULT_MIX, normalise_mix
from edgepop.errors import UserError
from sim.arrivals import MAX_BINS, Cities, Groups, bin_width_s, city_table, poisson_chunks
from sim.sessions import (
    THINK_SIGMA,
    as_hash_id_column,
    block_hash_ids,
    expand_sessions,
    first_appearance_ids,
    hash_id_column,
)
from sim.tokens import draw_sizes
from sim.traces import MAX_SPAN_S, read_trace
from sim.workload_config import TRACE_START, WorkloadConfig

COLUMNS = ("request_id", "arrival_s", "city", "user_lat", "user_lon", "user_country", "user_continent", "ingress",
           "ingress_pop", "access_rtt_ms", "model", "task", "prompt_tokens", "output_tokens", "session_id",
           "hash_ids", "batch", "reject_if_busy")
# Present only when asked for, in this order: ``adapter`` (adapter_fraction > 0) and ``last_mile_ms`` (a topology
# whose last mile is not one fixed value: each user's own).
OPTIONAL_COLUMNS = ("adapter", "last_mile_ms")


def known_columns(columns) -> bool:
    """Whether ``columns`` are a workload frame's: ``COLUMNS`` then any of ``OPTIONAL_COLUMNS``, in order."""
    columns = tuple(columns)
    rest = columns[len(COLUMNS):]
    return columns[:len(COLUMNS)] == COLUMNS and rest == tuple(c for c in OPTIONAL_COLUMNS if c in rest)
META_KEY = b"edgepop.workload"
MAX_SUMMARY_BINS = 1_000_000  # bins of Workload.summary's rate over time


@dataclass
class Workload:
    """A frame of requests (``requests``, columns ``COLUMNS``) and where it came from."""

    requests: pd.DataFrame
    config: WorkloadConfig
    seed: object = None  # the seed of the generator used, when known
    source: str = "poisson"  # "poisson" or the replayed trace's file name
    meta: dict = field(default_factory=dict)
    # requests the replayed trace file holds, before trace_limit and the cuts (not stored in parquet files)
    trace_rows: int | None = None
    # the replayed trace's own first timestamp (UTC), when its format holds absolute times (Azure's); else None
    trace_first_utc: pd.Timestamp | None = None

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def duration_s(self) -> float:
        return float(self.requests.arrival_s.iloc[-1]) if len(self.requests) else 0.0

    def summary(self, bin_s: float | None = None) -> dict:
        """Counts per model, task and continent, token means, and the request rate over time (``bin_s`` bins,
        by default 60 bins over the run)."""
        r = self.requests
        dur = self.duration_s
        if bin_s is None:
            bin_s = max(dur / 60.0, 1e-9)
        elif (isinstance(bin_s, bool) or not isinstance(bin_s, Real) or not np.isfinite(bin_s) or bin_s <= 0
              or dur / bin_s > MAX_SUMMARY_BINS):  # (a tiny bin would count into billions of bins)
            raise UserError(f"Workload.summary: bin_s must be a number of seconds > 0 that splits the "
                            f"{dur:.6g} s run into at most {MAX_SUMMARY_BINS:,} bins, got {bin_s!r}")
        nbins = max(1, int(np.ceil(dur / bin_s))) if dur > 0 else 1
        counts = np.bincount(np.minimum((r.arrival_s.to_numpy() / bin_s).astype(np.int64), nbins - 1),
                             minlength=nbins)
        gen = r.task.to_numpy() == "text-generation"  # (an LLM request may ask for, or a trace record, 0 tokens)
        return {
            "source": self.source, "seed": self.seed, "requests": len(r), "duration_s": dur,
            "mean_rps": len(r) / dur if dur > 0 else float("nan"),
            "per_model": r.model.value_counts().to_dict(),
            "per_task": r.task.value_counts().to_dict(),
            "per_continent": r.user_continent.value_counts().to_dict(),
            "sessions": int(r.session_id.max() + 1) if len(r) else 0,
            "batch": int(r.batch.sum()), "reject_if_busy": int(r.reject_if_busy.sum()),
            "mean_prompt_tokens_llm": float(r.prompt_tokens[gen].mean()) if gen.any() else 0.0,
            "mean_output_tokens_llm": float(r.output_tokens[gen].mean()) if gen.any() else 0.0,
            "rate": {"bin_s": bin_s, "rps": (counts / bin_s).tolist()},
        }

    def check(self, catalog: Catalog | None = None) -> None:
        """Assert the invariants listed in the module docstring (used by tests; cheap enough for any run)."""
        r = self.requests
        assert known_columns(r.columns), list(r.columns)
        assert (r.request_id.to_numpy() == np.arange(len(r))).all()
        t = r.arrival_s.to_numpy()
        assert (t >= 0).all() and (np.diff(t) >= 0).all()
        non_gen = r.task.to_numpy() != "text-generation"
        assert (r.output_tokens.to_numpy()[non_gen] == 0).all()
        s = r[r.session_id >= 0]
        assert (s.groupby("session_id").agg(c=("city", "nunique"), m=("model", "nunique")) == 1).all().all()
        if self.source == "poisson":
            catalog = catalog or default_catalog()
            ctx = r.model.map({m: catalog[m].context_window for m in r.model.unique()}).to_numpy()
            llm = ~non_gen
            assert (r.prompt_tokens.to_numpy()[llm] + r.output_tokens.to_numpy()[llm] <= ctx[llm]).all()

    def to_parquet(self, path: str | Path) -> Path:
        """Write the frame (hash_ids as lists of int64) with config, seed and source in the file's metadata."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = Path(path)
        frame = self.requests.drop(columns=["hash_ids"])
        table = pa.Table.from_pandas(frame, preserve_index=False)
        ids = pa.array(self.requests.hash_ids.tolist(), type=pa.list_(pa.int64()))
        table = table.add_column(COLUMNS.index("hash_ids"), "hash_ids", ids)
        meta = {"config": self.config.to_dict(), "seed": self.seed, "source": self.source, "meta": self.meta}
        table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                               META_KEY: json.dumps(meta, default=str).encode()})
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        return path

    @classmethod
    def from_parquet(cls, path: str | Path) -> Workload:
        """Read a workload written by ``to_parquet``."""
        import pyarrow.parquet as pq

        path = Path(path)
        try:
            table = pq.read_table(path)
        except (OSError, ValueError) as exc:
            raise UserError(f"{path}: not a readable parquet file ({exc})") from None
        raw = (table.schema.metadata or {}).get(META_KEY)
        if raw is None or not known_columns(table.column_names):
            raise UserError(f"{path}: not an edgepop workload file (no {META_KEY.decode()} metadata or columns)")
        meta = json.loads(raw)
        ids = table.column("hash_ids").combine_chunks()
        frame = table.drop_columns(["hash_ids"]).to_pandas()
        frame.insert(COLUMNS.index("hash_ids"), "hash_ids", hash_id_column(ids.values, ids.offsets))
        stored = dict(meta["config"])
        if stored.get("kind", "poisson") != "poisson":  # files written before block_tokens was Poisson-only
            stored.pop("block_tokens", None)
        cfg = WorkloadConfig.from_dict(stored, where=f"{path} metadata")
        return cls(frame, cfg, meta.get("seed"), meta.get("source", "?"), meta.get("meta", {}))


def _seed_of(rng: np.random.Generator):
    seq = getattr(rng.bit_generator, "seed_seq", None)
    if seq is None or not hasattr(seq, "entropy"):
        return None
    return seq.entropy if not seq.spawn_key else [seq.entropy, list(seq.spawn_key)]


def generate(config: WorkloadConfig, topo, catalog: Catalog | None = None,
             rng: np.random.Generator | int | None = 0) -> Workload:
    """The requests of ``config`` over ``topo``'s demand cities: Poisson-generated or a replayed trace.

    Every random draw comes from ``rng`` (a Generator, or an int seed): the same seed gives the same frame.
    """
    catalog = catalog or default_catalog()
    config.check("workload")  # (a config built or edited in Python: from a file it passes again)
    for model in (config.mix or {}) if not config.is_trace else ():
        if model not in catalog:
            raise UserError(f"workload mix: no model {model!r} in the catalog ({len(catalog)} models)")
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    cities = city_table(topo)
    rows = first_utc = None
    if config.is_trace:
        cols, source, rows, first_utc = _replay(config, catalog, cities, rng)
    else:
        cols, source = _poisson(config, catalog, cities, rng), "poisson"
    frame = _frame(cols, cities, catalog, config, rng)
    last = float(frame.arrival_s.max()) if len(frame) else 0.0
    if not config.is_trace and last > MAX_SPAN_S:  # (bursts that silence the first year, say)
        raise UserError(f"workload: the arrivals run to {last:.3g} s, more than a year ({MAX_SPAN_S:.0f} s): check "
                        "the bursts' multipliers and spans, or the rate")
    if getattr(topo, "last_mile_mode", "fixed") != "fixed":  # users straight to a region pay their own last mile
        frame["last_mile_ms"] = cities.last_mile_ms[frame.city.to_numpy()]
    return Workload(frame, config, _seed_of(rng), source, trace_rows=rows, trace_first_utc=first_utc)


def _poisson(cfg: WorkloadConfig, catalog: Catalog, cities: Cities, rng: np.random.Generator) -> dict:
    """Arrival time, city, model, sizes and session of every request, in no particular order."""
    shares = normalise_mix(DEFAULT_MIX if cfg.mix is None else cfg.mix, catalog)  # ({}: an error, not the default)
    models = list(shares)
    specs = [catalog[m] for m in models]
    p = np.array([shares[m] for m in models])
    gen = np.array([s.generative for s in specs])
    # Session turns after the first are extra arrivals, so the process draws fewer starts to keep the mean rate:
    # a generative share g with session share s and mean turns T needs base rate rps * (1 - g s (1 - 1/T)).
    s, turns = cfg.session_fraction, cfg.session_turns
    per_base = np.where(gen, 1 - s + s / turns, 1.0)
    q = p * per_base
    base_rps = cfg.rps * q.sum()
    q_cum = np.cumsum(q / q.sum())
    p_start = (s / turns) / (1 - s + s / turns)
    groups = Groups.build(cities, cfg)
    _check_bursts(cfg, groups)
    if cfg.requests is None and cfg.duration_s is None:
        raise UserError("workload: a Poisson workload needs a size: requests (a count) or duration_s (seconds)")
    _check_bins(cfg)
    # With sessions, start early so that conversations already under way at time 0 are present (a stationary
    # start); arrivals before 0 are dropped.
    horizon = -warmup_s(cfg) if s > 0 else 0.0
    parts, n_sessions = [], 0
    # Arrivals counted so far (at or after 0, up to the horizon) and, sorted, those not yet under the horizon (later
    # session turns): a small count after a long warm-up takes many rounds, and a recount of every part each round
    # made that quadratic (10 requests after a 20-minute warm-up took 23 s).
    have, ahead, pending, counted = 0, np.empty(0), [], 0
    while cfg.duration_s is None or horizon < cfg.duration_s:
        need = None
        if cfg.requests is not None:
            pending += [part["t"][part["t"] >= 0] for part in parts[counted:]]
            counted = len(parts)
            if horizon >= 0 and pending:  # (none is under a horizon before 0: merged once the warm-up is over)
                ahead, pending = np.sort(np.concatenate([ahead, *pending])), []
            k = int(np.searchsorted(ahead, horizon, side="right"))
            have, ahead = have + k, ahead[k:]
            missing = cfg.requests - have
            if missing <= 0:
                break
            need = (missing + 4 * np.sqrt(missing) + 10) * base_rps / cfg.rps
        for t, city, stop in poisson_chunks(groups, cfg, base_rps, rng, horizon, cfg.duration_s, need):
            model = np.minimum(np.searchsorted(q_cum, rng.random(len(t)), side="right"), len(models) - 1)
            start = gen[model] & (rng.random(len(t)) < p_start)
            part = _singles(t[~start], city[~start], model[~start], specs, cfg, rng)
            turns_part, n_chats = _turns(t[start], city[start], model[start], specs, cfg, rng, n_sessions)
            n_sessions += n_chats
            parts += [part, turns_part]
            if stop is not None:
                horizon = stop
    cols = {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}
    cols["models"] = models
    return cols


# Sessions start a warm-up before time 0 (conversations already under way), drawn at the full rate and then
# dropped: past this many arrivals the warm-up alone takes minutes and gigabytes.
MAX_WARMUP_ARRIVALS = 20_000_000
MAX_WARMUP_ROUNDS = 10_000  # about 45 s of draws


def _check_bins(cfg: WorkloadConfig) -> None:
    lead = warmup_s(cfg) if cfg.session_fraction > 0 else 0.0
    if lead * cfg.rps > MAX_WARMUP_ARRIVALS:
        raise UserError(f"workload session_turns / think_time_s: {cfg.session_turns} turns {cfg.think_time_s:g} s "
                        f"apart need a warm-up of {lead:.3g} s before time 0, {lead * cfg.rps:.3g} arrivals at "
                        f"{cfg.rps:g} req/s (more than {MAX_WARMUP_ARRIVALS:,}): ask for fewer turns or shorter "
                        "think times")
    if cfg.requests is not None and cfg.duration_s is None:
        # A count-mode draw walks through the warm-up a little over `requests` arrivals at a time: a few requests
        # after a warm-up of millions of arrivals would take minutes of rounds.
        step = cfg.requests + 4 * np.sqrt(cfg.requests) + 10
        if lead * cfg.rps / step > MAX_WARMUP_ROUNDS:
            raise UserError(f"workload requests: {cfg.requests} requests after a session warm-up of "
                            f"{lead * cfg.rps:.3g} arrivals ({cfg.session_turns:g} turns {cfg.think_time_s:g} s apart "
                            f"at {cfg.rps:g} req/s) take more than {MAX_WARMUP_ROUNDS:,} draw rounds: ask for at "
                            f"least {int(np.ceil(lead * cfg.rps / MAX_WARMUP_ROUNDS))} requests, or give duration_s")
    span = (cfg.duration_s if cfg.duration_s is not None else cfg.requests / cfg.rps) + lead
    bins = span / bin_width_s(cfg)
    if bins > MAX_BINS:
        clock = f"at {cfg.day_compression:g} s a day" if cfg.day_compression else "in real time"
        raise UserError(f"workload day_compression: {span:.3g} simulated s {clock} cover {bins:.3g} minutes of the "
                        f"diurnal clock, each drawn in turn (more than {MAX_BINS:,}): "
                        "ask for a shorter span (fewer requests, a higher rps) or compress the day less")


def warmup_s(cfg: WorkloadConfig) -> float:
    """Lead time before 0 that covers all but a negligible tail of sessions: four mean session lengths."""
    mean_gap = cfg.think_time_s * np.exp(THINK_SIGMA ** 2 / 2)
    return 4.0 * mean_gap * max(cfg.session_turns - 1.0, 1.0)


def _singles(t, city, model, specs, cfg, rng) -> dict:
    prompt = np.zeros(len(t), np.int64)
    output = np.zeros(len(t), np.int64)
    for m in np.unique(model):
        sel = model == m
        sizes = draw_sizes(specs[m], cfg.tokens[specs[m].task], int(sel.sum()), rng)
        prompt[sel], output[sel] = sizes.prompt, sizes.output
    return {"t": t, "city": city, "model": model, "prompt": prompt, "output": output,
            "session": np.full(len(t), -1, np.int64)}


def _turns(t0, city, model, specs, cfg, rng, session_offset: int) -> tuple[dict, int]:
    """The turns of sessions starting at ``t0``, session ids from ``session_offset`` on (one per chat: a session
    that outgrew its window goes on as new chats), and how many ids they took."""
    ctx = np.array([s.context_window for s in specs], np.int64)[model]
    tr = expand_sessions(t0, ctx, cfg.tokens["text-generation"], cfg.session_turns, cfg.think_time_s, rng)
    return {"t": tr.t, "city": city[tr.session], "model": model[tr.session], "prompt": tr.prompt,
            "output": tr.output, "session": tr.chat + session_offset}, tr.n_chats


def _check_bursts(cfg: WorkloadConfig, groups: Groups) -> None:
    for i, b in enumerate(cfg.bursts):
        if not groups.burst_mask(b).any():
            raise UserError(f"workload bursts[{i}]: no demand city matches continent={b.continent!r} "
                            f"country={b.country!r}")


def _replay(cfg: WorkloadConfig, catalog: Catalog, cities: Cities, rng: np.random.Generator
            ) -> tuple[dict, str, int, pd.Timestamp | None]:
    try:
        spec = catalog[cfg.trace_model]
    except UserError as exc:
        raise UserError(f"workload trace_model: {exc}") from None
    if not spec.generative:
        raise UserError(f"workload trace_model: {cfg.trace_model!r} is a {spec.task} model; traces replay "
                        "LLM requests, so it must be a text-generation model")
    trace, name = read_trace(cfg.trace, cfg.kind)
    rows, first_utc = len(trace), trace.attrs.get("first_utc")
    if cfg.start_utc == TRACE_START and first_utc is None:
        raise UserError(f'workload start_utc: "trace" needs a trace with absolute times (an Azure CSV\'s); the '
                        f"{cfg.kind} trace {name} holds times relative to its first request: give an ISO time")
    order = np.argsort(trace.arrival_s.to_numpy(), kind="stable")
    if cfg.trace_limit is not None:
        order = order[:cfg.trace_limit]
    trace = trace.iloc[order]
    t = trace.arrival_s.to_numpy() / cfg.trace_speed
    if len(t) and float(t.max()) > MAX_SPAN_S:  # (the trace's own span was checked before the speed-up)
        raise UserError(f"workload trace_speed {cfg.trace_speed:g}: the replay would span {float(t.max()):.3g} s, "
                        f"more than a year ({MAX_SPAN_S:.0f} s)")
    n = len(t)
    return {"t": t, "city": cities.draw_by_population(rng, n), "model": np.zeros(n, np.int64),
            "models": [cfg.trace_model],
            "prompt": trace.prompt_tokens.to_numpy(), "output": trace.output_tokens.to_numpy(),
            "session": np.full(n, -1, np.int64), "hash_ids": trace.hash_ids.to_numpy()}, name, rows, first_utc


def _frame(cols: dict, cities: Cities, catalog: Catalog, cfg: WorkloadConfig, rng: np.random.Generator
           ) -> pd.DataFrame:
    """Cut to the requested span, sort by arrival, and attach users, ingress, hash ids and flags."""
    t = cols["t"]
    keep = t >= 0 if cfg.duration_s is None else (t >= 0) & (t < cfg.duration_s)
    order = np.flatnonzero(keep)[np.argsort(t[keep], kind="stable")]
    if cfg.requests is not None:
        order = order[:cfg.requests]
    models = cols.pop("models")
    c = {k: v[order] for k, v in cols.items()}
    n, city = len(order), c["city"]
    model = np.asarray(models, object)[c["model"]]
    task = np.asarray([catalog[m].task for m in models], object)[c["model"]]
    session = first_appearance_ids(c["session"], c["session"] >= 0)
    if "hash_ids" in c:
        hash_ids = as_hash_id_column(c["hash_ids"])
    else:
        tracked = task == "text-generation"
        # A session-less request is the only user of its prefix: give it its own group after the sessions'.
        group = np.where(session >= 0, session, session.max(initial=-1) + 1 + np.arange(n))
        # untracked rows have no blocks: a prompt of 0 tokens
        hash_ids = hash_id_column(*block_hash_ids(np.where(tracked, c["prompt"], 0), group, cfg.block_tokens))
    batch = (rng.random(n) < cfg.batch_fraction) & (session < 0)
    reject = rng.random(n) < cfg.reject_if_busy_fraction
    frame = pd.DataFrame({
        "request_id": np.arange(n, dtype=np.int64), "arrival_s": c["t"].astype(np.float64),
        "city": city.astype(np.int64), "user_lat": cities.lat[city], "user_lon": cities.lon[city],
        "user_country": cities.cc[city], "user_continent": cities.continent[city],
        "ingress": cities.ingress[city], "ingress_pop": cities.ingress_pop[city],
        "access_rtt_ms": cities.access_rtt_ms[city], "model": model, "task": task,
        "prompt_tokens": c["prompt"].astype(np.int64), "output_tokens": c["output"].astype(np.int64),
        "session_id": session, "hash_ids": hash_ids, "batch": batch,
        "reject_if_busy": reject})
    if cfg.adapter_fraction > 0:  # drawn last, so workloads without adapters keep every other draw
        from sim.techniques.adapters import draw_adapters

        frame["adapter"] = draw_adapters(frame, catalog, cfg.adapter_fraction, cfg.adapter_zipf, rng)
    return frame


__all__ = ["COLUMNS", "Workload", "generate"]
