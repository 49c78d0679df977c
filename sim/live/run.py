"""One ``edgepop replay`` run: measure the profile, replay the trace live, simulate the same requests, compare
percentiles and decompositions, write everything and return the report.

Outputs in ``out``: ``profile.csv`` (unless ``--profile``), ``live.parquet`` (client side), ``sim.parquet``,
``comparison.csv`` (p50/p95 of TTFT, TPOT, E2E, over requests ok on both sides), ``outcomes.json`` (each side's
ok / rejected / failed over the simulated requests, and those left out), ``decomposition.csv`` (every request's
components, live and simulated, :mod:`sim.live.decompose`) and ``host.json`` (the host during the run: CPU
seconds of the gateway's engine threads, its event loop and the replay client, wall time, cores, load average).
With ``repeat_live``, ``repeat/`` holds a second live run of the same requests and its comparison with the first.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from controlplane.catalog import default_catalog
from controlplane.perf_profile import MeasuredProfile
from dataplane import registry
from dataplane.gateway.server import require_loopback
from dataplane.session import SessionConfig
from edgepop.errors import UserError
from sim.live.client import fetch_deployment, fetch_timings, gateway_message
from sim.live.decompose import (
    alone_step_ms,
    alone_vs_profile,
    live_frame,
    one_request,
    side_by_side,
    sim_components,
)
from sim.live.fidelity import (
    admitted,
    compare,
    left_out,
    live_repeat_table,
    measure_profile,
    mirror_topology,
    outcome_counts,
    simulate_like,
    summarize,
)
from sim.live.host_params import require_host_rows
from sim.live.host_profile import measure_host_profile, pop_locations
from sim.live.live_profile import gateway_profile
from sim.live.pooling import pooled_profile
from sim.live.replay import ReplayOptions, build_requests, send_all
from sim.live.replay_plots import plot_replay
from sim.traces import read_trace

PROFILE_SOURCES = ("host", "gateway", "engine")


def cpu_by_role(host: dict) -> dict[str, float]:
    """CPU seconds of the gateway's threads by role (``engine``, ``event-loop``, ``other``)."""
    out: dict[str, float] = {}
    for t in host["threads"]:
        out[t["role"]] = out.get(t["role"], 0.0) + t["cpu_s"]
    return out


def host_usage(before: dict, after: dict, wall_s: float, client_cpu_s: float) -> dict:
    """What the run used of the host: CPU seconds per role over ``wall_s``, as cores busy on average."""
    a, b = cpu_by_role(before), cpu_by_role(after)
    cpu = {k: round(b.get(k, 0.0) - a.get(k, 0.0), 3) for k in sorted(set(a) | set(b))}
    cpu["replay-client"] = round(client_cpu_s, 3)
    return {"wall_s": round(wall_s, 3), "cpu_s": cpu, "cores_busy": {k: round(v / wall_s, 3) for k, v in cpu.items()}
            if wall_s > 0 else {}, "cores": after.get("cores"), "loadavg_before": before.get("loadavg"),
            "loadavg_after": after.get("loadavg")}


