"""What the calibrated roofline's reference rows cover, and which dimensions of an estimate lie outside it.

The roofline computes a figure for any GPU, tensor-parallel degree, precision and batch; its constants were fitted
only on the end-to-end rows of ``controlplane/data/perf_reference.csv`` (and the kernel and all-reduce tables), the
image server's profile on ``perf_reference_mlperf_images.csv``. An estimate outside them is an extrapolation:
:func:`estimate_warnings` names each dimension and the covered range, derived from the shipped tables (nothing here
changes a number).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from controlplane import perf_arch

NO_BF16_ARCHS = frozenset({"turing"})  # no BF16 tensor cores (T4: FP16 only)


@dataclass(frozen=True)
class Coverage:
    """Ranges the reference rows span."""

    gpus: frozenset  # GPU types with any measured row (end-to-end, kernel or all-reduce)
    tp_by_link: dict  # link kind -> tensor-parallel degrees of the end-to-end rows
    executions: frozenset  # (precision, weight_only) as the rows executed
    ranges: dict  # (phase, column) -> (least, most) of the end-to-end rows
    units: frozenset  # the request units (token, image, audio-minute) of the models with rows


def _execution(precision: str, weight_only: bool) -> str:
    return f"{precision} {'weight-only' if weight_only else ('W8A8' if precision in ('fp8', 'int8') else '')}".strip()


@lru_cache(maxsize=1)
def coverage() -> Coverage:
    """The shipped reference tables' coverage (read once)."""
    import pandas as pd

    from controlplane.perf_rows import (
        COLLECTIVES_FILE,
        KERNELS_FILE,
        load_reference,
        reference_gpus,
        reference_specs,
    )

    table = load_reference()
    gpus, specs = reference_gpus(), reference_specs()
    measured = set(table.gpu)
    for path in (KERNELS_FILE, COLLECTIVES_FILE):
        measured |= set(pd.read_csv(path).gpu)
    tp_by_link: dict = {}
    executions = set()
    for r in table.itertuples():
        g = gpus[r.gpu]
        tp_by_link.setdefault(g.link_kind, set()).add(int(r.tp))
        base, forced = perf_arch.split_precision(r.precision)
        sch = perf_arch.scheme(base, g.has_fp8, forced)
        executions.add((sch.precision, sch.weight_only))
    ranges = {}
    for phase, rows in table.groupby("phase"):
        for col in ("batch", "prompt_tokens", "context"):
            ranges[(phase, col)] = (float(rows[col].min()), float(rows[col].max()))
    units = frozenset(specs[m].unit for m in set(table.model) if m in specs)
    return Coverage(frozenset(measured), {k: sorted(v) for k, v in tp_by_link.items()}, frozenset(executions),
                    ranges, units)


def _outside(what: str, value: float, span: tuple[float, float]) -> str | None:
    lo, hi = span
    if lo <= value <= hi:
        return None
    return f"{what} {value:g} is outside the fitted rows' {lo:g}-{hi:g}"


