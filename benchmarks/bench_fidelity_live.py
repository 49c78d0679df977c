"""Sim vs live replay matrix: does the simulator predict its own live system?

For a one-PoP (FRA) and a four-PoP (FRA, LHR, IAD, SIN) deployment of ``@cf/meta/llama-3.2-1b-instruct`` (stand-in
gpt2-tiny) served by a real ``edgepop serve --threads 1`` subprocess on 127.0.0.1 (WAN delays injected at scale
1): measure the live-host profile once (``sim.live.host_profile``), then for each trace (the shipped Azure
conversation trace, the shipped Mooncake-style trace, a bursty synthetic one) measure the deployment's capacity
for it (all requests at once) and replay it at two loads (``light``: 25% of that capacity, ``near-saturation``:
85%), each cell simulated with the live-host model and compared: TTFT, TPOT and E2E at p50 (goal: within 5%)
and p95 (goal: within 10%). Prompts are capped at 256 tokens and outputs at 32, as ``edgepop replay`` does.

Every row of the profiles is pooled over the deployment's cells, per row the median (``--host-rows cell`` and
``--engine-rows cell``: each cell's own host-sharing or engine rows), so the cells are simulated once the
deployment's last cell has been replayed. ``--host-share fitted``: engines sharing the host slow each other as the
profile's cores-and-lock fit says rather than as its ``host_share`` rows measured (``sim.live.host_model``), to
compare the two readings. ``--resimulate DIR`` simulates the saved cells of an earlier run again
with the current code (no live part); with ``--arrival-jitter-ms J`` it also simulates every cell five more times
with each request's arrival moved by up to J ms (uniform, seeded) and reports how far each figure moves from the
unperturbed simulation (``sim_jitter_pct``: the largest of the five): how sensitive the cell's batching is to
timing, as opposed to the machine's speed. ``--repeat-live`` replays every cell a second time right after the first
and reports the second live run against the first as the simulation is compared (``live_repeat`` in each cell): the
live system's own repeatability, the floor under the goal. ``machine_vs_profile_pct`` in each cell: how much slower
(+) the live engine decoded alone than the profile the simulation used says it does
(``sim.live.decompose.alone_vs_profile``): the machine changing after its profile. Every cell reports the host's
1-minute load average before and after it and the cores the gateway's engine threads and event loop kept busy:
figures from a loaded machine are not the quiet-machine figures the goal is about. The live-host profile is
re-measured before every cell (``--profile-every cell``; the other jobs on a shared machine change its speed within
minutes), and a probe of the host's speed (``sim.live.host_speed``: the stand-in's engine decoding one sequence in
this process, about a second, the gateway idle) is taken before and after every profile and replay: by default
(``--host-speed probe``) the profiles are brought to one speed before pooling and each cell's rows to the speed of
its replay (``host_speed_change_pct`` in each cell: the replay's probes against its own profile's);
``--host-speed none`` uses the profiles as measured (and is what cells saved without probes get). The profiles'
decode rows are measured over as many steps as a replayed request of the longest output decodes (31).
Bounded: ``--budget-s`` (default 2700 s) stops starting new cells; skipped cells are listed.

    python benchmarks/bench_fidelity_live.py [--requests 60] [--pops 1,4] [--traces azure,mooncake,bursty]
        [--loads light,near-saturation] [--out out/bench_fidelity_live] [--budget-s 2700] [--profile-every cell]
        [--host-rows pooled|cell] [--engine-rows pooled|cell] [--host-share measured|fitted]
        [--host-speed probe|none] [--repeat-live]
        [--resimulate DIR
        [--arrival-jitter-ms J]]

Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from dataplane import registry
from dataplane.gateway.server import spawn_serve
from dataplane.session import SessionConfig
from edgepop.argtypes import json_line, positive_float, positive_int
from edgepop.errors import UserError
from edgepop.outputs import folder_arg, output_folder
from edgepop.rng import seed_arg
from sim.live import decompose
from sim.live.client import fetch_deployment
from sim.live.fidelity import admitted, compare, live_repeatability, mirror_topology, simulate_like
from sim.live.host_params import SHARE_READINGS
from sim.live.host_profile import measure_host_profile, pop_locations
from sim.live.host_speed import HostSpeedProbe, at_speed, common_speed, replay_speed, speed_change_pct
from sim.live.matrix import LOADS, bursty_trace, capacity_rps, replay_cell, simulate_cell, trace_rate
from sim.live.pooling import pooled_engine_rows, pooled_host_rows, with_engine_rows, with_host_rows
from sim.live.replay import ReplayOptions

MODEL = "@cf/meta/llama-3.2-1b-instruct"
DEPLOYMENTS = {"1": ["FRA"], "4": ["FRA", "LHR", "IAD", "SIN"]}
TRACES = ("azure", "mooncake", "bursty")
ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=positive_int, default=60, help="requests per cell (default 60)")
    ap.add_argument("--pops", default="1,4")
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--loads", default=",".join(LOADS))
    ap.add_argument("--out", type=folder_arg, default="out/bench_fidelity_live")
    ap.add_argument("--budget-s", type=positive_float, default=2700.0,
                    help="start no new cell after this many seconds")
    ap.add_argument("--seed", type=seed_arg, default=0)
    ap.add_argument("--profile-every", choices=("cell", "deployment"), default="cell",
                    help="re-measure the live-host profile before every cell (default: the machine's other load "
                         "drifts within minutes) or once per deployment")
    ap.add_argument("--engine-profile", choices=("served", "alone"), default="served",
                    help="engine service times read inside the live gateway (default) or of an engine in this "
                         "process")
    ap.add_argument("--host-rows", choices=("pooled", "cell"), default="pooled",
                    help="host-sharing rows pooled over the deployment's profiles (default) or each cell's own")
    ap.add_argument("--engine-rows", choices=("pooled", "cell"), default="pooled",
                    help="engine and gateway rows pooled over the deployment's profiles, per row the median "
                         "(default), or each cell's own")
    ap.add_argument("--host-share", choices=SHARE_READINGS, default="measured",
                    help="how engines sharing the host slow each other: the profile's measured host_share ratios "
                         "(default) or its cores-and-lock fit alone")
    ap.add_argument("--host-speed", choices=("probe", "none"), default="probe",
                    help="rescale the profiles to the host's speed during each replay, by a probe taken beside "
                         "every profile and replay (default), or use them as measured")
    ap.add_argument("--repeat-live", action="store_true",
                    help="replay every cell twice and report the second live run against the first (the live "
                         "system's own repeatability)")
    ap.add_argument("--resimulate", metavar="DIR", help="simulate the saved cells of an earlier run again")
    ap.add_argument("--arrival-jitter-ms", type=float, default=0.0,
                    help="with --resimulate: also simulate each cell with arrivals moved by up to this many ms "
                         "(five draws) and report how far each figure moves")
    args = ap.parse_args()
    for flag, given, known in (("--pops", args.pops, DEPLOYMENTS), ("--traces", args.traces, TRACES),
                               ("--loads", args.loads, LOADS)):
        bad = [x for x in given.split(",") if x not in known]
        if bad:  # before any server starts
            ap.error(f"{flag}: unknown {', '.join(map(repr, bad))} (known: {', '.join(known)})")
    if not (math.isfinite(args.arrival_jitter_ms) and args.arrival_jitter_ms >= 0):
        ap.error(f"--arrival-jitter-ms must be a non-negative number, got {args.arrival_jitter_ms}")
    if args.arrival_jitter_ms > 0 and not args.resimulate:
        ap.error("--arrival-jitter-ms moves the arrivals of saved cells: it needs --resimulate DIR")
    if args.resimulate:
        return resimulate(Path(args.resimulate), args)
    try:  # before any server starts
        out = output_folder(args.out)
    except UserError as exc:
        ap.error(str(exc))
    out.mkdir(parents=True, exist_ok=True)
    traces = {"azure": str(ROOT / "sim/data/azure_llm_conv_2023.csv"),
              "mooncake": str(ROOT / "sim/data/mooncake_style_synthetic.jsonl"),
              "bursty": str(bursty_trace(out / "bursty.jsonl", n=max(200, args.requests), seed=args.seed))}
    t_start = time.monotonic()
    cells, skipped = [], []
    for n_pops in args.pops.split(","):
        run_deployment(n_pops, args, traces, out, t_start, cells, skipped)
    result = {"benchmark": "fidelity_live", "model": MODEL, "stand_in": "gpt2-tiny", "threads": 1,
              "cores": os.cpu_count(), "requests_per_cell": args.requests, "cells": cells, "skipped": skipped,
              "profile_every": args.profile_every, "engine_profile": args.engine_profile,
              "host_rows": args.host_rows, "engine_rows": args.engine_rows, "host_share": args.host_share,
              "host_speed": args.host_speed, "cells_met": sum(c["met"] for c in cells), "cells_run": len(cells),
              "wall_s": round(time.monotonic() - t_start, 1)}
    if args.repeat_live:
        result["repeats_met"] = sum(c["live_repeat"]["met"] for c in cells if "live_repeat" in c)
    for c in cells:
        print(summary_line(c))
    print(json_line(result))
    return 0


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_deployment(n_pops: str, args, traces: dict, out: Path, t_start: float, cells: list, skipped: list) -> None:
    """Serve one deployment, measure its profile and run its cells (appended to ``cells``)."""
    pops = DEPLOYMENTS[n_pops]
    tmp = out / f"pops{n_pops}"
    tmp.mkdir(exist_ok=True)
    # No rate limits and no load shedding: the mirror models the control plane, not the gateway's overload guards.
    proc, url = spawn_serve(["--no-auth", "--no-rate-limit", "--max-wait", "0", "--threads", "1",
                             "--pops", ",".join(pops), "--models", MODEL, "--db", str(tmp / "batch.sqlite")],
                            log=tmp / "serve.log")
    probe = None
    try:
        desc = fetch_deployment(url)
        topo = mirror_topology(desc)
        stand_in = desc["stand_ins"][MODEL]
        session = SessionConfig(intra_op_threads=1)
        n_ctx = registry.load(stand_in, session).spec.n_ctx

        probe = HostSpeedProbe(stand_in, session, seed=args.seed)  # the host's speed beside each profile and replay

        def measure(tag: str):
            t0 = time.monotonic()
            before = probe.probe()
            table = measure_host_profile(url, MODEL, stand_in, session, pop_locations(desc, topo, MODEL),
                                         seed=args.seed, progress=log, n_ctx=n_ctx, engine=args.engine_profile,
                                         decode_steps=ReplayOptions.max_output - 1)
            table.to_csv(tmp / f"profile-{tag}.csv", index=False)
            return table, round(time.monotonic() - t0, 1), [before, probe.probe()]

        profile, profile_s, at_profile = (measure("deployment") if args.profile_every == "deployment"
                                          else (None, 0.0, None))
        replayed = []
        for name in args.traces.split(","):
            base = ReplayOptions(url=url, trace=traces[name], requests=args.requests, model=MODEL, seed=args.seed)
            if time.monotonic() - t_start > args.budget_s:
                skipped += [f"{n_pops} PoP / {name} / {load}" for load in args.loads.split(",")]
                continue
            cap = capacity_rps(base, topo, args.requests)
            rate = trace_rate(traces[name], base)
            log(f"{n_pops} PoP(s), {name}: capacity {cap:.2f} req/s, trace rate {rate:.3f} req/s")
            for load in args.loads.split(","):
                if time.monotonic() - t_start > args.budget_s:
                    skipped.append(f"{n_pops} PoP / {name} / {load}")
                    continue
                if args.profile_every == "cell":
                    profile, profile_s, at_profile = measure(f"{name}-{load}")
                opts = replace(base, time_scale=LOADS[load] * cap / rate)
                before = at_profile[1] if args.profile_every == "cell" else probe.probe()
                replay_cell(opts, desc, topo, tmp / f"{name}-{load}", log)
                probes = {"profile": at_profile, "replay": [before, probe.probe()]}
                if args.repeat_live:  # the same requests again, at once: the live side's own scatter
                    replay_cell(opts, desc, topo, tmp / f"{name}-{load}" / "repeat", log)
                meta = dict(pops=n_pops, trace=name, load=load, rho=LOADS[load], capacity_rps=round(cap, 3),
                            profile_s=profile_s, host_probe_ms=probes)
                (tmp / f"{name}-{load}" / "cell.json").write_text(json.dumps(meta))
                replayed.append((tmp / f"{name}-{load}", profile, meta))
    finally:
        if probe is not None:
            probe.close()
        proc.terminate()
        proc.wait(timeout=60)
    simulate_cells(replayed, topo, args.host_rows, cells, args.engine_rows, host_share=args.host_share,
                   host_speed=args.host_speed)


def simulate_cells(replayed: list, topo, host_rows: str, cells: list, engine_rows: str = "pooled",
                   jitter_ms: float = 0.0, host_share: str = "measured", host_speed: str = "probe") -> None:
    """Simulate replayed cells ``(folder, profile, meta)`` of one deployment, the host-sharing and the engine
    rows each pooled over their profiles unless ``host_rows`` / ``engine_rows`` is "cell" (appended to
    ``cells``); with ``jitter_ms``, each cell's sensitivity to its arrival times too. ``host_speed`` "probe":
    every profile is brought to one speed before pooling, and each cell's rows to its replay's speed, by the
    probes saved beside them (``sim.live.host_speed``; cells saved without probes: as measured)."""
    speed = "probe" if host_speed == "probe" and replayed and all(m.get("host_probe_ms") for *_, m in replayed) \
        else "none" if host_speed == "none" else "none (no probes saved)"
    if speed == "probe":
        matched, ref = common_speed([p for _, p, _ in replayed], [m["host_probe_ms"] for *_, m in replayed])
        replayed = [(f, p, m) for (f, _, m), p in zip(replayed, matched, strict=True)]
    profiles = [p for _, p, _ in replayed]
    pooled = pooled_host_rows(profiles) if host_rows == "pooled" and replayed else None
    engines = pooled_engine_rows(profiles) if engine_rows == "pooled" and replayed else None
    for folder, profile, meta in replayed:
        rows = with_engine_rows(with_host_rows(profile, pooled), engines)
        if speed == "probe":
            rows = at_speed(rows, ref, replay_speed(meta["host_probe_ms"]))
        cell = simulate_cell(folder, topo, rows, host_share)
        cell.update(meta, host_rows=host_rows, engine_rows=engine_rows, host_share=host_share, host_speed=speed)
        if meta.get("host_probe_ms"):  # the host's speed during the replay against during its own profile
            cell["host_speed_change_pct"] = speed_change_pct(meta["host_probe_ms"])
        timelines = read_timelines(folder)
        # the machine during the live run against the profile the simulation used (one PoP: with several, an
        # engine decoding alone also shares the host with the others, which is the host model's to predict)
        if timelines is not None and str(meta.get("pops")) == "1":
            cell["machine_vs_profile_pct"] = decompose.alone_vs_profile(timelines, rows)
        repeat = live_repeatability(folder)
        if repeat is not None:
            # the machine's speed in each run: the engine's decode step for requests that decoded alone
            steps = [decompose.alone_step_ms(t) if t is not None else None
                     for t in (timelines, read_timelines(folder / "repeat"))]
            cell["live_repeat"] = dict(repeat, alone_step_ms=steps)
        if jitter_ms > 0:
            cell["sim_jitter_pct"] = arrival_sensitivity(folder, topo, rows, jitter_ms, host_share=host_share)
        cells.append(cell)
        log(summary_line(cell))


def read_timelines(folder: Path) -> list[dict] | None:
    """The gateway's timelines of a saved live run (None where the run kept none)."""
    path = folder / "timelines.json"
    return json.loads(path.read_text()) if path.exists() else None


