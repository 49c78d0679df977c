"""Where each request's time went, live and simulated, in the same components, so an error can be located.

Live, the client's own stamps (send, first piece, end of stream) and the gateway's timeline of the request
(``x-edgepop-trace``, :mod:`dataplane.gateway.timeline`; the same monotonic clock) form one chain, so the
components below add up to the E2E the client measured, by construction:

=============  ===========================================================================================
http_in        client send -> the application has the request (client HTTP stack, loopback, server parse)
prepare        body read, validation, tokenizer
wan_in         injected inbound WAN delay: half the access RTT, then half the backbone RTT
admission      the control plane's decision
queue          waiting for a slot at the serving replica (beyond the backbone leg)
dispatch       slot granted -> handed to the replica's engine (response start, engine submit)
engine_wait    in the engine's queue: the running iteration ends (or the batch has room)
prefill        its prefill iteration (prompts joining together, left padded) -> first piece produced
decode         its decode steps (batched forward call, sampling, retiring rows)
stall          other requests' prefills run while it was decoding (prefill/decode interference)
engine_loop    the rest of first -> last piece at the engine: iteration bookkeeping, host scheduling
wan_out        injected WAN delay of the last piece back to the client
stream         last piece produced -> written out, beyond ``wan_out``: engine-thread -> event-loop hop,
               event-loop lag, SSE framing
tail           last piece written -> response's last byte (usage frame, ``[DONE]``)
http_out       last byte handed to the server -> the client saw the end of the stream (write, loopback, parsing)
=============  ===========================================================================================

TTFT is the same chain up to ``prefill``, then ``first_delivery`` (first piece produced -> client got it).
Per-token figures: ``step_ms`` (mean decode step it took part in) and ``stream_per_piece_ms`` (mean streaming
cost per piece beyond the WAN delay), and what those steps computed: ``step_batch`` (mean rows per step) and
``step_kv_len`` (mean tokens each step attended over: the batch's KV is left padded to its longest row, so a
short request batched with a long one pays the long one's length). These two are counts, not milliseconds: a
slower step at the same batch and length is the engine's speed, a longer length is the batching.

The simulator fills the components it models (:func:`sim_components`); with the live-host model
(:mod:`sim.live.host_model`) it models every one of them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

E2E_PARTS = ("http_in", "prepare", "wan_in", "admission", "queue", "dispatch", "engine_wait", "prefill", "decode",
             "stall", "engine_loop", "wan_out", "stream", "tail", "http_out")
TTFT_PARTS = ("http_in", "prepare", "wan_in", "admission", "queue", "dispatch", "engine_wait", "prefill",
              "first_delivery")
PER_TOKEN = ("step_ms", "stream_per_piece_ms", "step_batch", "step_kv_len")


def _ms(x) -> float:
    return float(x) * 1e3 if x is not None else np.nan


def live_components(rec: dict, tl: dict) -> dict:
    """The components (ms) of one live request: ``rec`` holds the client's stamps (``c_send``, ``c_first``,
    ``c_end``: monotonic s), ``tl`` the gateway's timeline of it (``/edgepop/timings``)."""
    eng = tl.get("engine") or {}
    g = {k: (np.nan if tl.get(k) is None else float(tl[k])) for k in (
        "recv", "prepared", "wan_in_end", "decided", "ready", "engine_submit", "first_gen", "first_sent",
        "last_gen", "last_sent", "response_end")}
    admitted = np.nan if eng.get("admitted") is None else float(eng["admitted"])
    backbone = min(max(g["ready"] - g["decided"], 0.0), float(tl.get("backbone_s") or 0.0))
    back = float(tl.get("back_s") or 0.0)
    to_last = g["last_gen"] - g["first_gen"]
    decode = min(float(eng.get("decode_s") or 0.0), to_last)
    stall = min(float(eng.get("stall_s") or 0.0), to_last - decode)
    out = {
        "http_in": g["recv"] - rec["c_send"],
        "prepare": g["prepared"] - g["recv"],
        "wan_in": g["wan_in_end"] - g["prepared"] + backbone,
        "admission": g["decided"] - g["wan_in_end"],
        "queue": g["ready"] - g["decided"] - backbone,
        "dispatch": g["engine_submit"] - g["ready"],
        "engine_wait": admitted - g["engine_submit"],
        "prefill": g["first_gen"] - admitted,
        "decode": decode,
        "stall": stall,
        "engine_loop": to_last - decode - stall,
        "wan_out": back,
        "stream": g["last_sent"] - g["last_gen"] - back,
        "tail": g["response_end"] - g["last_sent"],
        "http_out": rec["c_end"] - g["response_end"],
        "first_delivery": rec["c_first"] - g["first_gen"],
    }
    out = {k: v * 1e3 for k, v in out.items()}
    steps = int(eng.get("steps") or 0)
    out["step_ms"] = _ms(eng["decode_s"] / steps) if steps else np.nan
    out["step_batch"] = eng["batch_sum"] / steps if steps else np.nan
    out["step_kv_len"] = eng["kv_len_sum"] / steps if steps and "kv_len_sum" in eng else np.nan  # older traces lack it
    pieces = int(tl.get("pieces") or 0)
    out["stream_per_piece_ms"] = _ms(float(tl.get("late_s") or 0.0) / pieces) if pieces else np.nan
    return out


