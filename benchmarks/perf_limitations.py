"""The service-time model's known limitations, in figures (docs/perf-model.md, "Known limitations", quotes them).

Ada's GEMM efficiency (measured by four L40S FP8 rows only, pooled towards the other architectures') against
Hopper's on an L4 Llama-3.1-8B prefill; ResNet-50's
share of the dense peak on an L4 (image models: no token ramp, no activation traffic); the in-sample all-reduce
error by board; and two other forms of the image server's model (a fixed cost per pass and one share of the 8-bit
peak without the weights streamed, and with activation traffic added), fitted and checked as the shipped one is.
Computed from the shipped constants and tables, nothing timed.

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


# ResNet-50's activations at INT8: about 11 million per 224x224 image (the outputs of its convolutions and
# pools), each written once and read back once.
RESNET50_ACTIVATION_BYTES = 22e6


def image_pass_candidates() -> dict:
    """Two simpler or richer forms of the image server's model, fitted as the shipped profile is (log errors, least
    squares, on ``perf_reference_mlperf_images.csv``) and scored on the check the shipped one is scored on (the L4 and
    T4 rows of ``perf_holdout_mlperf_images.csv``): ``fixed + batch x FLOPs / (share x 8-bit peak)`` alone (no
    weights streamed), and the same with ``batch x activation bytes / bandwidth`` combined with the compute term as
    the roofline combines compute and memory."""
    import numpy as np
    from scipy.optimize import least_squares

    from controlplane.catalog import default_catalog
    from controlplane.perf import Roofline
    from controlplane.perf_params import RooflineParams
    from controlplane.perf_rows import HOLDOUT_IMAGE_FILE, REFERENCE_IMAGE_FILE, load_reference
    from topology.world import Topology

    fit_rows, check_rows = load_reference(REFERENCE_IMAGE_FILE), load_reference(HOLDOUT_IMAGE_FILE)
    params = RooflineParams.load()
    model = Roofline.from_topology(Topology.load())
    flops = default_catalog()[RESNET].gflops_per_unit * 1e9
    k = params.overlap_exponent

    def arrays(t):
        gpus = [model.gpu(g) for g in t.gpu]
        return (np.array([g.peak("flops8") for g in gpus]), np.array([g.mem_bw * params.memory_efficiency(g)
                                                                      for g in gpus]),
                t.batch.to_numpy(dtype=float), t.measured_ms.to_numpy() / 1e3)

    def predict(x, t, traffic: bool) -> np.ndarray:
        peak, bw, batch, _ = arrays(t)
        compute = batch * flops / (peak * x[1])
        if not traffic:
            return x[0] / 1e3 + compute
        memory = batch * RESNET50_ACTIVATION_BYTES / bw
        return x[0] / 1e3 + (compute ** k + memory ** k) ** (1.0 / k)

    out = {}
    for traffic in (False, True):
        measured = arrays(fit_rows)[3]
        x = least_squares(lambda x: np.log(predict(x, fit_rows, traffic) / measured), [0.3, 0.5],  # noqa: B023
                          bounds=([0.0, 0.05], [5.0, 1.0])).x
        check = predict(x, check_rows, traffic) / arrays(check_rows)[3] - 1.0
        out["fixed_share_activations" if traffic else "fixed_share"] = {
            "check_mape": round(float(np.mean(np.abs(check))), 3),
            "check_error": {f"{g} batch {b}": round(float(e), 3)
                            for g, b, e in zip(check_rows.gpu, check_rows.batch, check, strict=True)},
            "fixed_ms": round(float(x[0]), 3), "share_of_8bit_peak": round(float(x[1]), 3),
            "in_sample_mape": round(float(np.mean(np.abs(predict(x, fit_rows, traffic) / measured - 1))), 3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.parse_args()
    out = figures()
    out["image_pass_candidates"] = image_pass_candidates()
    print(f"L4 Llama-3.1-8B 2,048-token prefill: {out['l4_llama8b_prefill_2048_ms']['shipped']} ms (Ada "
          f"{out['ada_gemm_efficiency']}), {out['l4_llama8b_prefill_2048_ms']['at_hopper']} ms at Hopper's "
          f"{out['hopper_gemm_efficiency']}")
    print(f"ResNet-50 on L4, batch 256: compute at {out['resnet50_l4_batch256']['compute_share_of_peak']:.0%} of the "
          f"dense peak, {out['resnet50_l4_batch256']['end_to_end_share_of_peak']:.0%} end to end")
    print(f"all-reduce in sample: MAPE {out['allreduce_in_sample_mape']:.1%}; predicted/measured - 1 by board: "
          + ", ".join(f"{g} {b['least']:+.0%} to {b['most']:+.0%}" for g, b in out["allreduce_error_by_board"].items()))
    for name, c in out["image_pass_candidates"].items():
        print(f"image pass, {name}: L4/T4 check MAPE {c['check_mape']:.1%}; fitted {c['fixed_ms']} ms + "
              f"{c['share_of_8bit_peak']:.0%} of the 8-bit peak, {c['in_sample_mape']:.1%} in sample")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
