"""The simulated replica under load, against published closed-loop benchmark runs it was never fitted on.

The service-time checks (:mod:`controlplane.perf_validation`) time single passes. This one checks what the simulator
builds from them: the replica engine (:class:`sim.engine.ReplicaEngine`: prefill iterations that stall decoding,
batched decode steps) on the service-time model, driven the way the benchmark drove the real server. Each row of
``controlplane/data/perf_holdout_nim_load.csv`` (GenAI-Perf runs of an older NVIDIA NIM, TensorRT-LLM backend,
Llama 3 8B / 70B on A100 / H100, tensor parallel 1-8; derived by ``scripts/derive_nim_holdout.py``) is one closed
loop: ``concurrency`` clients, each sending its next request (fixed input and output lengths) the moment its last
answer ends. The loop runs on one simulated replica until it is steady, and its mean TTFT, inter-token latency,
request latency and requests per second are compared with the run's.

What the closed loop adds to the engine, from physics and the engine's documented defaults, not fitted:

* **KV-cache capacity**: the replica holds ``KV_MEMORY_SHARE`` of the GPU memory its weights and runtime leave
  free (TensorRT-LLM's ``kv_cache_free_gpu_mem_fraction`` default) as KV cache, and admits a request only when its
  whole context (input + output tokens) fits beside the running ones (the engine's default "guaranteed no
  eviction" scheduling); the others wait in arrival order.
* **clients in step**: every client sends its first request at once, as GenAI-Perf does, and identical requests
  keep them in step: the runs' TTFT at 5 and 10 clients is about 4 and 9 lone prefills (a cohort prefilled
  together), which clients spread over a request's latency would not show.

Not modelled: HTTP and tokenization inside TTFT (milliseconds; the batch-1 rows show them), TensorRT-LLM's
in-flight batching of prefill chunks with decode steps (the engine here prefills, then decodes).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from controlplane import perf_arch
from controlplane.perf import Roofline, with_precision
from controlplane.perf_params import RooflineParams
from controlplane.perf_rows import DATA, read_measurements, reference_gpus, reference_specs
from edgepop.errors import DataFileError
from sim.engine import ReplicaEngine, Seq
from sim.techniques.chunked import ChunkedEngine

LOAD_FILE = DATA / "perf_holdout_nim_load.csv"
COLUMNS = ["model", "gpu", "tp", "precision", "concurrency", "prompt_tokens", "output_tokens", "ttft_ms", "itl_ms",
           "e2e_ms", "requests_per_s", "runs", "engine", "source"]
KV_MEMORY_SHARE = 0.9
METRICS = ("ttft_ms", "itl_ms", "e2e_ms", "requests_per_s")
BANDS = ((1, 1, "1"), (2, 10, "2-10"), (11, 50, "25-50"), (51, 10**9, "100-250"))
# name -> (engine profile, iteration token budget of chunked prefill or None: prefill first, then decode)
READINGS = {"default": ("default", None), "other_release": ("nim-1.8-tensorrt-llm", None),
            "chunked": ("default", 8192)}


def load_table(path: str | Path | None = None) -> pd.DataFrame:
    """The closed-loop runs, checked (one :class:`DataFileError` naming row and field)."""
    path = Path(path) if path else LOAD_FILE
    table, rows = read_measurements(path, COLUMNS, ("tp", "concurrency", "prompt_tokens", "ttft_ms", "itl_ms",
                                                    "e2e_ms", "requests_per_s"))
    for i, r in rows:
        if not r.output_tokens > 1:
            raise DataFileError(path, i, "output_tokens", f"{r.output_tokens!r}: inter-token latency needs 2 or more")
    return table


def kv_capacity_tokens(perf: Roofline, spec, gpu: str) -> float:
    """Tokens of KV cache one replica holds: ``KV_MEMORY_SHARE`` of what weights and runtime leave free."""
    mem = perf.memory_per_gpu(spec, gpu, spec.tensor_parallel, kv_tokens=1)
    free = mem["capacity_bytes"] - mem["weights_bytes"] - mem["overhead_bytes"]
    return max(free, 0.0) * KV_MEMORY_SHARE / mem["kv_bytes"]


def closed_loop(spec, gpu: str, perf, concurrency: int, prompt: int, output: int, kv_tokens: float = math.inf,
                warmup: int | None = None, measured: int | None = None, chunk_tokens: int | None = None) -> dict:
    """Mean TTFT, inter-token latency and request latency (ms) and requests per second of ``concurrency`` clients
    looping on one replica, over ``measured`` completions after ``warmup`` (defaults: 2 and 3 rounds of every
    client, at least 10 and 60). ``chunk_tokens``: the replica chunks prefills into iterations of that many
    tokens (:mod:`sim.techniques.chunked`) instead of prefilling, then decoding."""
    warmup = max(2 * concurrency, 10) if warmup is None else warmup
    measured = max(3 * concurrency, 60) if measured is None else measured
    queue, ids = [], itertools.count()
    finished: list[tuple[Seq, float]] = []
    args = (spec, gpu, perf, lambda _e, t, v: heapq.heappush(queue, (t, next(ids), v)), lambda s, t: None,
            lambda s, t: finished.append((s, t)))
    eng = ReplicaEngine(*args) if chunk_tokens is None else ChunkedEngine(*args, budget=chunk_tokens)
    need = float(spec.kv_footprint(prompt + output))  # its whole context (full-layer equivalents), reserved at admission
    waiting: deque[Seq] = deque()
    sent: dict[int, float] = {}
    state = {"reserved": 0.0, "running": 0}
    records: list[tuple[float, float, float]] = []

    def admit(seq: Seq, t: float) -> None:
        state["reserved"] += need
        state["running"] += 1
        eng.join(seq, t)

    def send(t: float) -> None:
        seq = Seq(next(ids), prompt, output)
        sent[seq.rec] = t
        if state["running"] == 0 or state["reserved"] + need <= kv_tokens:
            admit(seq, t)
        else:
            waiting.append(seq)

    for _ in range(concurrency):
        send(0.0)
    total = warmup + measured
    while queue and len(records) < total:
        t, _, version = heapq.heappop(queue)
        eng.wake(t, version)
        while finished:
            seq, t_end = finished.pop()
            records.append((sent.pop(seq.rec), seq.first_token_at, t_end))
            state["reserved"] -= need
            state["running"] -= 1
            while waiting and state["reserved"] + need <= kv_tokens:
                admit(waiting.popleft(), t_end)
            send(t_end)  # the client's next request
    r = np.array(records[warmup:total])
    t0 = records[warmup - 1][2] if warmup else 0.0
    span = r[:, 2].max() - t0
    return {"ttft_ms": float(np.mean(r[:, 1] - r[:, 0]) * 1e3),
            "itl_ms": float(np.mean((r[:, 2] - r[:, 1]) / (output - 1)) * 1e3),
            "e2e_ms": float(np.mean(r[:, 2] - r[:, 0]) * 1e3),
            "requests_per_s": float(len(r) / span) if span > 0 else math.nan}


def predict(table: pd.DataFrame, engine: str = "default", params: RooflineParams | None = None,
            progress=None, chunk_tokens: int | None = None) -> pd.DataFrame:
    """``table`` with the simulated ``<metric>_sim`` columns, every run replayed under the engine profile ``engine``
    (``chunk_tokens``: with chunked prefill at that budget)."""
    specs, gpus = reference_specs(), reference_gpus()
    perf = Roofline(gpus, params or RooflineParams.load(), engine)
    out = {f"{m}_sim": np.full(len(table), np.nan) for m in METRICS}
    kv = np.full(len(table), np.nan)
    for i, r in enumerate(table.itertuples()):
        base, _ = perf_arch.split_precision(r.precision)
        spec = replace(with_precision(specs[r.model], base, r.precision), tensor_parallel=int(r.tp))
        kv[i] = kv_capacity_tokens(perf, spec, r.gpu)
        res = closed_loop(spec, r.gpu, perf, int(r.concurrency), int(r.prompt_tokens), int(r.output_tokens), kv[i],
                          chunk_tokens=chunk_tokens)
        for m in METRICS:
            out[f"{m}_sim"][i] = res[m]
        if progress:
            progress(i + 1, len(table))
    return table.assign(kv_capacity_tokens=kv.round(0), **out)


def band(concurrency: int) -> str:
    """The name of the ``BANDS`` concurrency band ``concurrency`` falls in."""
    return next(name for lo, hi, name in BANDS if lo <= concurrency <= hi)


def load_report(path: str | Path | None = None, params: RooflineParams | None = None, progress=None) -> dict:
    """Every run replayed under the ``default`` engine profile, under the fitted profile of another release of the
    benchmarked engine, and with the ``default`` profile on a replica that chunks its prefills (:data:`READINGS`):
    MAPE and mean signed error per metric, overall and per concurrency band, and every run's figures."""
    table = load_table(path)
    out = {"file": Path(path or LOAD_FILE).name, "runs": int(len(table)), "kv_memory_share": KV_MEMORY_SHARE,
           "sources": sorted(set(table.source)), "readings": {}, "points": []}
    sims = {}
    for name, (engine, chunk) in READINGS.items():
        sim = sims[name] = predict(table, engine, params, progress, chunk)
        bands = sim.concurrency.map(band).to_numpy()
        entry = {"engine_profile": engine, "chunked_prefill_tokens": chunk}
        for m in METRICS:
            err = sim[f"{m}_sim"].to_numpy() / sim[m].to_numpy() - 1.0
            entry[m] = {"mape": float(np.mean(np.abs(err))), "mean_signed": float(np.mean(err)),
                        "by_concurrency": {b: {"runs": int((bands == b).sum()),
                                               "mape": float(np.mean(np.abs(err[bands == b]))),
                                               "mean_signed": float(np.mean(err[bands == b]))}
                                           for _, _, b in BANDS if (bands == b).any()}}
        out["readings"][name] = entry
    for i, r in enumerate(table.itertuples()):
        out["points"].append({"model": r.model, "gpu": r.gpu, "tp": int(r.tp), "precision": r.precision,
                              "concurrency": int(r.concurrency), "prompt_tokens": int(r.prompt_tokens),
                              "output_tokens": int(r.output_tokens),
                              **{m: float(getattr(r, m)) for m in METRICS},
                              **{f"{m}_{name}": float(f"{s[f'{m}_sim'].iloc[i]:.6g}")
                                 for name, s in sims.items() for m in METRICS}})
    return out


