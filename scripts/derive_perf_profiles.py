"""Derive the kernel-level and collective reference tables in ``controlplane/data/`` from Vidur's profiles.

Run once by a maintainer when the source changes (the package never reads the source at run time)::

    python scripts/derive_perf_profiles.py --src DIR   # DIR holds Vidur's data/profiling (compute/, network/)

Outputs (see controlplane/data/ATTRIBUTION.md for source and licence):

* ``perf_kernels.csv``: one forward pass of a transformer *body* without attention (all layers: norms, QKV and
  output projections, rotary embedding, gated MLP, residual add, plus the embedding gather), as the sum of
  Vidur's per-operation median CUDA times, by GPU, model, tensor-parallel degree and token count;
* ``perf_collectives.csv``: all-reduce medians by GPU box, number of GPUs (all in one node) and message size.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

OUT = Path(__file__).resolve().parent.parent / "controlplane" / "data"
GPUS = {"a100": "A100-80GB", "h100": "H100", "a40": "A40"}
MODELS = {"Llama-2-7b-hf": "@ref/meta/llama-2-7b", "Llama-2-70b-hf": "@ref/meta/llama-2-70b",
          "Meta-Llama-3-8B": "@cf/meta/llama-3.1-8b-instruct"}  # Llama 3.1 8B has Llama 3 8B's architecture
LAYERS = {"Llama-2-7b-hf": 32, "Llama-2-70b-hf": 80, "Meta-Llama-3-8B": 32}
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
# Per layer: two norms and two residual adds (Vidur times one of each kind per call), the rest once.
PER_LAYER = {"input_layernorm": 1, "post_attention_layernorm": 1, "attn_pre_proj": 1, "attn_rope": 1,
             "attn_post_proj": 1, "mlp_up_proj": 1, "mlp_act": 1, "mlp_down_proj": 1, "add": 2}
# 1 MiB .. 64 MiB messages. Below 1 MiB the profiled medians scatter between 7 and 65 us with no trend in size
# (launch and timer noise larger than the transfer), so they cannot pin anything down.
SIZES = 2 ** np.arange(20, 27)
VIDUR = "https://github.com/microsoft/vidur/tree/7d47513/data/profiling"


def kernels(src: Path) -> pd.DataFrame:
    rows = []
    for gpu_dir, gpu in GPUS.items():
        for model_dir, model in MODELS.items():
            path = src / "compute" / gpu_dir / "meta-llama" / model_dir / "mlp.csv"
            if not path.exists():
                continue
            d = pd.read_csv(path)
            for (tp, tokens), g in d.groupby(["num_tensor_parallel_workers", "num_tokens"]):
                if tokens not in TOKENS:
                    continue
                layer = sum(n * g[f"time_stats.{op}.median"].median() for op, n in PER_LAYER.items())
                ms = LAYERS[model_dir] * layer + g["time_stats.emb.median"].median()
                rows.append((model, gpu, int(tp), int(tokens), round(float(ms), 4),
                             f"{VIDUR}/compute/{gpu_dir}/meta-llama/{model_dir}/mlp.csv"))
    return pd.DataFrame(rows, columns=["model", "gpu", "tp", "tokens", "measured_ms", "source"])


def collectives(src: Path) -> pd.DataFrame:
    rows = []
    for box, gpu in (("a100_dgx", "A100-80GB"), ("h100_dgx", "H100")):
        d = pd.read_csv(src / "network" / box / "all_reduce.csv")
        d = d[(d.devices_per_node == d.num_workers) & (d.num_workers <= 8)]
        for (workers, size), g in d.groupby(["num_workers", "size"]):
            if size in SIZES:
                rows.append((gpu, int(workers), int(size), round(float(g["time_stats.all_reduce.median"].median()), 4),
                             f"{VIDUR}/network/{box}/all_reduce.csv"))
    return pd.DataFrame(rows, columns=["gpu", "workers", "bytes", "measured_ms", "source"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", type=Path, required=True, help="Vidur's data/profiling folder")
    args = ap.parse_args()
    k, c = kernels(args.src), collectives(args.src)
    k.to_csv(OUT / "perf_kernels.csv", index=False)
    c.to_csv(OUT / "perf_collectives.csv", index=False)
    print(f"{len(k)} kernel rows, {len(c)} collective rows")


if __name__ == "__main__":
    main()
