"""Sim-vs-live fidelity: run the requests a live replay sent through the simulator, on a mirror of the live
deployment, with service times measured on this machine, and compare client-side latency percentiles.

The mirror is built from the gateway's ``/edgepop/deployment`` description by the builder the gateway itself used
(:func:`controlplane.deployment.deployment_from_table`): the same PoPs, the same replicas on the same nodes with
the same slots, the same router and router options, autoscaler, queue limit and timeout, the same WAN delays
(scaled, or none), the control plane's estimates from the gateway's service-time model and typical request, and
each catalog model timed as its stand-in by
:class:`controlplane.perf_profile.MeasuredProfile` (over a table measured through the gateway,
:mod:`sim.live.live_profile`, of the bare engine, :mod:`dataplane.engine_profile`, or any ``edgepop profile``
table). Requests keep their live arrival times, sizes and client locations; output lengths
are the ones the live gateway produced.

The gateway gives every replica an engine of its own, as the control plane and the simulator believe, but runs
them all on this machine's cores and streams through one event loop. With ``host_model`` on, the simulation
models that host (:mod:`sim.live.host_model`: the live engine's iterations, processor sharing of the cores, the
gateway's per-request and per-piece costs) from a profile measured on it (:mod:`sim.live.host_profile`); off,
every replica has a device of its own, as in any simulation.

The goal: simulated vs live TTFT, TPOT and E2E within 5% at p50 and 10% at p95.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from controlplane.catalog import Catalog, default_catalog
from controlplane.deployment import Deployment, DeploymentConfig, deployment_from_table
from controlplane.fleet import edge_fleet
from controlplane.perf_models import build_run_perf
from controlplane.perf_profile import MeasuredProfile
from controlplane.prefix_index import PrefixIndex
from controlplane.routing.base import advance_draws
from dataplane import profiler, registry
from dataplane.engine_profile import engine_profile
from dataplane.gateway.errors import ACCOUNT_LIMITED, RATE_LIMITED
from dataplane.session import SessionConfig
from edgepop.errors import UserError
from edgepop.rng import streams
from edgepop.stats import finite, percentile
from sim.live.host_model import LiveHost
from sim.live.host_params import HostParams, require_host_rows
from sim.simulator import Simulation

METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")
GOALS = {(m, q): g for m in METRICS for q, g in (("p50", 5.0), ("p95", 10.0))}


def measure_profile(stand_ins: list[str], progress=None, session=None) -> pd.DataFrame:
    """A profile table for ``stand_ins`` measured now: language models through their engine
    (:mod:`dataplane.engine_profile`), other models with ``edgepop profile``'s quick grid."""
    parts = []
    for name in sorted(set(stand_ins)):
        if progress:
            progress(f"measuring {name} on this machine (pass --profile to reuse a table)")
        if registry.get_card(name).task == "text-generation":
            parts.append(engine_profile(name, session=session))
        else:
            parts.append(profiler.profile([name], profiler.QUICK, session))
    return pd.concat(parts, ignore_index=True)


def load_perf(profile, stand_ins: list[str] | None = None, progress=None):
    """A MeasuredProfile from ``profile``: a table, a path to one (``edgepop profile`` output), or None to
    measure ``stand_ins`` now."""
    if isinstance(profile, pd.DataFrame):
        return MeasuredProfile(profile, source="measured now")
    if profile:
        return MeasuredProfile.load(profile)
    return MeasuredProfile(measure_profile(stand_ins or [], progress), source="measured now")


def mirror_catalog(desc: dict) -> Catalog:
    """The served catalog of the gateway ``desc`` describes, each model with the stand-in it runs on."""
    full = Catalog.load(desc["catalog"]) if desc.get("catalog") else default_catalog()  # (a scenario's own)
    models = list(dict.fromkeys(p["model"] for p in desc["placement"]))
    return Catalog([replace(full[m], stand_in=desc["stand_ins"].get(m, full[m].stand_in)) for m in models],
                   source="gateway mirror")


def mirror_topology(desc: dict, topo=None):
    """The topology the live gateway described by ``desc`` serves: its last mile, GPU inventory scale, anycast
    misroute and demand weighting applied to ``topo`` (default: the shipped one)."""
    from topology import Topology

    mode = desc.get("last_mile", "fixed")
    topo = topo if topo is not None else Topology.load(last_mile_ms=desc["last_mile_ms"], last_mile=mode)
    return topo.shaped(desc["last_mile_ms"], mode, desc.get("gpu_inventory_scale", 1.0),
                       desc.get("anycast_misroute", 0.0), seed=desc["seed"],
                       demand_weight=desc.get("demand_weight", "population"))


