"""The sim-vs-live replay matrix: traces x load levels on one live deployment, each cell compared percentile by
percentile (``benchmarks/bench_fidelity_live.py`` runs it on a one-PoP and a four-PoP deployment).

* **Traces**: the shipped Azure conversation trace, the shipped Mooncake-style trace, and a bursty synthetic
  one (:func:`bursty_trace`: on/off bursts, seeded). Sizes are capped as ``edgepop replay`` caps them.
* **Load levels** are fractions of the live deployment's own capacity for that trace, measured, not assumed
  (:func:`capacity_rps`: all requests at once; completions per second over the makespan). A cell at load
  ``rho`` replays the trace with its inter-arrival times scaled to a mean rate of ``rho`` times that capacity.
* **Repeatability**: a cell may be replayed twice back to back (:func:`sim.live.fidelity.live_repeatability`):
  the second live run against the first, with the same comparison, is the floor under the simulation's errors.
* Every cell measures its live side first (:func:`replay_cell`) and then simulates the same requests with the
  live-host model and the deployment's live-host profiles (:func:`simulate_cell`), pooled over the deployment's
  cells, per row the median (:mod:`sim.live.pooling`): the host-sharing rows (the slowdown of k engines decoding
  at once, and what the event loop and the client used meanwhile) and the engine and gateway rows. One profile's
  rows scatter by 10-40% even on a quiet machine; the benchmark can keep each cell's own rows instead (for a
  machine whose speed drifts between cells). A saved cell is simulated with the cores of the host that served it
  (``host.json``), not those of the machine that simulates it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from sim.live.decompose import live_frame, sim_components
from sim.live.fidelity import admitted, compare, outcome_counts, simulate_like
from sim.live.replay import ReplayOptions, build_requests, send_all
from sim.live.replay_plots import plot_replay
from sim.live.run import clear_outputs, live_replay
from sim.traces import read_trace

LOADS = {"light": 0.25, "near-saturation": 0.85}


def bursty_trace(path: str | Path, n: int = 200, seed: int = 0, burst_rps: float = 6.0, burst_s: float = 3.0,
                 idle_s: float = 6.0) -> Path:
    """Write a bursty synthetic trace (Mooncake JSONL): Poisson bursts at ``burst_rps`` lasting ~``burst_s``
    (exponential), separated by idle gaps of ~``idle_s`` (exponential); prompt lengths log-normal (median 96
    tokens), outputs uniform in [8, 64]. Seeded: the same file for the same arguments. Arrivals are in time order:
    a burst starts no earlier than the previous burst's last arrival."""
    rng = np.random.default_rng(seed)
    t, times = 0.0, []
    while len(times) < n:
        end = t + rng.exponential(burst_s)
        while t < end and len(times) < n:
            t += rng.exponential(1.0 / burst_rps)
            times.append(t)
        # a burst's last arrival may come after its drawn end; the next burst never starts before it (its draws
        # are unchanged; a trace whose arrivals were in order is the same file as before)
        t = max(t, end + rng.exponential(idle_s))
    prompts = np.clip(np.round(rng.lognormal(np.log(96), 0.8, n)), 4, 4096).astype(int)
    outputs = rng.integers(8, 65, n)
    path = Path(path)
    with open(path, "w") as fh:
        for ts, p, o in zip(times, prompts, outputs, strict=True):
            fh.write(json.dumps({"timestamp": int(round(ts * 1e3)), "input_length": int(p), "output_length": int(o),
                                 "hash_ids": []}) + "\n")
    return path


def trace_rate(trace: str, opts: ReplayOptions) -> float:
    """Mean request rate (req/s) of the first ``opts.requests`` rows of ``trace`` at time scale 1."""
    t = read_trace(trace)[0].arrival_s.to_numpy()[: opts.requests]
    span = float(t.max() - t.min())
    return (len(t) - 1) / span if span > 0 else float("inf")


