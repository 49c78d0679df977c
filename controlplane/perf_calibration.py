"""Fit the roofline's constants to published measurements.

Four kinds of reference data (``controlplane/data/``, every row with its source; see ``ATTRIBUTION.md``):

* ``perf_reference.csv``: end-to-end prefill (time to first token) and decode (time per output token) figures
  of serving engines (TensorRT-LLM, LMDeploy, gpt-fast, Splitwise, NVIDIA NIM, vLLM);
* ``perf_kernels.csv``: Vidur's operator profiles summed into one pass of the transformer body (GEMMs and
  element-wise kernels, no attention, no all-reduce, no engine overhead) on A100, H100 and A40, TP 1-8;
* ``perf_collectives.csv``: Vidur's NVLink all-reduce timings on DGX A100 and DGX H100 by GPUs and bytes;
* ``perf_reference_mlperf_images.csv``: MLPerf Inference ResNet-50 results (NVIDIA's TensorRT harness) on A100, H100
  and H200, which fit the image server's profile (:func:`fit_image_server`) once the shared constants are fitted.

The hardware constants of :class:`controlplane.perf_params.RooflineParams` are shared by every row; each serving engine
adds its own prefill and step overheads (kernel and collective rows have none). The fit minimises squared log
errors with every source (engine, kernels, collectives) weighted equally. A constant that no training row can
identify (an architecture, memory or link kind absent from the rows) is not fitted: it takes the median of its
fitted siblings, which is what a prediction for an unseen GPU kind must rely on. A GEMM efficiency counts as
identified only by passes with :data:`COMPUTE_MIN_ROWS` GEMM rows or more (memory-bound passes do not tell it).

Predictions inside the fit are vectorised (:class:`controlplane.perf_rows.Rows`); ``Rows.check`` compares them with
:meth:`controlplane.perf.Roofline._time` so the two never drift apart. ``python -m controlplane.perf_calibration``
refits on every row and writes ``controlplane/data/perf_params.json`` (in seconds); ``controlplane.perf_validation``
holds the leave-one-group-out cross-validation that ``edgepop validate`` reports.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from controlplane.perf import IMAGE_ENGINE
from controlplane.perf_params import PARAMS_FILE, EngineProfile, RooflineParams
from controlplane.perf_rows import (  # noqa: F401 (the tables and the rows are part of this module's interface)
    COLLECTIVES_FILE,
    FIRST_TOKEN_DECODE,
    FUSED_ATTENTION_EFFICIENCY,
    KERNELS_FILE,
    REFERENCE_FILE,
    REFERENCE_IMAGE_FILE,
    Rows,
    load_reference,
    load_rows,
    reference_gpus,
    reference_specs,
)

# Engines kept out of the ``default`` profile, with the evidence (their fitted profile shows it).
LEGACY_ENGINES = {"splitwise-2023": "2023 research stack: decode bound by host overhead (does not speed up with "
                                    "TP), and every all-reduce waits for the last worker to reach it (a constant "
                                    "overhead left decode 11-18% too slow at tp 2 and 10% too fast at tp 8, on "
                                    "A100 and H100 alike: barrier_jitter_us); prefill super-linear in the pass's "
                                    "total tokens, not per prompt (8 x 512 costs what 1 x 4,096 does) and not "
                                    "shrinking with TP: a dense score matrix through memory (dense_attention_bytes)"}
# (name, lower, upper) of the shared constants; "a.b" is key b of dict constant a.
SHARED = [("gemm_half_tokens", 1.0, 2048.0), ("fp8_gemm_factor", 0.3, 1.0), ("weight_only_bw_efficiency", 0.3, 1.0),
          ("elementwise_efficiency", 0.05, 1.0), ("layer_floor_us", 0.0, 200.0), ("overlap_exponent", 2.0, 16.0),
          ("allreduce_ll_latency_us", 1.0, 200.0), ("allreduce_latency_us.nvlink", 1.0, 200.0), ("allreduce_latency_us.pcie", 1.0, 200.0)]
# Efficiencies by GPU type, pooled towards their kind's value: (constant, attribute of the board that names the
# kind, bounds). A board's value may leave its kind's by about PRIOR_SPREAD (relative) before it costs as much
# as a 10% miss on an engine's rows: boards of one kind are alike, and one with few rows must not run off.
BY_BOARD = [("gemm_efficiency", "arch", 0.15, 0.95), ("bw_efficiency", "memory_kind", 0.4, 0.98),
            ("link_efficiency", "link_kind", 0.1, 1.0)]
PRIOR_SPREAD = 0.1
# Architectures' GEMM efficiencies are pulled the same way towards their common (geometric) mean: the tensor cores
# of each generation reach a similar share of their dense peak under cuBLAS-class kernels, and an architecture
# seen in a few rows (Ada: four L40S FP8 first-token latencies) must not run to a bound and carry that value to
# boards no row measured (the L4, the L40S at 16 bit).
ARCH_SPREAD = 0.1
# A board's (and its architecture's) GEMM efficiency is fitted only on passes with at least this many GEMM rows
# (prefills, large batches, kernel passes): below it a pass is bound by streaming the weights and hardly depends
# on the tensor cores, so a board measured only there (H200: small-batch decode) would let its architecture's
# efficiency drift to a bound; it takes its architecture's value instead, or the median of the others.
COMPUTE_MIN_ROWS = 128
ARCH_KEYS = ("ampere", "hopper", "ada", "turing")
OVERHEAD_BOUNDS = (0.0, 60.0)
# Spread of the workers' arrival at an all-reduce (microseconds): a host-launched layer's kernels take tens to
# hundreds of microseconds to issue.
JITTER_BOUNDS = (0.0, 1000.0)
# Bytes per score element of a materialised attention matrix: written and read back at most a few times in fp32.
DENSE_ATTENTION_BOUNDS = (0.0, 64.0)
# Dense whole-pass attention is fitted only for legacy engines with passes this long (below it is a few % of a
# pass, which no row can tell from the linear terms); modern engines use fused per-sequence kernels.
DENSE_MIN_TOKENS = 4096
ENGINE_BOUNDS = {"prefill_overhead_ms": OVERHEAD_BOUNDS, "step_overhead_ms": OVERHEAD_BOUNDS,
                 "barrier_jitter_us": JITTER_BOUNDS,
                 "dense_attention_bytes": DENSE_ATTENTION_BOUNDS}
ELEMENTWISE_BOUNDS = (0.0, 1.0)  # fusion can only remove element-wise traffic, never add it




def _get(params: RooflineParams, name: str) -> float:
    base, _, key = name.partition(".")
    value = getattr(params, base)
    return float(value[key]) if key else float(value)


def _start(params: RooflineParams, rows: Rows, name: str) -> float:
    """Starting value of constant ``name``: a board's efficiency starts from what ``params`` says for it."""
    base, _, key = name.partition(".")
    board = next((g for g in rows.gpus if g.name == key), None)
    if board is not None:
        return {"gemm_efficiency": params.compute_efficiency, "bw_efficiency": params.memory_efficiency,
                "link_efficiency": params.link_efficiency_of}[base](board)
    value = getattr(params, base)
    return float(value.get(key, 0.7)) if isinstance(value, dict) else float(value)


def _set_all(params: RooflineParams, names, values) -> RooflineParams:
    """``params`` with each constant ``names[i]`` (``base`` or ``base.key``) at ``values[i]``: one new object for
    them all (the fit unpacks every trial point; a copy per constant was a quarter of its time)."""
    changes: dict = {}
    for name, value in zip(names, values, strict=True):
        base, _, key = name.partition(".")
        if key:
            if base not in changes:
                current = getattr(params, base)
                changes[base] = dict(current) if isinstance(current, dict) else {}
            changes[base][key] = float(value)
        else:
            changes[base] = float(value)
    return replace(params, **changes)


def constants(rows: Rows) -> list[tuple[str, float, float]]:
    """The constants some training row depends on, with bounds (the others cannot be fitted on these rows)."""
    physical = rows.kind != "collective"
    comm = (rows.allreduces > 0) | (rows.kind == "collective")
    compute = physical & (rows.gemm_rows >= COMPUTE_MIN_ROWS)
    out = []
    for base, attr, lo, hi in BY_BOARD:
        uses = {"link_efficiency": comm, "gemm_efficiency": compute}.get(base, physical)
        boards = {g.name: g for g, u in zip(rows.gpus, uses, strict=True) if u}
        kinds = sorted({getattr(g, attr) for g in boards.values()})
        out += [(f"{base}.{k}", lo, hi) for k in kinds] + [(f"{base}.{b}", lo, hi) for b in sorted(boards)]
    for name, lo, hi in SHARED:
        base, _, key = name.partition(".")
        if base == "allreduce_latency_us":
            ok = comm[rows.link_kind == key].any()
        elif base == "allreduce_ll_latency_us":
            ok = comm.any()
        elif base == "weight_only_bw_efficiency":
            ok = (physical & rows.weight_only).any()
        elif base == "fp8_gemm_factor":
            ok = (physical & rows.fp8).any()
        else:
            ok = physical.any()
        if ok:
            out.append((name, lo, hi))
    return out