def arrival_sensitivity(folder: Path, topo, profile: pd.DataFrame, jitter_ms: float, draws: int = 5,
                        host_share: str = "measured") -> dict:
    """How far a saved cell's simulated figures move when every request's arrival moves by up to ``jitter_ms``
    (uniform, seeded): per figure, the largest absolute difference (%) from the unperturbed simulation (the
    cell's ``sim.parquet``, just written by ``simulate_cell`` with the same rows) over ``draws`` draws."""
    desc = json.loads((folder / "deployment.json").read_text())
    cores = json.loads((folder / "host.json").read_text()).get("cores")
    live = admitted(pd.read_parquet(folder / "live.parquet"))  # what simulate_cell simulated; its result beside
    base = pd.read_parquet(folder / "sim.parquet")
    rng = np.random.default_rng(0)
    worst: dict[str, float] = {}
    for _ in range(draws):
        moved = live.assign(arrival_s=live.arrival_s.to_numpy() + rng.uniform(-jitter_ms, jitter_ms, len(live)) / 1e3)
        table = compare(simulate_like(desc, moved, topo, profile, host_model=True, host_cores=cores,
                                      host_share=host_share), base, boot=0)
        for r in table.itertuples():
            key = f"{r.metric.removesuffix('_ms')}_{r.percentile}"
            worst[key] = round(max(worst.get(key, 0.0), abs(r.diff_pct)), 2)
    return worst