def on_replay_clock(desc: dict, live: pd.DataFrame) -> dict:
    """``desc`` with its autoscaler's clock starting when the replay started sending (``live.attrs
    ["started_utc"]``), the simulation's time 0: the gateway publishes its own start, and a scheduled autoscaler
    would read the hours off by the gateway's uptime."""
    started = live.attrs.get("started_utc")
    options = desc.get("autoscaler_options") or {}
    if not started or "start_utc" not in options:
        return desc
    return {**desc, "autoscaler_options": {**options, "start_utc": started}}


def mirror_deployment(desc: dict, topo) -> tuple[Deployment, float]:
    """A simulator Deployment equal to the live gateway described by ``desc`` (``/edgepop/deployment``), built
    by the same builder, and the WAN delay scale it injects."""
    cfg = DeploymentConfig(placement=desc.get("placement_policy", "per-pop"), router=desc["router"],
                           router_options=dict(desc.get("router_options", {})),
                           autoscaler=desc.get("autoscaler", "none"),
                           autoscaler_options=dict(desc.get("autoscaler_options", {})),
                           queue_limit=desc["queue_limit"], queue_timeout_s=desc["queue_timeout_s"],
                           pops=list(desc["pops"]))
    scale = float(desc["delay_scale"]) if desc["delay"] else 0.0
    table = pd.DataFrame(desc["placement"])
    node_ids = edge_fleet(topo, list(desc["pops"])).nodes.node_id.to_numpy()
    for p in desc["placement"]:
        if node_ids[p["node"]] != p["node_id"]:
            raise UserError(f"mirror: node {p['node']} is {node_ids[p['node']]} here but {p['node_id']} live "
                            "(different topology tables?)")
    prefix = PrefixIndex(desc["prefix_block"]) if desc.get("prefix_block") else None
    # The control plane's estimates as the gateway's (a scenario's service-time model and typical request, or the
    # gateway's own): routers that read them decide here as they did live.
    perf = build_run_perf(desc.get("perf", "roofline"), topo, desc.get("prefill_time_scale", 1.0),
                          desc.get("decode_time_scale", 1.0))
    dep = deployment_from_table("edge", cfg, topo, mirror_catalog(desc), list(desc["pops"]),
                                table[["model", "node", "slots"]], rng_route=streams(desc["seed"])["route_edge"],
                                rtt_scale=scale, prefix=prefix, perf=perf,
                                typical_tokens=tuple(desc.get("typical_tokens", (512, 128))))
    # Replicas the live autoscaler had scaled to zero start cold here too (same ids: a row per replica it knows);
    # one still loading its weights live starts its load here at the replay's start (the description does not say
    # how far it got: the whole cold start, at worst).
    for r, status in zip(dep.plane.state.replicas, table.get("status", pd.Series(["ready"] * len(table))),
                         strict=True):
        if status in ("cold", "loading"):
            dep.plane.state.unload(r)
        if status == "loading":
            dep.plane.state.begin_load(r, 0.0, dep.plane.admission.cold_start_s(r.spec))
    return dep, scale


def workload_from_live(live: pd.DataFrame, scale: float) -> pd.DataFrame:
    """The simulator's workload frame for the requests a replay sent (live send times and output lengths)."""
    w = live.copy()
    lag = w.sent_lag_ms.fillna(0.0).to_numpy() / 1e3 if "sent_lag_ms" in w else 0.0
    w["arrival_s"] = w.arrival_s.to_numpy() + lag
    produced = pd.to_numeric(w.get("completion_tokens"), errors="coerce")
    w["output_tokens"] = np.where(produced.notna() & (produced > 0), produced, w.output_tokens).astype(np.int64)
    if "first_piece" in w:  # the token that completed the first visible piece (a UTF-8 character may span several)
        w["first_piece_token"] = pd.to_numeric(w.first_piece, errors="coerce").fillna(1).clip(lower=1)
    served = pd.to_numeric(w.get("prompt_tokens_served"), errors="coerce")
    w["prompt_tokens"] = np.where(served.notna() & (served > 0), served, w.prompt_tokens).astype(np.int64)
    w["access_rtt_ms"] = w.access_rtt_ms.to_numpy() * scale
    w = w.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    return w