def prior_pairs(rows: Rows, names: list[str]) -> list[tuple[int, int]]:
    """(board constant, kind constant) index pairs whose log ratio the fit pulls towards zero."""
    index = {n: i for i, n in enumerate(names)}
    boards = {g.name: g for g in rows.gpus}
    pairs = []
    for base, attr, _, _ in BY_BOARD:
        for name, board in boards.items():
            kind = f"{base}.{getattr(board, attr)}"
            if f"{base}.{name}" in index and kind in index:
                pairs.append((index[f"{base}.{name}"], index[kind]))
    return pairs


def _median(values: list[float]) -> float:
    """``float(np.median(values))`` bit for bit (the middle value, or the mean of the two middle ones), without
    numpy's overhead on a handful of numbers: the fit takes a few medians at every trial point."""
    s = sorted(float(v) for v in values)
    half = len(s) // 2
    return s[half] if len(s) % 2 else (s[half - 1] + s[half]) / 2


def fallbacks(params: RooflineParams, fitted: list[str]) -> RooflineParams:
    """Values for the kinds no row measured: the median of the fitted kinds (an architecture's GEMM efficiency,
    a memory or link kind's efficiency, a link kind's latency)."""
    tables = {}
    for base in ("gemm_efficiency", "bw_efficiency", "link_efficiency", "allreduce_latency_us"):
        table = tables[base] = dict(getattr(params, base))
        keys = {"gemm_efficiency": ARCH_KEYS, "bw_efficiency": ("hbm", "gddr")}.get(base, ("nvlink", "pcie"))
        known = [table[k] for k in keys if f"{base}.{k}" in fitted]
        missing = [k for k in keys if f"{base}.{k}" not in fitted]
        if known and missing:
            middle = _median(known)
            for k in missing:
                table[k] = middle
    return replace(params, **tables)


def engine_unknowns(rows: Rows) -> list[tuple[str, str]]:
    """(engine, field) pairs the training rows identify: an overhead needs end-to-end rows of its phase; a legacy
    engine's barrier jitter, rows at two tensor-parallel degrees or more (modern engines launch captured or
    lockstep kernels and pay none)."""
    out = []
    e2e = rows.kind == "e2e"
    for engine in sorted(set(rows.engine[e2e])):
        mine = e2e & (rows.engine == engine)
        if (mine & rows.prefill).any():
            out.append((engine, "prefill_overhead_ms"))
        if (mine & ~rows.prefill).any():
            out.append((engine, "step_overhead_ms"))
        if engine in LEGACY_ENGINES and (mine & rows.prefill & (rows.gemm_rows >= DENSE_MIN_TOKENS)).any():
            out.append((engine, "dense_attention_bytes"))
        if engine in LEGACY_ENGINES and len(set(rows.tp[mine])) > 1:  # a wait growing with tp needs two sizes
            out.append((engine, "barrier_jitter_us"))
    return out


