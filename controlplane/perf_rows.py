"""The reference rows of the service-time fit as arrays (:class:`Rows`), and their loading.

``load_rows`` reads the three reference tables (``controlplane/data/``: end-to-end engine figures, Vidur's kernel
passes and all-reduce timings), counts every row's FLOPs and bytes (:mod:`controlplane.perf_arch`) and keeps
what the roofline needs per row, independent of the fitted constants. ``Rows.predict`` is the vectorised
:meth:`controlplane.perf.Roofline._time`; ``Rows.check`` compares the two. The fit itself is
:mod:`controlplane.perf_calibration`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from controlplane import perf_arch
from controlplane.catalog import Catalog, default_catalog
from controlplane.perf import (
    LL_BANDWIDTH_SHARE,
    EngineProfile,
    Roofline,
    RooflineParams,
    gpu_table,
    straggler_factor,
    with_precision,
)
from edgepop.errors import DataFileError

DATA = Path(__file__).parent / "data"
REFERENCE_FILE = DATA / "perf_reference.csv"
REFERENCE_MODELS = DATA / "perf_reference_models.toml"
REFERENCE_GPUS = DATA / "perf_reference_gpus.csv"
KERNELS_FILE = DATA / "perf_kernels.csv"
HOLDOUT_FILE = DATA / "perf_holdout.csv"  # end-to-end rows no fit ever sees: an external check of the shipped constants
HOLDOUT_NIM_FILE = DATA / "perf_holdout_nim.csv"  # a second one: another engine, prefill and decode, TP 1-8
# a third: large-batch decode steps (static batches of 60-1,024 sequences, an edge-class L40S among the GPUs)
HOLDOUT_STATIC_FILE = DATA / "perf_holdout_static_decode.csv"
# a fourth: the edge-class L40S alone, a later release's static-batch decode steps, tp 1-8 over PCIe
HOLDOUT_EDGE_FILE = DATA / "perf_holdout_edge.csv"
# a fifth: image passes (ResNet-50, INT8, MLPerf Inference) on the edge-class L4 and T4 at batch 1 to 256: the only
# measurements of an L4 or a T4 the checks hold. The same harness's datacenter-board rows (A100, H100, H200) fit the
# image server's profile (REFERENCE_IMAGE_FILE); no L4 or T4 row is fitted.
HOLDOUT_IMAGE_FILE = DATA / "perf_holdout_mlperf_images.csv"
REFERENCE_IMAGE_FILE = DATA / "perf_reference_mlperf_images.csv"
COLLECTIVES_FILE = DATA / "perf_collectives.csv"
COLUMNS = ["model", "gpu", "tp", "precision", "kv_precision", "phase", "batch", "prompt_tokens", "context",
           "measured_ms", "engine", "source", "notes"]
KERNEL = "vidur-kernels"  # pseudo-engines of the operator-level rows: no overheads
COLLECTIVE = "vidur-collectives"
# Literature value for fused (Flash) attention in serving kernels, used by every engine.
FUSED_ATTENTION_EFFICIENCY = 0.5
# Engines whose first token comes from a decode step after a prefill of all but the last prompt token
# (EngineProfile.first_token_decode), with the evidence.
FIRST_TOKEN_DECODE = {"lmdeploy-turbomind-0.1": "first token from a decode step: TurboMind's ContextDecode skips "
                      "each prompt's last token for the decoder (https://github.com/InternLM/lmdeploy/blob/"
                      "v0.1.0a1/src/turbomind/models/llama/LlamaBatch.cc); a 1-token prompt's first-token "
                      "latency is its batch-1 decode step (11 vs 9-11 ms, Llama-2-7B on an A100)"}


@dataclass
class Rows:
    """Every reference row as arrays: what the roofline needs per row, independent of the constants."""

    table: pd.DataFrame  # kind, model, gpu, tp, phase, engine, tokens, measured_ms, source (one row per point)
    specs: list
    gpus: list
    schemes: list
    costs: list
    prefills: list | None = None  # per row, the prefill pass before a first-token decode step (else None)

    def __post_init__(self):
        t, g, c = self.table, self.gpus, self.costs
        self.tp = t.tp.to_numpy(dtype=float)
        self.measured = t.measured_ms.to_numpy(dtype=float)
        self.kind = t.kind.to_numpy()
        self.prefill = (t.phase == "prefill").to_numpy()
        # A first_token_decode engine's prefill row: its own pass is the decode step, the prefill comes before.
        self.first_decode = t["first_decode"].to_numpy(dtype=bool) if "first_decode" in t else np.zeros(len(t), bool)
        before = self.prefills or [None] * len(t)
        self.before_idx = np.array([i for i, x in enumerate(before) if x is not None], dtype=int)
        self.before = (Rows(t.iloc[self.before_idx].assign(first_decode=False).reset_index(drop=True),
                            [self.specs[i] for i in self.before_idx], [g[i] for i in self.before_idx],
                            [self.schemes[i] for i in self.before_idx], [before[i] for i in self.before_idx])
                       if len(self.before_idx) else None)
        self.engine = t.engine.to_numpy()
        self.gpu_name = np.array([x.name for x in g])
        self.arch = np.array([x.arch for x in g])
        self.mem_kind = np.array([x.memory_kind for x in g])
        self.link_kind = np.array([x.link_kind for x in g])
        self.peak = np.array([x.peak(s.gemm_peak) for x, s in zip(g, self.schemes, strict=True)])
        self.flops16 = np.array([x.flops16 for x in g])
        self.mem_bw = np.array([x.mem_bw for x in g])
        self.link_bw = np.array([x.link_bw for x in g])
        self.weight_only = np.array([s.weight_only for s in self.schemes])
        self.fp8 = np.array([s.gemm_peak == "flops8" for s in self.schemes])
        kvrep = [max(1.0, tp / s.kv_heads) if s is not None and s.kv_heads else 1.0
                 for s, tp in zip(self.specs, self.tp, strict=True)]
        for name in ("gemm_flops", "head_flops", "attn_flops", "weight_bytes", "allreduce_bytes", "gemm_rows",
                     "seqs", "replicated_bytes", "sharded_bytes", "layers"):
            setattr(self, name, np.array([getattr(x, name) for x in c], dtype=float))
        self.kv_bytes = np.array([x.kv_bytes for x in c]) * np.array(kvrep)
        self.heads = np.array([float(s.heads or 0) if s is not None else 0.0 for s in self.specs])
        self.allreduces = np.array([x.allreduces for x in c], dtype=float) * (self.tp > 1)
        self.straggler = np.array([straggler_factor(int(tp)) for tp in self.tp])
        # Each row's engine, GPU type and link kind as a code into its distinct values: a fit predicts every row
        # hundreds of times, and the constants it reads per row are the same for every row of one engine or GPU.
        self.e2e = self.kind == "e2e"
        self._engines, self._engine_code = _codes(self.engine)
        _, self._gpu_code = _codes([f"{x.name}|{x.arch}|{x.memory_kind}|{x.link_kind}" for x in g])
        self._gpus = [g[i] for i in np.unique(self._gpu_code, return_index=True)[1]]  # each GPU key's first row
        self._links, self._link_code = _codes(self.link_kind)

    def _per_engine(self, profiles: list, name: str, codes: np.ndarray | None = None) -> np.ndarray:
        """Every row's value of the engine profile field ``name`` (``profiles``: per distinct engine)."""
        values = np.array([getattr(prof, name) for prof in profiles], dtype=float)
        return values[self._engine_code if codes is None else codes]

    def subset(self, mask: np.ndarray) -> Rows:
        idx = np.flatnonzero(mask)
        return Rows(self.table.iloc[idx].reset_index(drop=True), [self.specs[i] for i in idx],
                    [self.gpus[i] for i in idx], [self.schemes[i] for i in idx], [self.costs[i] for i in idx],
                    [self.prefills[i] for i in idx] if self.prefills else None)

    def predict(self, params: RooflineParams, engines: np.ndarray | str | None = None) -> np.ndarray:
        """Milliseconds of every row under ``params`` (each end-to-end row with its engine's profile, or with the
        profile ``engines`` names for it: one name per row, or one for every row)."""
        p = params
        engines = self._named(engines)
        names, codes = (self._engines, self._engine_code) if engines is None else _codes(engines)
        profiles = [p.engines.get(e, p.engines["default"]) for e in names]
        pre, step = self.prefill, ~self.prefill | self.first_decode
        overhead = np.where(self.e2e, np.where(pre, self._per_engine(profiles, "prefill_overhead_ms", codes), 0.0)
                            + np.where(step, self._per_engine(profiles, "step_overhead_ms", codes), 0.0), 0.0)
        out = self._passes_ms(p, engines) + overhead
        if self.before is not None:
            out[self.before_idx] += self.before._passes_ms(p, None if engines is None else
                                                           np.asarray(engines, dtype=object)[self.before_idx])
        return out

    def _named(self, engines) -> np.ndarray | None:
        """``engines`` as one engine name per row (a single name: the same for every row)."""
        return np.full(len(self.measured), engines, dtype=object) if isinstance(engines, str) else engines

    def _passes_ms(self, params: RooflineParams, engines: np.ndarray | None = None) -> np.ndarray:
        """Milliseconds of every row's own pass, without the engine's fixed overheads (each end-to-end row's engine
        its own, or the one ``engines`` names for it)."""
        p = params
        names, codes = (self._engines, self._engine_code) if engines is None else _codes(engines)

        def ramp(rows):
            with np.errstate(invalid="ignore"):
                return np.where(np.isfinite(rows), rows / (rows + p.gemm_half_tokens), 1.0)

        profiles = [p.engines.get(e, p.engines["default"]) for e in names]
        attn_eff = self._per_engine(profiles, "attn_efficiency", codes)
        dense = np.where(self.e2e & self.prefill & ~self.first_decode,
                         self._per_engine(profiles, "dense_attention_bytes", codes), 0.0)
        elt = np.where(self.e2e, self._per_engine(profiles, "elementwise_factor", codes), 1.0)
        eff = np.array([p.compute_efficiency(x) for x in self._gpus], dtype=float)[self._gpu_code]
        peak = self.tp * self.peak * eff * np.where(self.fp8, p.fp8_gemm_factor, 1.0)
        # An engine with its own share of the peak (the image server) replaces the board's efficiency and FP8 factor.
        own = np.array([np.nan if x.gemm_efficiency is None else x.gemm_efficiency for x in profiles],
                       dtype=float)[codes]
        mine = self.e2e & np.isfinite(own)
        peak = np.where(mine, self.tp * self.peak * np.where(mine, own, 1.0), peak)
        with np.errstate(invalid="ignore", divide="ignore"):  # collective rows have no FLOPs (0/0, replaced below)
            compute = (self.gemm_flops / (peak * ramp(self.gemm_rows)) + self.head_flops / (peak * ramp(self.seqs))
                       + self.attn_flops / (self.tp * self.flops16 * attn_eff))
        bw = self.mem_bw * np.array([p.memory_efficiency(x) for x in self._gpus], dtype=float)[self._gpu_code]
        weight_bw = bw * np.where(self.weight_only, p.weight_only_bw_efficiency, 1.0)
        memory = self.weight_bytes / (self.tp * weight_bw) + self.kv_bytes / (self.tp * bw)
        k = p.overlap_exponent
        busy = (compute ** k + memory ** k) ** (1.0 / k)
        # The score matrix through memory needs attention layers and heads: an image or speech pass (infinite
        # gemm_rows, no heads) has none, and is skipped rather than priced 0 * inf, as Roofline._time does.
        scored = (dense > 0) & (self.layers > 0) & (self.heads > 0)
        dense_s = np.zeros(len(busy))
        dense_s[scored] = (dense[scored] * self.gemm_rows[scored] ** 2 * self.layers[scored] * self.heads[scored]
                           / bw[scored])
        busy = (busy + elt * (self.replicated_bytes + self.sharded_bytes / self.tp) / (self.mem_bw *
                                                                                       p.elementwise_efficiency)
                + self.layers * p.layer_floor_us * 1e-6 + dense_s)
        lat = np.array([p.by("allreduce_latency_us", x) for x in self._links], dtype=float)[self._link_code] * 1e-6
        link = self.link_bw * np.array([p.link_efficiency_of(x) for x in self._gpus], dtype=float)[self._gpu_code]
        ring = 2.0 * (self.tp - 1) / self.tp * self.allreduce_bytes / link
        one = np.minimum(lat + ring, p.allreduce_ll_latency_us * 1e-6 + ring / LL_BANDWIDTH_SHARE)
        jitter = np.where(self.e2e, self._per_engine(profiles, "barrier_jitter_us", codes), 0.0) * 1e-6
        comm = self.allreduces * (one + jitter * self.straggler)
        out = (busy + comm) * 1e3
        coll = self.kind == "collective"
        out[coll] = (one * 1e3)[coll]
        return out

    def check(self, params: RooflineParams, engines: np.ndarray | str | None = None) -> float:
        """Largest relative gap between :meth:`predict` and :class:`Roofline` itself on these rows (``engines``:
        as for :meth:`predict`)."""
        model = Roofline({}, params)
        ref = np.empty(len(self.measured))
        engines = self._named(engines)
        names = self.engine if engines is None else np.asarray(engines, dtype=object)
        for i, (spec, g, sch, cost) in enumerate(zip(self.specs, self.gpus, self.schemes, self.costs, strict=True)):
            tp = int(self.tp[i])
            if self.kind[i] == "collective":
                ref[i] = model.allreduce_s(g, tp, cost.allreduce_bytes) * 1e3
                continue
            prof = (params.engines.get(names[i], params.engines["default"]) if self.kind[i] == "e2e"
                    else EngineProfile(0.0, 0.0, FUSED_ATTENTION_EFFICIENCY, 1.0))
            if self.first_decode[i]:
                ref[i] = model._first_token(spec, g, tp, sch, (self.prefills or [None] * len(ref))[i], cost,
                                            prof).total_ms
            else:
                ref[i] = model._time(spec, g, tp, sch, cost, bool(self.prefill[i]), prof).total_ms
        return float(np.max(np.abs(self.predict(params, engines) - ref) / ref))