def live_replay(opts: ReplayOptions, desc: dict, topo, rng: np.random.Generator, progress=print,
                trace_rows: pd.DataFrame | None = None, keep: Path | None = None
                ) -> tuple[pd.DataFrame, list[dict], dict]:
    """Send the trace (``trace_rows``: ``opts.trace`` already read); returns the client-side frame (with each request's
    ``first_piece``), the gateway's timelines of its requests and the host's use during the run. ``keep``: where
    to write the client-side frame if the gateway does not answer after the run."""
    frame = build_requests(read_trace(opts.trace)[0] if trace_rows is None else trace_rows, topo, opts, rng)
    trace = f"replay-{uuid.uuid4().hex[:12]}:"
    progress(f"replaying {len(frame)} requests over {frame.arrival_s.max():.1f} s against {opts.url}")
    first = fetch_timings(opts.url, trace, opts.token)
    before = first["host"]
    t0, c0 = time.monotonic(), time.process_time()
    started = datetime.now(UTC).isoformat()  # the simulation's time 0 (a scheduled autoscaler's clock)
    live = asyncio.run(send_all(frame, opts, rng, trace))
    live.attrs["started_utc"] = started
    if "router_draws" in first:  # where the live router was: the mirror's starts there (probe, profile, ...)
        live.attrs["router_draws"] = list(first["router_draws"])
    wall, client_cpu = time.monotonic() - t0, time.process_time() - c0
    try:
        got = fetch_timings(opts.url, trace, opts.token)
    except UserError as exc:  # the gateway went away: keep what the client measured
        if keep is None:
            raise
        keep.parent.mkdir(parents=True, exist_ok=True)
        live.to_parquet(keep, index=False)
        raise UserError(f"replay: after the live run, {exc}; kept the client side of the {len(live)} requests in "
                        f"{keep} (no gateway timelines, no simulation)") from None
    timelines = got["requests"]
    by_trace = {t["trace"]: t for t in timelines}
    live["first_piece"] = [((by_trace.get(tr) or {}).get("engine") or {}).get("first_piece") or 1
                           for tr in live.trace]
    return live, timelines, host_usage(before, got["host"], wall, client_cpu)


OUTPUTS = ("profile.csv", "live.parquet", "host.json", "sim.parquet", "comparison.csv", "decomposition.csv",
           "outcomes.json", "replay.png", "repeat/live.parquet", "repeat/host.json", "repeat/comparison.csv")


def clear_outputs(out: Path, keep=None) -> None:
    """Remove a previous replay's outputs from ``out`` (only the files a replay writes), so that a run that stops
    early, or leaves the simulation out, is never read together with another run's files. ``keep``: the
    ``--profile`` this run reads (often the previous run's ``profile.csv``), never removed."""
    kept = Path(keep).resolve() if isinstance(keep, str | Path) else None
    for name in OUTPUTS:
        path = out / name
        if path.parent.is_dir() and path.resolve() != kept:  # (``repeat`` may be absent, or a file of the user's)
            path.unlink(missing_ok=True)


def _status(value, error: str = "") -> str:
    """An HTTP status from the live frame (0 or NaN: the request got no answer, ``error`` says why)."""
    if value is None or value != value or int(value) == 0:
        return f"no answer ({error})" if error else "no answer"
    return f"HTTP {int(value)}" + (f": {error}" if error else "")


def left_out_note(live: pd.DataFrame) -> str:
    """The requests the simulation leaves out, and why ('' when none): refused before admission, no answer."""
    why = left_out(live)
    parts = []
    refused = live[why == "refused"]
    if len(refused):
        parts.append(f"{len(refused)} the gateway refused before admitting them "
                     f"({', '.join(sorted({_status(v) for v in refused.status}))})")
    lost = live[why == "no answer"]
    if len(lost):
        errors = sorted({str(e).split(":")[0] or "?" for e in lost.error.fillna("")})
        parts.append(f"{len(lost)} with no answer ({', '.join(errors)})")
    return f"left out of the simulation: {'; '.join(parts)}" if parts else ""


def outcomes_line(counts: dict) -> str:
    """One line of both sides' outcomes over the simulated requests."""
    side = lambda c: ", ".join(f"{c[k]} {k}" for k in ("ok", "rejected", "failed"))  # noqa: E731
    return (f"outcomes of the {counts['simulated']} simulated requests: live {side(counts['live'])}; sim "
            f"{side(counts['sim'])} (latencies above: requests ok on both sides)")