def live_frame(live: pd.DataFrame, timelines: list[dict]) -> pd.DataFrame:
    """One row of components per live request that has a complete chain (joined on the trace id)."""
    by_trace = {t["trace"]: t for t in timelines}
    rows = []
    for rec in live.to_dict("records"):
        tl = by_trace.get(rec.get("trace"))
        if tl is None or rec.get("status") != 200 or rec.get("error") or not np.isfinite(rec.get("c_end", np.nan)):
            continue
        if tl.get("first_gen") is None or (tl.get("engine") or {}).get("admitted") is None:
            continue
        rows.append({"request_id": rec["request_id"], **live_components(rec, tl)})
    return pd.DataFrame(rows, columns=["request_id", *E2E_PARTS, "first_delivery", *PER_TOKEN])


def sim_components(sim: pd.DataFrame) -> pd.DataFrame:
    """The simulator's components per request (the columns it does not model are 0; a live-host run models
    them all and has them as ``c_<name>`` columns)."""
    ok = sim[sim.outcome == "ok"] if "outcome" in sim else sim
    out = pd.DataFrame({"request_id": ok.request_id.to_numpy()})
    if "c_prefill" in ok:  # the live-host model reports every component
        for k in (*E2E_PARTS, "first_delivery", *PER_TOKEN):
            out[k] = ok[f"c_{k}"].to_numpy()
        return out
    net = ok.network_rtt_ms.to_numpy()
    stall = ok.stall_ms.fillna(0.0).to_numpy()
    to_last = (ok.e2e_ms - ok.ttft_ms).to_numpy()
    zero = np.zeros(len(ok))
    parts = {"http_in": zero, "prepare": zero, "wan_in": net / 2, "admission": zero,
             "queue": (ok.queue_ms + ok.cold_start_ms).to_numpy(), "dispatch": zero, "engine_wait": zero,
             "prefill": ok.prefill_ms.to_numpy(), "decode": to_last - stall, "stall": stall, "engine_loop": zero,
             "wan_out": net / 2, "stream": zero, "tail": zero, "http_out": zero, "first_delivery": net / 2}
    for k, v in parts.items():
        out[k] = v
    steps = np.maximum(ok.output_tokens.to_numpy() - 1, 1)
    out["step_ms"] = (to_last - stall) / steps
    out["stream_per_piece_ms"] = zero
    out["step_batch"] = out["step_kv_len"] = np.nan  # the replica engine keeps no per-request batch shape
    return out