def _pct(x: float, signed: bool = False) -> str:
    return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"


NAMES = {"ttft_ms": "TTFT", "itl_ms": "inter-token latency", "e2e_ms": "request latency",
         "requests_per_s": "requests/s"}


def render_markdown(rep: dict, level: str = "##") -> list[str]:
    """The section of ``docs/fidelity-models.md`` on the closed-loop runs (lines)."""
    lines = [f"{level} The simulated replica under load", "",
             f"{rep['runs']} closed-loop benchmark runs (`controlplane/data/{rep['file']}`: GenAI-Perf, 1 to 250 "
             "clients each sending its next request when its last answer ends, fixed input and output lengths; an "
             "older NVIDIA NIM with TensorRT-LLM; Llama 3 8B and 70B on A100 and H100, tensor parallel 1-8), each "
             "replayed as the same closed loop on one simulated replica (`sim/load_validation.py`: the replica "
             "engine on the service-time model, a KV cache of "
             f"{100 * rep['kv_memory_share']:.0f}% of the memory the weights leave free). Nothing here was fitted "
             "on these runs. Cells: MAPE / mean signed error (simulated vs measured; negative: the simulation "
             "is faster, or serves fewer requests per second).", ""]
    for name, e in rep["readings"].items():
        bands = list(next(iter(e[m] for m in METRICS))["by_concurrency"])
        if e.get("chunked_prefill_tokens"):
            how = (f", prefills chunked into iterations of {e['chunked_prefill_tokens']:,} tokens "
                   "(`sim/techniques/chunked.py`; the budget of TensorRT-LLM's in-flight batching, `max_num_tokens`, "
                   "in many builds):")
        elif name == "default":
            how = " (what estimates use), prefill then decode:"
        else:
            how = " (the fitted profile of another release of the benchmarked engine):"
        lines += [f"Engine profile `{e['engine_profile']}`" + how, "",
                  "| metric | all runs | " + " | ".join(f"{b} client{'' if b == '1' else 's'}" for b in bands) + " |",
                  "|---|---:|" + "---:|" * len(bands)]
        for m in METRICS:
            x = e[m]
            cells = [f"{_pct(x['mape'])} / {_pct(x['mean_signed'], True)}"]
            cells += [f"{_pct(x['by_concurrency'][b]['mape'])} / {_pct(x['by_concurrency'][b]['mean_signed'], True)}"
                      for b in bands]
            lines.append(f"| {NAMES[m]} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines
