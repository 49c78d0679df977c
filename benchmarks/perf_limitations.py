"""The service-time model's known limitations, in figures (docs/perf-model.md, "Known limitations", quotes them).

Ada's GEMM efficiency (measured by four L40S FP8 rows only, pooled towards the other architectures') against
Hopper's on an L4 Llama-3.1-8B prefill; ResNet-50's
share of the dense peak on an L4 (image models: no token ramp, no activation traffic); the in-sample all-reduce
error by board; and what an image-server model fitted on the MLPerf ResNet-50 external check
(``perf_holdout_mlperf_images.csv``) would reach with one GPU type held out at a time (a fixed cost per pass and one
share of the 8-bit peak, with or without activation traffic; measured, not shipped). Computed from the shipped
constants and tables, nothing timed.

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
    """Held-out-GPU MAPE of two image-pass models fitted on the MLPerf rows (log errors, least squares): ``fixed +
    batch x FLOPs / (share x 8-bit peak)``, and the same with ``batch x activation bytes / bandwidth`` combined with
    the compute term as the roofline combines compute and memory."""
    import numpy as np
    from scipy.optimize import least_squares

    from controlplane.catalog import default_catalog
    from controlplane.perf import Roofline
    from controlplane.perf_params import RooflineParams
    from controlplane.perf_rows import HOLDOUT_IMAGE_FILE, load_reference
    from topology.world import Topology

    t, params = load_reference(HOLDOUT_IMAGE_FILE), RooflineParams.load()
    model = Roofline.from_topology(Topology.load())
    flops = default_catalog()[RESNET].gflops_per_unit * 1e9
    gpus = [model.gpu(g) for g in t.gpu]
    peak = np.array([g.peak("flops8") for g in gpus])
    bw = np.array([g.mem_bw * params.memory_efficiency(g) for g in gpus])
    batch, measured = t.batch.to_numpy(dtype=float), t.measured_ms.to_numpy() / 1e3
    k = params.overlap_exponent

    def predict(x, traffic: bool) -> np.ndarray:
        compute = batch * flops / (peak * x[1])
        if not traffic:
            return x[0] / 1e3 + compute
        memory = batch * RESNET50_ACTIVATION_BYTES / bw
        return x[0] / 1e3 + (compute ** k + memory ** k) ** (1.0 / k)

    def fitted(mask, traffic):
        return least_squares(lambda x: np.log(predict(x, traffic)[mask] / measured[mask]), [0.3, 0.5],
                             bounds=([0.0, 0.05], [5.0, 1.0])).x

    out = {}
    for traffic in (False, True):
        errors = np.empty(len(t))
        for g in sorted(set(t.gpu)):
            held = (t.gpu == g).to_numpy()
            errors[held] = predict(fitted(~held, traffic), traffic)[held] / measured[held] - 1.0
        every = fitted(np.ones(len(t), bool), traffic)
        out["fixed_share_activations" if traffic else "fixed_share"] = {
            "held_out_gpu_mape": round(float(np.mean(np.abs(errors))), 3),
            "held_out_gpu_error": {f"{g} batch {b}": round(float(e), 3) for g, b, e in zip(t.gpu, t.batch, errors,
                                                                                         strict=True)},
            "fitted_on_all": {"fixed_ms": round(float(every[0]), 3), "share_of_8bit_peak": round(float(every[1]), 3),
                              "in_sample_mape": round(float(np.mean(np.abs(predict(every, traffic) / measured - 1))),
                                                      3)}}
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
        print(f"image pass, {name}: held-out-GPU MAPE {c['held_out_gpu_mape']:.1%}; on all rows "
              f"{c['fitted_on_all']['fixed_ms']} ms + {c['fitted_on_all']['share_of_8bit_peak']:.0%} of the 8-bit "
              f"peak, {c['fitted_on_all']['in_sample_mape']:.1%} in sample")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
