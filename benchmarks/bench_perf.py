"""Benchmark: roofline calibration (fit time and in-sample errors), service-time evaluation speed, and the time of
``edgepop validate``'s report (every fidelity table, cross-validated: ``validate_report_s``).

Run: python benchmarks/bench_perf.py [--calls N]. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from edgepop.argtypes import json_line, positive_int
from edgepop.rng import seed_arg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=positive_int, default=20_000, help="roofline evaluations to time")
    ap.add_argument("--seed", type=seed_arg, default=0)
    args = ap.parse_args()

    from controlplane import perf_calibration
    from controlplane.catalog import default_catalog
    from controlplane.perf import Roofline
    from topology import Topology

    t0 = time.perf_counter()
    report = perf_calibration.run(write=False)
    fit_s = time.perf_counter() - t0

    model = Roofline.from_topology(Topology.load())
    specs = [s for s in default_catalog() if s.generative]
    gpus = ["H100", "A100-80GB", "L40S", "L4"]
    rng = np.random.default_rng(args.seed)
    picks = rng.integers(0, len(specs), args.calls)
    gpu_picks = rng.integers(0, len(gpus), args.calls)
    tokens = rng.integers(1, 8192, args.calls)
    batches = rng.integers(1, 64, args.calls)
    t1 = time.perf_counter()
    for i in range(args.calls):
        spec, gpu = specs[picks[i]], gpus[gpu_picks[i]]
        tp = spec.tensor_parallel
        if i % 2:
            model.decode_step_ms(spec, gpu, int(batches[i]), float(tokens[i]), tp=tp)
        else:
            model.prefill_ms(spec, gpu, int(tokens[i]), tp=tp)
    eval_s = time.perf_counter() - t1
    # The cross-validated errors are `edgepop validate`'s; its report (service time refitted without each model,
    # GPU type and tp degree; WAN without each data set and continent) is timed as a whole.
    from controlplane.validation import fidelity_report

    t2 = time.perf_counter()
    fidelity_report()
    validate_s = time.perf_counter() - t2
    out = {"reference_rows": report["rows"], "calibration_s": round(fit_s, 2), "validate_report_s": round(validate_s, 2),
           **{f"mape_in_sample_{k}": v for k, v in report["in_sample_mape"].items()},
           "roofline_calls_per_s": round(args.calls / eval_s)}
    print(json_line(out))


if __name__ == "__main__":
    main()