def read_measurements(path: Path, columns: list[str], positive: tuple[str, ...]):
    """A measurement table with exactly ``columns``, and its rows (row number in the file, row) after checking that
    the ``positive`` fields are; one :class:`DataFileError` naming file, row and field."""
    table = pd.read_csv(path)
    if list(table.columns) != columns:
        raise DataFileError(path, None, None, f"expected columns {columns}, got {list(table.columns)}")
    rows = list(enumerate(table.itertuples(), start=2))
    for i, r in rows:
        for name in positive:
            if not getattr(r, name) > 0:
                raise DataFileError(path, i, name, f"{getattr(r, name)!r} is not positive")
    return table, rows


def load_reference(path: str | Path | None = None) -> pd.DataFrame:
    """The end-to-end reference table, validated (one :class:`DataFileError` naming row and field)."""
    path = Path(path) if path else REFERENCE_FILE
    table, rows = read_measurements(path, COLUMNS, ("tp", "batch", "prompt_tokens", "measured_ms"))
    for i, r in rows:
        if r.phase not in ("prefill", "decode"):
            raise DataFileError(path, i, "phase", f"{r.phase!r} is not prefill or decode")
        if not str(r.source).startswith("http"):
            raise DataFileError(path, i, "source", "must be a URL")
    return table