def probe_request(opts: ReplayOptions) -> None:
    """One one-token request as the replay will send them: a wrong token, account or rate limit fails here, in
    one line, before minutes of profiling and replaying."""
    import httpx

    try:
        r = httpx.post(opts.run_url(), json={"prompt": "probe", "max_tokens": 1}, headers=opts.auth(), timeout=60)
    except httpx.HTTPError as exc:
        raise UserError(f"replay: {opts.url} not reachable ({exc})") from None
    if r.status_code != 200:
        detail = gateway_message(r.content)
        raise UserError(f"replay: a first request as the replay sends them got HTTP {r.status_code} ({detail}); "
                        "check --token, --account and the gateway's rate limits")


# What the replay reads of GET /edgepop/deployment (dataplane.gateway.backend describes it), by type
_DESCRIPTION = {"pops": list, "router": str, "placement": list, "last_mile_ms": (int, float), "stand_ins": dict,
                "seed": int, "delay": bool, "delay_scale": (int, float), "queue_limit": int,
                "queue_timeout_s": (int, float)}
_REPLICA = {"model": str, "node": int, "pop": str, "slots": int, "replica": int}


def description_gaps(desc) -> str:
    """What a gateway description lacks that the replay reads ('' when nothing): the first missing or mistyped
    field, named."""
    if not isinstance(desc, dict):
        return "not a JSON object"
    for key, kind in _DESCRIPTION.items():
        if not isinstance(desc.get(key), kind):
            return f"field {key!r} missing or not a {getattr(kind, '__name__', 'number')}"
    for i, rep in enumerate(desc["placement"]):
        bad = [k for k, kind in _REPLICA.items() if not isinstance(rep, dict) or not isinstance(rep.get(k), kind)]
        if bad:
            return f"placement[{i}] lacks {bad[0]!r}"
    return ""


