"""Derive ``controlplane/data/perf_holdout_nim.csv`` and ``perf_holdout_nim_load.csv`` from a published GenAI-Perf
benchmark table of NVIDIA NIM.

Run once by a maintainer when the source changes (the package never reads the source at run time)::

    python scripts/derive_nim_holdout.py --src nim.csv

``nim.csv``: the dataset of NVIDIA's "Sizing LLM inference systems" course (benchmark runs of an older NIM with
TensorRT-LLM, Llama 3 8B and 70B on A100 and H100, tensor parallelism 1-8, FP16/BF16/FP8, measured with
GenAI-Perf), as published in https://github.com/wbing520/ai-performance-engineering (Apache-2.0) at commit
0e25b2e, ``code/ch10_inference/inference_gpu_cluster_sizing/dataset/nim.csv``.

Only concurrency-1 runs are kept: one request at a time, so time to first token is a batch-1 prefill (plus HTTP
and tokenization) and inter-token latency a batch-1 decode step. Per configuration: one prefill row per input
length (the mean of its runs, which differ only in output length) and one decode row per run, at the mean
context of its generation (input + output / 2).

The load table keeps every run, concurrency 1 to 250 (GenAI-Perf's concurrency mode: that many clients, each
sending its next request when the last one's answer ended), one row per configuration, concurrency, input and
output length (the mean of repeated runs): mean TTFT, inter-token latency and request latency, and requests per
second. ``sim.load_validation`` replays each as a closed loop on one simulated replica.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

OUT = Path(__file__).resolve().parent.parent / "controlplane" / "data" / "perf_holdout_nim.csv"
OUT_LOAD = OUT.with_name("perf_holdout_nim_load.csv")
SOURCE = ("https://github.com/wbing520/ai-performance-engineering/blob/0e25b2e236211ad01ed2221bd2c1cfa5b3f47b55/"
          "code/ch10_inference/inference_gpu_cluster_sizing/dataset/nim.csv")
ENGINE = "nim-2024-tensorrt-llm"
# Llama 3.1 8B has Llama 3 8B's architecture (the catalog entry stands for it, as for Vidur's profiles).
MODELS = {"meta-llama3-8b-instruct": "@cf/meta/llama-3.1-8b-instruct", "meta-llama3-70b-instruct": "@ref/meta/llama-3-70b"}
GPUS = {"A100-SXM4-80GB": "A100-80GB", "H100_80GB_HBM3": "H100"}
COLUMNS = ["model", "gpu", "tp", "precision", "kv_precision", "phase", "batch", "prompt_tokens", "context",
           "measured_ms", "engine", "source", "notes"]
RENAME = {"task_inputs-model": "model", "task_inputs-GPU": "gpu", "task_inputs-n_gpus": "tp",
          "task_inputs-precision": "precision", "input_config-concurrency": "concurrency",
          "input_config-synthetic_input_tokens_mean": "isl", "input_config-output_tokens_mean": "osl",
          "time_to_first_token-avg": "ttft_ns", "inter_token_latency-avg": "itl_ns",
          "request_latency-avg": "e2e_ns", "request_throughput-avg": "rps"}
LOAD_COLUMNS = ["model", "gpu", "tp", "precision", "concurrency", "prompt_tokens", "output_tokens", "ttft_ms", "itl_ms",
                "e2e_ms", "requests_per_s", "runs", "engine", "source"]


def derive(src: Path) -> pd.DataFrame:
    d = pd.read_csv(src).rename(columns=RENAME)
    d = d[d.concurrency == 1]
    rows = []
    for (model, gpu, tp, prec), runs in d.groupby(["model", "gpu", "tp", "precision"], sort=True):
        base = {"model": MODELS[model], "gpu": GPUS[gpu], "tp": int(tp), "precision": prec, "kv_precision": prec,
                "batch": 1, "engine": ENGINE, "source": SOURCE}
        what = (f"NIM (TensorRT-LLM) {model} on {int(tp)} x {gpu}, {prec}, concurrency 1 (GenAI-Perf; TTFT "
                "includes HTTP and tokenization)")
        for isl, same in runs.groupby("isl"):
            outs = "/".join(str(int(o)) for o in sorted(same.osl))
            rows.append({**base, "phase": "prefill", "prompt_tokens": int(isl), "context": 0,
                         "measured_ms": round(same.ttft_ns.mean() / 1e6, 2),
                         "notes": f"{what}; TTFT, mean of the runs with {int(isl)} input tokens ({outs} out)"})
        for r in runs.sort_values(["isl", "osl"]).itertuples():
            rows.append({**base, "phase": "decode", "prompt_tokens": int(r.isl), "context": int(r.isl + r.osl / 2),
                         "measured_ms": round(r.itl_ns / 1e6, 2),
                         "notes": f"{what}; ITL, {int(r.isl)} in / {int(r.osl)} out; context = input + output / 2"})
    return pd.DataFrame(rows)[COLUMNS]


def derive_load(src: Path) -> pd.DataFrame:
    d = pd.read_csv(src).rename(columns=RENAME)
    keys = ["model", "gpu", "tp", "precision", "concurrency", "isl", "osl"]
    g = d.groupby(keys, sort=True).agg(ttft_ns=("ttft_ns", "mean"), itl_ns=("itl_ns", "mean"),
                                       e2e_ns=("e2e_ns", "mean"), rps=("rps", "mean"),
                                       runs=("rps", "size")).reset_index()
    out = pd.DataFrame({"model": g.model.map(MODELS), "gpu": g.gpu.map(GPUS), "tp": g.tp.astype(int),
                        "precision": g.precision, "concurrency": g.concurrency.astype(int),
                        "prompt_tokens": g.isl.astype(int), "output_tokens": g.osl.astype(int),
                        "ttft_ms": (g.ttft_ns / 1e6).round(2), "itl_ms": (g.itl_ns / 1e6).round(3),
                        "e2e_ms": (g.e2e_ns / 1e6).round(1), "requests_per_s": g.rps.round(4), "runs": g.runs,
                        "engine": ENGINE, "source": SOURCE})
    return out[LOAD_COLUMNS]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", type=Path, required=True, help="the source nim.csv")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--out-load", type=Path, default=OUT_LOAD)
    args = ap.parse_args()
    table = derive(args.src)
    table.to_csv(args.out, index=False)
    print(f"{len(table)} rows -> {args.out}")
    load = derive_load(args.src)
    load.to_csv(args.out_load, index=False)
    print(f"{len(load)} rows -> {args.out_load}")


if __name__ == "__main__":
    main()