# Refusals before the control plane saw the request (bad input, auth, no such model, too long, the rate limits):
# never admitted, so left out of the simulation. Everything else the gateway answered (a queue timeout 408, a
# capacity refusal 429/3040, a failure after it started) was admitted, and is simulated.
REFUSED_STATUSES = frozenset({400, 401, 403, 404, 413})
RATE_LIMIT_CODES = frozenset({RATE_LIMITED, ACCOUNT_LIMITED})  # 429s of the limits; 429/3040 is capacity


def error_code(text) -> int | None:
    """The Workers AI code of a gateway error envelope (the start of the body the client kept), if any."""
    m = re.search(r'"code":\s*(\d+)', text) if isinstance(text, str) else None
    return int(m.group(1)) if m else None


def left_out(live: pd.DataFrame) -> pd.Series:
    """Why each live request stays out of the simulation: ``refused`` (before admission), ``no answer`` (status 0:
    a connection error, the gateway may never have seen it) or '' (simulated)."""
    status = pd.to_numeric(live.status, errors="coerce").fillna(0).astype(int)
    codes = live.error.map(error_code) if "error" in live else pd.Series(None, index=live.index)
    refused = status.isin(REFUSED_STATUSES) | ((status == 429) & codes.isin(RATE_LIMIT_CODES))
    return pd.Series(np.where(status == 0, "no answer", np.where(refused, "refused", "")), index=live.index)


def admitted(live: pd.DataFrame) -> pd.DataFrame:
    """The requests the simulation runs (``edgepop replay`` and the matrix alike): all the gateway admitted."""
    return live[left_out(live) == ""]


def live_outcomes(live: pd.DataFrame) -> pd.Series:
    """Each live request as the simulator's outcomes: ``ok``, ``rejected`` (never started: a queue timeout, no
    capacity, a refusal) or ``failed`` (started, then an error: in the stream, a 5xx, no answer)."""
    status = pd.to_numeric(live.status, errors="coerce").fillna(0).astype(int)
    ok = (status == 200) & (live.error.fillna("") == "")
    return pd.Series(np.where(ok, "ok", np.where((status >= 400) & (status < 500), "rejected", "failed")),
                     index=live.index)


def outcome_counts(sim: pd.DataFrame, live: pd.DataFrame) -> dict:
    """Both sides' ok / rejected / failed over the simulated requests, and what was left out and why."""
    why = left_out(live)
    ran = live[why == ""]
    count = lambda o: {k: int((o == k).sum()) for k in ("ok", "rejected", "failed")}  # noqa: E731
    return {"simulated": len(ran), "left_out": {k: int((why == k).sum()) for k in ("refused", "no answer")},
            "live": count(live_outcomes(ran)), "sim": count(sim.outcome if len(sim) else pd.Series([], dtype=str))}