def resimulate(root: Path, args) -> int:
    """``--resimulate``: the simulation half of every saved cell under ``root`` again, with the current code."""
    cells = []
    pops, traces, loads_asked = (set(args.pops.split(",")), set(args.traces.split(",")), set(args.loads.split(",")))
    for tmp in sorted(root.glob("pops*")):
        if tmp.name.removeprefix("pops") not in pops:
            continue  # (--pops, --traces and --loads pick saved cells as they pick cells to run)
        replayed = []
        for folder in sorted(p.parent for p in tmp.glob("*/live.parquet")):
            own = tmp / f"profile-{folder.name}.csv"
            profile_file = own if own.exists() else tmp / "profile-deployment.csv"
            meta_file = folder / "cell.json"
            if meta_file.exists():
                meta = json.loads(meta_file.read_text())
            else:  # an older save: the cell's name says TRACE-LOAD
                trace, _, load = folder.name.partition("-")
                if load not in LOADS:
                    print(f"bench_fidelity_live: error: {folder}: no cell.json and the folder is not named TRACE-LOAD "
                          f"(LOAD one of {', '.join(LOADS)})", file=sys.stderr)
                    return 2
                meta = dict(pops=tmp.name.removeprefix("pops"), trace=trace, load=load, rho=LOADS.get(load))
            if meta.get("trace") not in traces or meta.get("load") not in loads_asked:
                continue
            if not profile_file.exists():
                print(f"bench_fidelity_live: error: {folder}: no profile ({own.name} or profile-deployment.csv "
                      "beside it)", file=sys.stderr)
                return 2
            replayed.append((folder, pd.read_csv(profile_file), meta))
        if replayed:
            desc = json.loads((replayed[0][0] / "deployment.json").read_text())
            topo = mirror_topology(desc)
            order = {t: i for i, t in enumerate(args.traces.split(","))}
            loads = list(LOADS)
            replayed.sort(key=lambda r: (order.get(r[2].get("trace"), 99),
                                         loads.index(r[2]["load"]) if r[2].get("load") in loads else len(loads)))
            simulate_cells(replayed, topo, args.host_rows, cells, args.engine_rows, args.arrival_jitter_ms,
                           args.host_share, args.host_speed)
    if not cells:
        print(f"bench_fidelity_live: error: no saved cells under {root} matching --pops, --traces and --loads "
              "(expected pops*/CELL/live.parquet)",
              file=sys.stderr)
        return 2
    result = {"benchmark": "fidelity_live", "resimulated": str(root), "host_rows": args.host_rows,
              "engine_rows": args.engine_rows, "host_share": args.host_share,
              "host_speed": args.host_speed, "arrival_jitter_ms": args.arrival_jitter_ms, "cells": cells,
              "cells_met": sum(c["met"] for c in cells), "cells_run": len(cells)}
    for c in cells:
        print(summary_line(c))
    print(json_line(result))
    return 0