def reference_specs() -> dict:
    """Model ids usable in the reference tables: the shipped catalog plus the reference-only architectures."""
    specs = {s.id: s for s in default_catalog()}
    specs.update({s.id: s for s in Catalog.load(REFERENCE_MODELS)})
    return specs


def reference_gpus() -> dict:
    """GPU types of the reference tables: the topology's spec table plus the reference-only boards."""
    from topology.gpus import load_gpus

    gpus = gpu_table(load_gpus())
    gpus.update(gpu_table(load_gpus(REFERENCE_GPUS)))
    return gpus


def load_rows(kinds=("e2e", "kernel", "collective"), reference: str | Path | None = None) -> Rows:
    """All reference rows of the given kinds, with their FLOP and byte counts (``reference``: another table of
    end-to-end rows in the same format, e.g. the held-out check set)."""
    specs, gpus = reference_specs(), reference_gpus()
    frames, spec_l, gpu_l, sch_l, cost_l, before_l = [], [], [], [], [], []

    def add(path, i, model, gpu, precision, kv_precision, build):
        if model and model not in specs:
            raise DataFileError(path, i + 2, "model", f"unknown model {model!r}")
        if gpu not in gpus:
            raise DataFileError(path, i + 2, "gpu", f"unknown GPU {gpu!r}")
        base, weight_only = perf_arch.split_precision(precision)
        spec = with_precision(specs[model], base, kv_precision) if model else None
        sch = perf_arch.scheme(base, gpus[gpu].has_fp8, weight_only)
        spec_l.append(spec)
        gpu_l.append(gpus[gpu])
        sch_l.append(sch)
        cost = build(spec, sch)
        cost_l.append(cost[1] or cost[0] if isinstance(cost, tuple) else cost)  # the step when there is one
        before_l.append(cost[0] if isinstance(cost, tuple) and cost[1] else None)

    if "e2e" in kinds:
        path = Path(reference) if reference else REFERENCE_FILE
        t = load_reference(path)
        for i, r in enumerate(t.itertuples()):
            if r.phase == "prefill":
                build = lambda s, sch, r=r: perf_arch.first_token_passes(s, sch, [int(r.prompt_tokens)] * int(r.batch),  # noqa: E731
                                                               r.engine in FIRST_TOKEN_DECODE)
            else:
                build = lambda s, sch, r=r: perf_arch.decode_pass(s, sch, int(r.batch), float(r.context))  # noqa: E731
            add(path, i, r.model, r.gpu, r.precision, r.kv_precision, build)
        frames.append(pd.DataFrame({"kind": "e2e", "model": t.model, "gpu": t.gpu, "tp": t.tp, "phase": t.phase,
                                    "engine": t.engine,
                                    "tokens": np.where(t.phase == "prefill", t.prompt_tokens * t.batch, t.batch),
                                    "batch": t.batch, "prompt_tokens": t.prompt_tokens, "context": t.context,
                                    "measured_ms": t.measured_ms, "source": t.source,
                                    "first_decode": (t.phase == "prefill") & t.engine.isin(list(FIRST_TOKEN_DECODE))}))
    if "kernel" in kinds:
        k = pd.read_csv(KERNELS_FILE)
        for i, r in enumerate(k.itertuples()):
            add(KERNELS_FILE, i, r.model, r.gpu, "fp16", "fp16",
                lambda s, sch, r=r: perf_arch.body_pass(s, sch, int(r.tokens)))
        frames.append(pd.DataFrame({"kind": "kernel", "model": k.model, "gpu": k.gpu, "tp": k.tp, "phase": "kernel",
                                    "engine": KERNEL, "tokens": k.tokens, "measured_ms": k.measured_ms,
                                    "source": k.source}))
    if "collective" in kinds:
        c = pd.read_csv(COLLECTIVES_FILE)
        for i, r in enumerate(c.itertuples()):
            add(COLLECTIVES_FILE, i, "", r.gpu, "fp16", "fp16",
                lambda s, sch, r=r: perf_arch.PassCost(0, 0, 0, 0, 0, 0, 0, float(r.bytes), 1, 1))
        frames.append(pd.DataFrame({"kind": "collective", "model": "", "gpu": c.gpu, "tp": c.workers,
                                    "phase": "allreduce", "engine": COLLECTIVE, "tokens": c.bytes,
                                    "measured_ms": c.measured_ms, "source": c.source}))
    table = pd.concat(frames, ignore_index=True)
    table["first_decode"] = table["first_decode"].fillna(False).astype(bool)
    return Rows(table, spec_l, gpu_l, sch_l, cost_l, before_l)


def _codes(values) -> tuple[list, np.ndarray]:
    """(the distinct values in order of first appearance, each value's index among them)."""
    codes, uniques = pd.factorize(np.asarray(values, dtype=object), use_na_sentinel=False)
    return list(uniques), codes