def with_engines(params: RooflineParams, fitted: dict[str, dict], elementwise_factor: float = 1.0) -> RooflineParams:
    """Complete every engine profile and add ``default``: the median of the non-legacy engines' fitted values.

    Every serving engine shares one ``elementwise_factor`` (how much of the unfused element-wise traffic remains
    after fusion): no single engine's rows pin it down.
    """
    modern = [f for name, f in fitted.items() if name not in LEGACY_ENGINES]
    default = {name: _median([f[name] for f in modern if name in f] or [getattr(EngineProfile(), name)])
               for name in ("prefill_overhead_ms", "step_overhead_ms")}
    default["attn_efficiency"] = FUSED_ATTENTION_EFFICIENCY
    default["elementwise_factor"] = float(elementwise_factor)
    engines = {"default": EngineProfile(**default, description="modern optimised engine: median of the fitted "
                                        "non-legacy engine profiles; what estimates use")}
    for name, f in sorted(fitted.items()):
        note = LEGACY_ENGINES.get(name, "fitted on this engine's reference points")
        if name in FIRST_TOKEN_DECODE:
            note = f"{note}; {FIRST_TOKEN_DECODE[name]}"
        engines[name] = EngineProfile(**{**default, **f}, first_token_decode=name in FIRST_TOKEN_DECODE,
                                      description=note)
    return replace(params, engines=engines)


def fit(rows: Rows, start: RooflineParams | None = None) -> RooflineParams:
    """Least-squares fit of the identifiable shared constants and the engines' overheads on ``rows``."""
    params = start or RooflineParams()
    found = constants(rows)
    shared = [n for n, _, _ in found]
    bounds = {n: (lo, hi) for n, lo, hi in found}
    unknowns = engine_unknowns(rows)
    measured = np.log(rows.measured)
    counts = pd.Series(rows.engine).value_counts()
    weights = 1.0 / np.sqrt(counts[rows.engine].to_numpy(dtype=float))
    x0 = ([min(max(_start(params, rows, n), bounds[n][0]), bounds[n][1]) for n in shared] + [0.5]
          + [{"dense_attention_bytes": 4.0, "barrier_jitter_us": 20.0}.get(f, 2.0) for _, f in unknowns])
    lower = [bounds[n][0] for n in shared] + [ELEMENTWISE_BOUNDS[0]] + [ENGINE_BOUNDS[f][0] for _, f in unknowns]
    upper = [bounds[n][1] for n in shared] + [ELEMENTWISE_BOUNDS[1]] + [ENGINE_BOUNDS[f][1] for _, f in unknowns]
    n = len(shared)

    def unpack(x) -> RooflineParams:
        out = _set_all(params, shared, x[:n])
        fitted: dict[str, dict] = {}
        for (engine, name), v in zip(unknowns, x[n + 1:], strict=True):
            fitted.setdefault(engine, {})[name] = float(v)
        return with_engines(fallbacks(out, shared), fitted, x[n])

    pairs = prior_pairs(rows, shared)
    board, kind = np.array([a for a, _ in pairs], dtype=int), np.array([b for _, b in pairs], dtype=int)
    prior_weight = 0.1 / PRIOR_SPREAD  # a PRIOR_SPREAD departure weighs as a 10% miss on one engine's rows

    archs = np.array([i for i, name in enumerate(shared) if name in {f"gemm_efficiency.{a}" for a in ARCH_KEYS}],
                     dtype=int)
    arch_weight = 0.1 / ARCH_SPREAD if len(archs) > 1 else 0.0

    def residuals(x):
        fit_part = weights * (np.log(rows.predict(unpack(x))) - measured)
        log_arch = np.log(x[archs])
        return np.concatenate([fit_part, prior_weight * np.log(x[board] / x[kind]),
                               arch_weight * (log_arch - log_arch.mean())])

    result = least_squares(residuals, np.array(x0), bounds=(lower, upper), x_scale="jac")
    return unpack(result.x)