def capacity_rps(opts: ReplayOptions, topo, n: int) -> float:
    """The live deployment's completion rate for ``n`` requests of the trace sent all at once (req/s)."""
    probe = replace(opts, requests=n, time_scale=1e9)
    frame = build_requests(read_trace(opts.trace)[0], topo, probe, np.random.default_rng(opts.seed + 1))
    live = asyncio.run(send_all(frame, probe, np.random.default_rng(opts.seed + 2),
                                f"capacity-{uuid.uuid4().hex[:8]}:"))
    # from the first send (the client waits a moment and sets up before it sends anything), to the last answer
    makespan = float(np.nanmax(live.c_end.to_numpy()) - np.nanmin(live.c_send.to_numpy()))
    return int(((live.status == 200) & (live.error == "")).sum()) / makespan


def replay_cell(opts: ReplayOptions, desc: dict, topo, out: Path, progress=print) -> None:
    """The live half of a cell: replay ``opts`` against the deployment and save what the simulation needs (an
    earlier run's files in ``out`` are removed first, its ``repeat/`` too: they belong to other requests)."""
    shutil.rmtree(out / "repeat", ignore_errors=True)
    clear_outputs(out)
    for name in ("timelines.json", "deployment.json", "cell.json"):
        (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(opts.seed)
    live, timelines, host = live_replay(opts, desc, topo, rng, progress, keep=out / "live.parquet")
    (out / "timelines.json").write_text(json.dumps(timelines))
    (out / "deployment.json").write_text(json.dumps(desc))
    live.to_parquet(out / "live.parquet", index=False)
    (out / "host.json").write_text(json.dumps(dict(host, time_scale=opts.time_scale), indent=1))


def simulate_cell(out: Path, topo, profile: pd.DataFrame, host_share: str = "measured") -> dict:
    """The simulated half of a saved cell (``out``): simulate its requests with the live-host model and
    ``profile`` (``host_share``: as :func:`sim.live.fidelity.simulate_like`), compare, write the comparison files.
    Returns the cell's figures."""
    desc = json.loads((out / "deployment.json").read_text())
    timelines = json.loads((out / "timelines.json").read_text())
    host = json.loads((out / "host.json").read_text())
    live = pd.read_parquet(out / "live.parquet")
    sim = simulate_like(desc, admitted(live), topo, profile, host_model=True, host_cores=host.get("cores"),
                        host_share=host_share)
    table = compare(sim, live)
    parts_live, parts_sim = live_frame(live, timelines), sim_components(sim)
    pd.concat([parts_live.assign(side="live"), parts_sim.assign(side="sim")],
              ignore_index=True).to_csv(out / "decomposition.csv", index=False)
    plot_replay(sim, live, parts_sim, parts_live, out / "replay.png")
    sim.to_parquet(out / "sim.parquet", index=False)
    table.to_csv(out / "comparison.csv", index=False)
    ok = live[(live.status == 200) & (live.error == "")]
    span = float(ok.arrival_s.max() - ok.arrival_s.min()) if len(ok) > 1 else 0.0
    cell = {"requests": len(live), "ok": len(ok), "offered_rps": round((len(ok) - 1) / span, 3) if span else None,
            "time_scale": host.get("time_scale"), "loadavg_1m_before": round(host["loadavg_before"][0], 2),
            "loadavg_1m_after": round(host["loadavg_after"][0], 2),
            "engine_cores_busy": host["cores_busy"].get("engine"),
            "event_loop_cores_busy": host["cores_busy"].get("event-loop"), "outcomes": outcome_counts(sim, live)}
    for r in table.itertuples():
        key = f"{r.metric.removesuffix('_ms')}_{r.percentile}"
        cell[key] = {"sim_ms": r.sim_ms, "live_ms": r.live_ms, "err_pct": r.diff_pct,
                     "err_90ci_pct": [r.diff_lo_pct, r.diff_hi_pct], "met": r.met}
    cell["met"] = bool(table.met.all())
    return cell
