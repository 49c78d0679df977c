"""Derive ``controlplane/data/perf_holdout_nim.csv`` from a published GenAI-Perf benchmark table of NVIDIA NIM.

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
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

OUT = Path(__file__).resolve().parent.parent / "controlplane" / "data" / "perf_holdout_nim.csv"
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
          "time_to_first_token-avg": "ttft_ns", "inter_token_latency-avg": "itl_ns"}


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", type=Path, required=True, help="the source nim.csv")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    table = derive(args.src)
    table.to_csv(args.out, index=False)
    print(f"{len(table)} rows -> {args.out}")


if __name__ == "__main__":
    main()