def replay_and_compare(opts: ReplayOptions, progress=print, host_model: bool = True) -> str:
    """Run the live replay, then (unless ``simulate`` is off) the simulator, write outputs, return the report."""
    require_loopback(opts.url)
    opts.check()
    trace_rows = read_trace(opts.trace)[0]  # a missing or malformed trace fails now, not after the profile's minutes
    desc = fetch_deployment(opts.url, opts.token)
    missing = description_gaps(desc)
    if missing:
        raise UserError(f"replay: {opts.url}/edgepop/deployment is not an edgepop gateway's description "
                        f"({missing})")
    if opts.model not in {p["model"] for p in desc["placement"]}:
        raise UserError(f"replay: model {opts.model!r} is not served by {opts.url}")
    catalog = default_catalog()
    if opts.model in catalog and catalog[opts.model].task != "text-generation":
        raise UserError(f"replay: model {opts.model!r} is a {catalog[opts.model].task} model; a replay streams "
                        "generated text (choose a text-generation model)")
    stand_in = desc["stand_ins"].get(opts.model, opts.model)
    n_ctx = served_n_ctx(desc, stand_in)
    if opts.max_prompt > n_ctx:  # every longer prompt would be refused (4xx) after minutes of profiling
        raise UserError(f"replay: --max-prompt {opts.max_prompt} is over the served context of {opts.model} "
                        f"({stand_in}: {n_ctx} tokens); a prompt and its output must fit it together: with "
                        f"--max-output {opts.max_output}, pass --max-prompt {max(1, n_ctx - opts.max_output)} or less")
    probe_request(opts)
    if opts.profile_source not in PROFILE_SOURCES:
        raise UserError(f"replay: profile source must be one of {', '.join(PROFILE_SOURCES)}, "
                        f"got {opts.profile_source!r}")
    if opts.profile and not opts.simulate:
        raise UserError("replay: --profile is for the simulation, which --no-sim leaves out")
    if opts.profile:  # a missing or malformed table, or one without the served stand-in, fails now, not after
        table = opts.profile  # the live run
        given = (MeasuredProfile(table, source="the profile given") if isinstance(table, pd.DataFrame)
                 else MeasuredProfile.load(table))
        for phase in ("prefill", "decode"):
            given.rows(stand_in, phase, of=opts.model)
        if host_model:
            require_host_rows(given.table, table if isinstance(table, str | Path) else "the profile given",
                              sum(1 for p in desc["placement"] if p["model"] == opts.model))
    elif opts.simulate and host_model and opts.profile_source != "host":
        raise UserError(f"replay: --profile-source {opts.profile_source} measures no host rows, which the live-host "
                        "model needs; use --profile-source host or pass --host-model off")
    topo = mirror_topology(desc)
    rng = np.random.default_rng(opts.seed)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    clear_outputs(out, keep=opts.profile)
    profile = opts.profile
    if opts.simulate and not profile:  # measured before the live run, under the same machine conditions
        profiles = []
        for i in range(opts.profile_repeats):
            if opts.profile_repeats > 1:
                progress(f"profile {i + 1} of {opts.profile_repeats}")
            profiles.append(measure_for_replay(opts, desc, topo, progress))
        profile = pooled_profile(profiles)
        profile.to_csv(out / "profile.csv", index=False)
    live, timelines, host = live_replay(opts, desc, topo, rng, progress, trace_rows, keep=out / "live.parquet")
    ok = live[(live.status == 200) & (live.error == "")]
    if not len(ok):  # nothing to compare: say why instead of writing empty tables
        errors = live.error.fillna("").astype(str)
        why = live.assign(error=errors.where(errors.str.len() <= 200, errors.str.slice(0, 197) + "...")).groupby(
            ["status", "error"], dropna=False).size()
        first = "; ".join(f"{n} x {_status(st, err)}" for (st, err), n in why.head(3).items())
        statuses = set(live.status)
        hint = ("check --token and --account" if statuses & {401, 403} else
                "check the gateway's rate limits and load" if 429 in statuses else
                "check --max-prompt and --max-output against the served model" if 400 in statuses or 413 in statuses
                else f"is {opts.url} still serving?" if statuses == {0} else "see the errors")
        raise UserError(f"replay: none of the {len(live)} requests succeeded ({first}); {hint}")
    live.to_parquet(out / "live.parquet", index=False)
    (out / "host.json").write_text(json.dumps(host, indent=1))
    progress(f"live: {len(ok)}/{len(live)} ok; wrote {out / 'live.parquet'}")
    repeat = repeat_report(opts, desc, topo, trace_rows, timelines, progress) if opts.repeat_live else []
    parts_live = live_frame(live, timelines)
    if not opts.simulate:
        return "\n".join([summarize(ok).to_string(index=False), "", host_report(host), *repeat])
    note = left_out_note(live)  # never admitted: the simulation would make them load the replicas (said once, below)
    sim = simulate_like(desc, admitted(live), topo, profile, progress=progress, host_model=host_model)
    sim.to_parquet(out / "sim.parquet", index=False)
    table = compare(sim, live)
    table.to_csv(out / "comparison.csv", index=False)
    counts = outcome_counts(sim, live)
    (out / "outcomes.json").write_text(json.dumps(counts, indent=1))
    parts_sim = sim_components(sim)
    pd.concat([parts_live.assign(side="live"), parts_sim.assign(side="sim")], ignore_index=True).to_csv(
        out / "decomposition.csv", index=False)
    plot_replay(sim, live, parts_sim, parts_live, out / "replay.png")
    lines = [table.to_string(index=False), outcomes_line(counts), *([note] if note else []), "",
             "where the time goes (ms; means add up to E2E, TTFT = the parts up to prefill + first_delivery):",
             side_by_side(parts_sim, parts_live).to_string(index=False)]
    if len(parts_live) and len(parts_sim):
        one = one_request(parts_sim, parts_live)
        lines += ["", f"one request (id {int(one.request_id.iloc[0])}, the live median E2E):",
                  one.drop(columns="request_id").to_string(index=False)]
    one_engine = len({p["replica"] for p in desc["placement"] if p["model"] == opts.model}) == 1
    drift = alone_vs_profile(timelines, profile if isinstance(profile, pd.DataFrame)  # (a profile given as a file)
                             else MeasuredProfile.load(profile).table,
                             stand_in=desc.get("stand_ins", {}).get(opts.model, opts.model)) if one_engine else None
    if drift is not None:
        lines += ["", f"the machine during the live run against the profile the simulation used: requests decoding "
                      f"alone took {drift:+.1f}% per step (beyond a few %, the machine changed since its profile)"]
    measured = "profile.csv, " if isinstance(profile, pd.DataFrame) else ""
    lines += ["", host_report(host), *repeat, f"wrote {out}/sim.parquet, live.parquet, comparison.csv, "
              f"decomposition.csv, outcomes.json, {measured}host.json, replay.png (distributions and components, "
              "both sides)"]
    return "\n".join(lines)