IMAGE_DESCRIPTION = ("image server (TensorRT-class, convolution nets): its fixed cost per pass and one share of the "
                     "dense peak of every board, fitted on MLPerf ResNet-50 results of datacenter boards "
                     "(perf_reference_mlperf_images.csv); the edge-class L4 and T4 are the check "
                     "(perf_holdout_mlperf_images.csv)")


def fit_image_server(params: RooflineParams, rows: Rows | None = None) -> RooflineParams:
    """``params`` with the image server's profile (:data:`controlplane.perf.IMAGE_ENGINE`): a fixed cost per pass
    and one share of the dense peak for every board (:attr:`EngineProfile.gemm_efficiency`), fitted by least squares
    on log errors on ``rows`` (default: ``perf_reference_mlperf_images.csv``), the other terms (weights streamed
    at the boards' fitted bandwidth, the overlap of compute and memory) the shared constants'. Both are identified:
    the batch-1 and batch-8 rows mostly measure the fixed cost, the large batches the share of the peak."""
    rows = rows or load_rows(("e2e",), reference=REFERENCE_IMAGE_FILE)
    measured = np.log(rows.measured)

    def with_profile(x) -> RooflineParams:
        prof = EngineProfile(prefill_overhead_ms=float(x[0]), step_overhead_ms=float(x[0]),
                             attn_efficiency=FUSED_ATTENTION_EFFICIENCY, gemm_efficiency=float(x[1]),
                             description=IMAGE_DESCRIPTION)
        return replace(params, engines={**params.engines, IMAGE_ENGINE: prof})

    result = least_squares(lambda x: np.log(rows.predict(with_profile(x), IMAGE_ENGINE)) - measured, [0.5, 0.5],
                           bounds=([OVERHEAD_BOUNDS[0], 0.05], [OVERHEAD_BOUNDS[1], 1.0]), x_scale="jac")
    return with_profile(result.x)


def mape(pred: np.ndarray, measured: np.ndarray) -> float | None:
    """Mean absolute percentage error of ``pred`` against ``measured``, as a fraction (None for no rows)."""
    return round(float(np.mean(np.abs(pred - measured) / measured)), 4) if len(measured) else None


def run(write: bool = True, out: Path = PARAMS_FILE) -> dict:
    """Fit on every reference row; with ``write``, store the constants and their in-sample errors (the
    cross-validated errors are ``edgepop validate``'s, see ``controlplane.perf_validation``)."""
    rows = load_rows()
    params = fit(rows)
    pred = rows.predict(params)
    in_sample = {kind: mape(pred[rows.table.phase == kind], rows.measured[rows.table.phase == kind])
                 for kind in ("prefill", "decode", "kernel", "allreduce")}
    images = load_rows(("e2e",), reference=REFERENCE_IMAGE_FILE)
    params = fit_image_server(params, images)
    in_sample["image"] = mape(images.predict(params, IMAGE_ENGINE), images.measured)
    report = {"rows": int(len(rows.measured)), "image_rows": int(len(images.measured)), "in_sample_mape": in_sample,
              "cross_validation": "edgepop validate (docs/fidelity-models.md)"}
    if write:
        doc = {"params": params.to_dict(), "fitted_on": "every row of perf_reference.csv, perf_kernels.csv and "
               "perf_collectives.csv; the image-server profile on perf_reference_mlperf_images.csv",
               "fit_constants": [n for n, _, _ in constants(rows)], "metrics": report,
               "refit": "python -m controlplane.perf_calibration"}
        out.write_text(json.dumps(doc, indent=2) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    """``python -m controlplane.perf_calibration``: refit the constants, print the fit as JSON and write
    perf_params.json (``--check``: fit and report only)."""
    ap = argparse.ArgumentParser(prog="python -m controlplane.perf_calibration", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="fit and report only; do not write perf_params.json")
    args = ap.parse_args(argv)
    print(json.dumps(run(write=not args.check), indent=2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