def simulate_like(desc: dict, live: pd.DataFrame, topo, profile=None, perf=None, progress=None,
                  host_model: bool = False, host_cores: float | None = None,
                  host_share: str = "measured") -> pd.DataFrame:
    """The simulator's per-request frame (``ttft_ms``, ``tpot_ms``, ``e2e_ms``, ...) for the live requests.

    ``host_model``: model the live host (:mod:`sim.live.host_model`) from the ``host_share``, ``kv_copy`` and
    ``gw_*`` rows of ``profile`` (a table or a path); the frame then has every component as ``c_<name>``.
    ``host_cores``: the cores of the machine that served the requests (default: the deployment's
    ``host_cores``, else this machine's, for a gateway on loopback); saved runs simulated elsewhere need it.
    ``host_share``: how engines sharing the host slow each other, "measured" (the profile's ``host_share`` ratios)
    or "fitted" (its cores-and-lock fit alone; :class:`sim.live.host_params.HostParams`)."""
    dep, scale = mirror_deployment(on_replay_clock(desc, live), topo)
    draws = live.attrs.get("router_draws")
    if draws is not None:  # the live router had drawn for earlier requests (a probe, a profile, earlier replays)
        try:
            advance_draws(dep.plane.router, [int(n) for n in draws])
        except ValueError as exc:
            raise UserError(f"mirror: the live router's draws do not fit the mirror's router ({exc})") from None
    if perf is None:
        stand_ins = [desc["stand_ins"][m] for m in set(live.model)]
        perf = load_perf(profile, stand_ins, progress)
        if host_model:  # a table without the host's rows would make those parts free (0 ms)
            engines = sum(1 for p in desc["placement"] if p["model"] in set(live.model))
            require_host_rows(perf.table, profile if isinstance(profile, str | Path) else "the profile", engines)
    work = workload_from_live(live, scale)
    seam = None
    if host_model:
        table = getattr(perf, "table", None)  # a measured profile's rows (host_share, kv_copy, gw_*, iter_gap)
        params = HostParams(table if table is not None else pd.DataFrame(columns=["phase", "batch_size", "tokens",
                                                                                  "ms"]),
                            desc.get("lm_max_batch", 32), desc.get("lm_kv_budget_tokens", 32768),
                            max_cores=float(host_cores or desc.get("host_cores") or os.cpu_count() or 1),
                            share=host_share)
        client = work.arrival_s.to_numpy().copy()
        # The control plane sees a request once the gateway has read, validated and tokenized it.
        work["arrival_s"] = client + np.array([params.front_ms(int(n)) for n in work.prompt_tokens]) / 1e3
        session = SessionConfig(provider=desc.get("provider", "auto"), intra_op_threads=desc.get("threads", 0))
        kv = {m: kv_bytes_per_token(desc["stand_ins"][m], session) for m in set(work.model)}
        seam = LiveHost(params, work, client, kv)
    res = Simulation(dep, work, perf, sample_s=1.0, techniques=seam).run()
    return res.requests


def kv_bytes_per_token(stand_in: str, session: SessionConfig | None = None) -> float:
    """Bytes of KV cache one token takes in ``stand_in``'s engine (every layer's key and value, float32)."""
    spec = registry.load(stand_in, session).spec
    return 2.0 * spec.n_layer * spec.n_embd * 4


def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    """p50 and p95 of TTFT, TPOT and E2E over the rows that have them."""
    rows = []
    for m in METRICS:
        x = finite(pd.to_numeric(frame[m], errors="coerce"))
        rows.append({"metric": m, "n": len(x), "p50": percentile(x, 50, None), "p95": percentile(x, 95, None)})
    return pd.DataFrame(rows)