def repeat_report(opts: ReplayOptions, desc: dict, topo, trace_rows: pd.DataFrame, timelines: list[dict],
                  progress=print) -> list[str]:
    """Send the same requests a second time (``out/repeat``) and report the second live run against the first,
    as the simulation is compared: how far the live system is from repeating itself, and the machine's speed in
    each run (``timelines``: the first run's)."""
    out = Path(opts.out) / "repeat"
    out.mkdir(parents=True, exist_ok=True)
    progress("the same requests again: the live system against itself")
    again, timelines_again, host = live_replay(opts, desc, topo, np.random.default_rng(opts.seed), progress,
                                               trace_rows, keep=out / "live.parquet")
    again.to_parquet(out / "live.parquet", index=False)
    (out / "host.json").write_text(json.dumps(host, indent=1))
    table = live_repeat_table(opts.out)
    lines = ["", "live again vs live (the same requests sent twice; the floor under the simulation's errors):",
             table.to_string(index=False)]
    first, second = alone_step_ms(timelines), alone_step_ms(timelines_again)
    if first and second:
        lines.append(f"the machine's speed: decode step of requests decoding alone {first:.3f} ms first, "
                     f"{second:.3f} ms again ({100 * (second / first - 1):+.1f}%)")
    return lines


def host_report(host: dict) -> str:
    """One line on the host during the live run: wall time, cores, load average, CPU seconds per part."""
    cpu = ", ".join(f"{k} {v:.2f} s ({host['cores_busy'].get(k, 0):.2f} cores)" for k, v in host["cpu_s"].items())
    load = host.get("loadavg_before") or [float("nan")]
    return (f"host during the run ({host['wall_s']:.1f} s, {host['cores']} cores, load average "
            f"{load[0]:.2f} before): {cpu}")


def served_n_ctx(desc: dict, stand_in: str) -> int:
    """The context window of the stand-in the gateway serves (loaded as the gateway loads it)."""
    session = SessionConfig(provider=desc.get("provider", "auto"), intra_op_threads=desc.get("threads", 0))
    return int(registry.load(stand_in, session).spec.n_ctx)


def measure_for_replay(opts: ReplayOptions, desc: dict, topo, progress=print) -> pd.DataFrame:
    """The service-time profile the simulator uses: the live-host profile (default), service times through the
    gateway, or the bare LM engine."""
    stand_in = desc["stand_ins"][opts.model]
    session = SessionConfig(provider=desc.get("provider", "auto"), intra_op_threads=desc.get("threads", 0))
    n_ctx = served_n_ctx(desc, stand_in)
    if opts.profile_source == "engine":
        return measure_profile([stand_in], progress, session)
    if opts.profile_source == "host":
        return measure_host_profile(opts.url, opts.model, stand_in, session, pop_locations(desc, topo, opts.model),
                                    opts.token, opts.account, opts.seed, progress, n_ctx=n_ctx,
                                    decode_steps=max(opts.max_output - 1, 1))
    progress(f"measuring {opts.model} ({stand_in}) through the gateway (pass --profile to reuse a table)")
    scale = float(desc["delay_scale"]) if desc["delay"] else 0.0
    return gateway_profile(opts.url, opts.model, stand_in, scale, opts.token, opts.account, max_context=n_ctx,
                           seed=opts.seed)