def summary_line(c: dict) -> str:
    errs = " ".join(f"{k} {c[k]['err_pct']:+.1f}%" for k in ("ttft_p50", "ttft_p95", "tpot_p50", "tpot_p95",
                                                             "e2e_p50", "e2e_p95") if c[k]["err_pct"] is not None)
    line = (f"{c['pops']} PoP {c['trace']:8s} {c['load']:15s} {c['offered_rps']} req/s  {errs}  "
            f"load {c['loadavg_1m_before']}->{c['loadavg_1m_after']}  {'met' if c['met'] else 'missed'}")
    if c.get("machine_vs_profile_pct") is not None:
        line += f"  machine vs profile {c['machine_vs_profile_pct']:+.1f}%"
    if c.get("host_speed_change_pct") is not None:
        line += f"  host probe vs profile's {c['host_speed_change_pct']:+.1f}%"
    moved = c.get("sim_jitter_pct")
    if moved:
        line += "\n    sim with arrivals jittered, largest move: " + " ".join(f"{k} {v:.1f}%" for k, v in moved.items())
    rep = c.get("live_repeat")
    if rep:
        line += "\n    live again vs live: " + " ".join(
            f"{k} {rep[k]['err_pct']:+.1f}%" for k in ("ttft_p50", "ttft_p95", "tpot_p50", "tpot_p95", "e2e_p50",
                                                      "e2e_p95") if rep.get(k, {}).get("err_pct") is not None)
    return line


if __name__ == "__main__":
    sys.exit(main())