def block_draws(n: int, boot: int, rng: np.random.Generator, block: int | None = None) -> np.ndarray:
    """``boot`` resamples of positions ``0..n-1`` (shape ``[boot, n]``), drawn as circular blocks of ``block``
    consecutive positions (default: n^(1/3) rounded, 4 for 60 requests, the rule of thumb for a moving-block
    bootstrap; 1 is the plain bootstrap)."""
    block = max(1, int(round(n ** (1 / 3)))) if block is None else max(1, min(int(block), n))
    starts = rng.integers(0, n, (boot, -(-n // block)))
    idx = (starts[:, :, None] + np.arange(block)[None, None, :]) % n
    return idx.reshape(boot, -1)[:, :n]


def compare(sim: pd.DataFrame, live: pd.DataFrame, boot: int = 1000, seed: int = 0,
            block: int | None = None) -> pd.DataFrame:
    """One row per metric and percentile: simulated, live, relative difference (sim vs live), its 90% interval
    and the goal.

    Rows are matched by ``request_id`` and only requests that succeeded on both sides are compared, each metric
    over the requests that have it on both sides (a one-token output has no TPOT). The interval
    (``diff_lo_pct``, ``diff_hi_pct``) is a paired moving-block bootstrap over those requests in arrival order
    (``boot`` resamples, seeded; :func:`block_draws`): a cell of 60 requests pins a p50 of a spread-out TPOT
    only loosely; both sides are resampled together because they ran the same requests; and neighbours in time
    are resampled together because near saturation they are not independent (requests admitted in one prefill
    wait, stall and finish together). ``block``: requests per block (default: :func:`block_draws`'s).
    """
    ok_live = live[(live.status == 200) & (live.error.fillna("") == "")] if "status" in live else live
    ok_sim = sim[sim.outcome == "ok"] if "outcome" in sim else sim
    ids = np.intersect1d(ok_live.request_id.to_numpy(), ok_sim.request_id.to_numpy())
    a = ok_sim.set_index("request_id").loc[ids]
    b = ok_live.set_index("request_id").loc[ids]
    if "arrival_s" in b:  # arrival order, for the blocks
        order = np.argsort(pd.to_numeric(b.arrival_s, errors="coerce").to_numpy(dtype=float), kind="stable")
        a, b = a.iloc[order], b.iloc[order]
    rng = np.random.default_rng(seed)
    rows = []
    for m in METRICS:
        sa = pd.to_numeric(a[m], errors="coerce").to_numpy(dtype=float)
        sl = pd.to_numeric(b[m], errors="coerce").to_numpy(dtype=float)
        both = ~np.isnan(sa) & ~np.isnan(sl)  # the pairs: percentiles, n and the bootstrap all over them
        ps, pl = sa[both], sl[both]
        xs, xl = ps, pl
        draw = block_draws(len(ps), boot, rng, block) if len(ps) > 1 and boot else None
        for q in (50, 95):
            s_raw, v_raw = percentile(xs, q, None), percentile(xl, q, None)
            s, v = percentile(xs, q, 2), percentile(xl, q, 2)  # shown rounded; the difference is of the raw ones
            diff = round(100.0 * (s_raw - v_raw) / v_raw, 2) if s_raw is not None and v_raw else None
            lo = hi = None
            if draw is not None:
                with np.errstate(divide="ignore", invalid="ignore"):
                    d = 100.0 * (np.percentile(ps[draw], q, axis=1) / np.percentile(pl[draw], q, axis=1) - 1.0)
                d = d[np.isfinite(d)]
                if len(d):
                    lo, hi = (round(float(x), 2) for x in np.percentile(d, [5, 95]))
            goal = GOALS.get((m, f"p{q}"))
            rows.append({"metric": m, "percentile": f"p{q}", "n": int(len(ps)), "sim_ms": s,
                         "live_ms": v, "diff_pct": diff, "diff_lo_pct": lo, "diff_hi_pct": hi, "goal_pct": goal,
                         "met": bool(abs(diff) <= goal) if goal is not None and diff is not None else None})
    return pd.DataFrame(rows)


def live_repeat_table(out: str | Path) -> pd.DataFrame | None:
    """The live system against itself: a replay's second live run (``out/repeat``: the same requests sent again
    right after the first, by ``edgepop replay --repeat-live`` or the matrix benchmark) compared with its first
    exactly as the simulation is (``compare``: the second's difference from the first, with its 90% interval;
    columns ``again_ms`` and ``first_ms`` for compare's ``sim_ms`` and ``live_ms``; written to
    ``out/repeat/comparison.csv``). None without a second run."""
    out = Path(out)
    again = out / "repeat" / "live.parquet"
    if not again.exists():
        return None
    first, second = pd.read_parquet(out / "live.parquet"), pd.read_parquet(again)
    _same_requests(first, second, again)
    second = second[(second.status == 200) & (second.error.fillna("") == "")]
    # (compare's columns name its sides sim and live; here both are live: the second run and the first)
    table = compare(second, first).rename(columns={"sim_ms": "again_ms", "live_ms": "first_ms"})
    table.to_csv(out / "repeat" / "comparison.csv", index=False)
    return table


def _same_requests(first: pd.DataFrame, second: pd.DataFrame, path: Path) -> None:
    """A repeat is compared with its first run only: the same request ids with the same sizes."""
    cols = [c for c in ("request_id", "prompt_tokens", "max_tokens", "output_tokens") if c in first and c in second]
    a = first[cols].sort_values("request_id").reset_index(drop=True)
    b = second[cols].sort_values("request_id").reset_index(drop=True)
    if not a.equals(b):
        raise UserError(f"{path}: not a repeat of {path.parent.parent / 'live.parquet'} (other requests were sent): "
                        "replay the cell again")


def live_repeatability(out: str | Path) -> dict | None:
    """:func:`live_repeat_table` as figures: ``{"tpot_p50": {"err_pct", "err_90ci_pct", "met"}, ..., "met"}``."""
    table = live_repeat_table(out)
    if table is None:
        return None
    figures = {f"{r.metric.removesuffix('_ms')}_{r.percentile}": {
        "err_pct": r.diff_pct, "err_90ci_pct": [r.diff_lo_pct, r.diff_hi_pct], "met": r.met}
        for r in table.itertuples()}
    return {**figures, "met": bool(table.met.all())}
