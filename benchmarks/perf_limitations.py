"""The service-time model's known limitations, in figures (docs/perf-model.md, "Known limitations", quotes them).

Ada's GEMM efficiency (measured by four L40S FP8 rows only, pooled towards the other architectures') against
Hopper's on an L4 Llama-3.1-8B prefill; ResNet-50's
share of the dense peak on an L4 (image models: no token ramp, no activation traffic); the in-sample all-reduce
error by board. Computed from the shipped constants, nothing timed.

Run: PYTHONPATH=. python benchmarks/perf_limitations.py. The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json

LLAMA = "@cf/meta/llama-3.1-8b-instruct"
RESNET = "@cf/microsoft/resnet-50"


def figures() -> dict:
    import numpy as np

    from controlplane.catalog import default_catalog
    from controlplane.perf import Roofline
    from controlplane.perf_params import RooflineParams
    from controlplane.perf_rows import load_rows
    from topology.world import Topology

    params, cat, topo = RooflineParams.load(), default_catalog(), Topology.load()
    shipped = Roofline.from_topology(topo)
    eff = dict(params.gemm_efficiency)
    at_hopper = Roofline.from_topology(topo, gemm_efficiency={**eff, "ada": eff["hopper"], "L40S": eff["hopper"]})
    llama, resnet = cat[LLAMA], cat[RESNET]
    l4 = shipped.gpu("L4")
    image = shipped.prefill_breakdown(resnet, "L4", [1] * 256)
    flops = 256 * resnet.gflops_per_unit * 1e9
    rows = load_rows()
    rows = rows.subset((rows.table.kind == "collective").to_numpy())
    err = rows.predict(params) / rows.table.measured_ms.to_numpy() - 1.0
    boards = {g: {"rows": int(m.sum()), "least": round(float(err[m].min()), 3), "most": round(float(err[m].max()), 3)}
              for g in sorted(set(rows.table.gpu)) for m in [(rows.table.gpu == g).to_numpy()]}
    return {"ada_gemm_efficiency": round(eff["ada"], 4), "hopper_gemm_efficiency": round(eff["hopper"], 4),
            "l4_llama8b_prefill_2048_ms": {"shipped": round(shipped.prefill_ms(llama, "L4", 2048), 1),
                                           "at_hopper": round(at_hopper.prefill_ms(llama, "L4", 2048), 1)},
            "resnet50_l4_batch256": {"ms": round(image.total_ms, 2),
                                     "compute_share_of_peak": round(flops / (image.compute_ms / 1e3) / l4.peak(
                                         "flops16"), 3),
                                     "end_to_end_share_of_peak": round(flops / (image.total_ms / 1e3) / l4.peak(
                                         "flops16"), 3)},
            "allreduce_in_sample_mape": round(float(np.mean(np.abs(err))), 3),
            "allreduce_error_by_board": boards}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.parse_args()
    out = figures()
    print(f"L4 Llama-3.1-8B 2,048-token prefill: {out['l4_llama8b_prefill_2048_ms']['shipped']} ms (Ada "
          f"{out['ada_gemm_efficiency']}), {out['l4_llama8b_prefill_2048_ms']['at_hopper']} ms at Hopper's "
          f"{out['hopper_gemm_efficiency']}")
    print(f"ResNet-50 on L4, batch 256: compute at {out['resnet50_l4_batch256']['compute_share_of_peak']:.0%} of the "
          f"dense peak, {out['resnet50_l4_batch256']['end_to_end_share_of_peak']:.0%} end to end")
    print(f"all-reduce in sample: MAPE {out['allreduce_in_sample_mape']:.1%}; predicted/measured - 1 by board: "
          + ", ".join(f"{g} {b['least']:+.0%} to {b['most']:+.0%}" for g, b in out["allreduce_error_by_board"].items()))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