def side_by_side(sim: pd.DataFrame, live: pd.DataFrame) -> pd.DataFrame:
    """Mean and median of every component over the requests both sides completed: sim, live, sim - live.

    Means add up (the ``E2E`` row is the sum of the parts above it, on both sides), medians do not. The
    ``step_batch`` and ``step_kv_len`` rows are rows and tokens, not milliseconds."""
    ids = np.intersect1d(sim.request_id.to_numpy(), live.request_id.to_numpy())
    a, b = sim.set_index("request_id").loc[ids], live.set_index("request_id").loc[ids]
    rows = []
    for k in (*E2E_PARTS, "E2E", "first_delivery", "TTFT", *PER_TOKEN):
        if k == "E2E":
            xs, xl = a[list(E2E_PARTS)].sum(axis=1), b[list(E2E_PARTS)].sum(axis=1)
        elif k == "TTFT":
            xs, xl = a[list(TTFT_PARTS)].sum(axis=1), b[list(TTFT_PARTS)].sum(axis=1)
        else:
            xs, xl = a[k], b[k]
        # (pandas skips NaN, and gives NaN without a warning where every value is one: per-token components of
        # one-token outputs)
        ms, ml = float(xs.mean()), float(xl.mean())
        rows.append({"component": k, "sim_mean_ms": round(ms, 3), "live_mean_ms": round(ml, 3),
                     "diff_ms": round(ms - ml, 3), "sim_p50_ms": round(float(xs.median()), 3),
                     "live_p50_ms": round(float(xl.median()), 3)})
    return pd.DataFrame(rows)


def one_request(sim: pd.DataFrame, live: pd.DataFrame, request_id: int | None = None) -> pd.DataFrame:
    """The components of one request side by side (default: the live request with the median E2E)."""
    ids = np.intersect1d(sim.request_id.to_numpy(), live.request_id.to_numpy())
    b = live.set_index("request_id").loc[ids]
    if request_id is None:
        e2e = b[list(E2E_PARTS)].sum(axis=1).sort_values(kind="stable")
        request_id = int(e2e.index[len(e2e) // 2])
    a = sim.set_index("request_id").loc[request_id]
    b = b.loc[request_id]
    names = (*E2E_PARTS, "first_delivery", *PER_TOKEN)
    return pd.DataFrame({"component": names, "sim_ms": [round(float(a[k]), 3) for k in names],
                         "live_ms": [round(float(b[k]), 3) for k in names]}).assign(request_id=request_id)


def _alone(timelines: list[dict]) -> list[dict]:
    """The engine stamps of a live run's requests that decoded alone (batch < 1.05 on average)."""
    engines = [t["engine"] for t in timelines if (t.get("engine") or {}).get("steps")]
    return [e for e in engines if e["batch_sum"] / e["steps"] < 1.05]


def alone_step_ms(timelines: list[dict]) -> float | None:
    """Median decode step (ms, the engine's own stamps) of a live run's requests that decoded alone (batch < 1.05 on
    average): the machine's speed during that run, free of batching. None without such requests."""
    alone = [1e3 * e["decode_s"] / e["steps"] for e in _alone(timelines)]
    return round(float(np.median(alone)), 3) if alone else None


def alone_vs_profile(timelines: list[dict], profile: pd.DataFrame, stand_in: str | None = None) -> float | None:
    """How much slower (+) or faster (-) the machine ran during a live run than when ``profile`` was measured, in %:
    the median, over the requests that decoded alone (as :func:`alone_step_ms`), of their decode step over the
    profile's batch-1 ``decode`` step at the length they attended over (``kv_len_sum`` / steps; prompt plus half
    the steps for traces without it). None without such requests or batch-1 decode rows. A cell whose live runs
    agree with each other can still disagree with its profile: this says whether the machine changed since. For
    one engine only: where several engines share the host, one decoding alone is slowed by the others too.
    ``stand_in``: the model the live engine runs; a table of several models is read at its rows only."""
    if stand_in is not None and "model" in profile:
        profile = profile[profile.model == stand_in]
    d = profile[(profile.phase == "decode") & (profile.batch_size == 1)].groupby("context").ms.median()
    if d.empty:
        return None
    ctx, ms = d.index.to_numpy(dtype=float), np.maximum.accumulate(d.to_numpy(dtype=float))
    ratios = []
    for e in _alone(timelines):
        steps = e["steps"]
        length = e["kv_len_sum"] / steps - 1 if "kv_len_sum" in e else e.get("prefill_len", 0) + steps / 2
        ratios.append(1e3 * e["decode_s"] / steps / float(np.interp(length, ctx, ms)))
    return round(100 * (float(np.median(ratios)) - 1), 1) if ratios else None