def estimate_warnings(spec, g, tp: int, sch: perf_arch.Scheme, batch: int, prompt: float,
                      context: float | None) -> list[str]:
    """One line per dimension of an estimate (model ``spec`` on ``tp`` GPUs ``g`` executed as ``sch``, ``batch``
    sequences, ``prompt`` units, decode ``context``) that the reference rows do not cover."""
    cov = coverage()
    out = []
    if spec.unit != "image" and g.name not in cov.gpus:  # (an image model's rows: image_lines)
        out.append(f"GPU {g.name}: no measured rows (measured: {', '.join(sorted(cov.gpus))}); its constants "
                   f"are those of its architecture ({g.arch}) and memory kind ({g.memory_kind})")
    if g.arch in NO_BF16_ARCHS and spec.precision == "bf16":
        out.append(f"bf16 on {g.name}: {g.arch} has no BF16 support; the figures are for its FP16 peak "
                   "(serve the model in fp16)")
    if spec.unit == "image":
        return out + image_lines(g.name, sch.precision)  # (the language-model rows' ranges below do not apply)
    if spec.unit not in cov.units:
        out.append(f"{spec.unit} models: no reference row measures one (rows cover: {', '.join(sorted(cov.units))})")
        return out  # (token-count ranges below do not apply)
    fitted = cov.tp_by_link.get(g.link_kind, [])
    if tp > 1 and not any(t > 1 for t in fitted):
        covered = "; ".join(f"{k}: tp {', '.join(map(str, v))}" for k, v in sorted(cov.tp_by_link.items()))
        out.append(f"tensor parallelism {tp} over {g.link_kind}: no fitted row runs tp > 1 over {g.link_kind} "
                   f"(fitted: {covered})")
    elif fitted and not min(fitted) <= tp <= max(fitted):
        out.append(f"tensor parallelism {tp} is outside the fitted rows' {min(fitted)}-{max(fitted)}")
    if (sch.precision, sch.weight_only) not in cov.executions:
        have = ", ".join(sorted(_execution(*e) for e in cov.executions))
        out.append(f"precision {_execution(sch.precision, sch.weight_only)}: no reference row runs it "
                   f"(rows run: {have})")
    checks = [("prefill prompt tokens", prompt, ("prefill", "prompt_tokens")),
              ("prefill batch", batch, ("prefill", "batch"))]
    if spec.generative and context is not None:
        checks += [("decode batch", batch, ("decode", "batch")), ("decode context", context, ("decode", "context"))]
    for what, value, key in checks:
        if key in cov.ranges and (line := _outside(what, value, cov.ranges[key])):
            out.append(line)
    return out


def image_lines(gpu: str, precision: str) -> list[str]:
    """An image model's estimate on ``gpu`` at ``precision``: what its profile was fitted on when the GPU or the
    precision is not among those rows, and the external check's error (:func:`image_check_line`)."""
    fitted = _image_reference()
    out = []
    if gpu not in fitted.gpu.values:
        out.append(f"GPU {gpu}: no fitted image row (the image server's profile is fitted on "
                   f"{', '.join(sorted(set(fitted.gpu)))}); its dense peak times the profile's share of it")
    if precision not in set(fitted.precision):
        out.append(f"precision {precision}: the fitted image rows run {', '.join(sorted(set(fitted.precision)))}; "
                   "the profile's share of the peak is taken to hold at every precision")
    return [*out, image_check_line()]


@lru_cache(maxsize=1)
def _image_reference():
    from controlplane.perf_rows import REFERENCE_IMAGE_FILE, load_reference

    return load_reference(REFERENCE_IMAGE_FILE)


@lru_cache(maxsize=1)
def image_check_line() -> str:
    """How far the image server's profile is from the external check of image passes (MLPerf ResNet-50 on the L4 and
    T4, never fitted), at small batches (1-8, where the fixed cost per pass dominates) and large ones: read from the
    check's rows."""
    import numpy as np

    from controlplane.perf import IMAGE_ENGINE
    from controlplane.perf_params import RooflineParams
    from controlplane.perf_rows import HOLDOUT_IMAGE_FILE, load_rows

    params = RooflineParams.load()
    if IMAGE_ENGINE not in params.engines:
        return f"image passes: the constants hold no {IMAGE_ENGINE!r} profile; the language-model default prices them"
    prof = params.engines[IMAGE_ENGINE]
    rows = load_rows(("e2e",), reference=HOLDOUT_IMAGE_FILE)
    err = rows.predict(params, IMAGE_ENGINE)
    err = err / rows.measured - 1.0
    small = rows.table.batch.to_numpy() <= 8
    return (f"image passes ({IMAGE_ENGINE} profile: {prof.prefill_overhead_ms:.2f} ms a pass + "
            f"{prof.gemm_efficiency:.0%} of the dense peak) against MLPerf ResNet-50 results on "
            f"{', '.join(sorted(set(rows.gpu_name)))} (INT8, {HOLDOUT_IMAGE_FILE.name}, never fitted): "
            f"MAPE {np.abs(err).mean():.1%} over {len(err)} rows; mean signed {err[small].mean():+.0%} at batch 1-8, "
            f"{err[~small].mean():+.0%} at larger batches (docs/perf-model.md)")
