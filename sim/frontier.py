"""``edgepop frontier``: the least GPU budget (and $/hour) at which each deployment meets an SLO, and the cost ratio.

Each *line* is a deployment whose budget is swept: the edge, and central in each baseline region set. A budget is
the scenario's ``gpu_inventory_scale`` (x the tier ladder's edge GPUs); central's fleet follows the edge's at the
same scale (equal GPUs, or equal dollars per hour with ``budget = "usd"``), so at one scale the lines cost the
same and their latencies compare at equal cost. The frontier

1. runs every line at every budget of ``budgets`` (x the scenario's scale) for every seed;
2. brackets, per line, the least budget meeting the SLO (the mean over seeds of the SLO metric against its
   threshold), and bisects the bracket (geometric midpoints) until it is one GPU wide or within ``tolerance`` of
   the GPUs, or ``max_steps`` rounds were run;
3. reports per line the least budget found (``min_gpus_for_slo``, ``min_usd_per_hour_for_slo``), the iso-SLO
   cost ratio (edge $/hour over a baseline's $/hour, both at their least budget), and the same per user
   continent from the same runs (the least evaluated budget from which that continent's figure holds) and per
   seed (each seed's runs alone: :func:`sim.frontier_brackets.by_seed`).

Every round is one sweep (:func:`sim.sweep.run_sweep`), so the local pool and Ray give identical rows for the same
seeds. Budgets where a demanded model fits no node (a tensor-parallel model with only one-GPU nodes left) are
recorded as infeasible, not simulated. Bisection assumes the metric improves with budget (it is monotone in
expectation; a non-monotone bracket is reported as found).
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from edgepop.errors import UserError
from edgepop.outputs import output_folder, staged_output
from sim.frontier_args import checked_arguments
from sim.frontier_brackets import within_tolerance
from sim.frontier_report import summarise, write_outputs
from sim.scenario import no_central

DEFAULT_BUDGETS = (0.1, 0.18, 0.32, 0.56, 1.0, 1.8)  # x the scenario's GPU inventory scale (x1.8 apart)
HIGHER_IS_BETTER = {"slo_attainment", "goodput_rps"}
FRONTIER_OUTPUTS = frozenset({"frontier.parquet", "frontier.json", "frontier.png", "report.md"})  # what it writes
SLO_METRICS = ("ttft_p50_ms", "ttft_p90_ms", "ttft_p95_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p95_ms",
               "e2e_p50_ms", "e2e_p95_ms", "e2e_p99_ms", "queue_p50_ms", "queue_p95_ms", "slo_attainment",
               "goodput_rps")


@dataclass(frozen=True)
class SLOTarget:
    """``metric`` (a sweep summary column) against ``threshold``: at most for latencies, at least for shares."""

    metric: str
    threshold: float

    @property
    def higher_is_better(self) -> bool:
        return self.metric in HIGHER_IS_BETTER

    def met(self, value) -> bool:
        if value is None or not np.isfinite(value):
            return False
        return value >= self.threshold if self.higher_is_better else value <= self.threshold

    @property
    def text(self) -> str:
        return f"{self.metric} {'>=' if self.higher_is_better else '<='} {self.threshold:g}"

    @property
    def column(self) -> str:
        """The summary column decided on: latency percentiles count requests never answered (rejected, failed) as
        missing the threshold, so shedding load cannot make a budget look good (shares count them already)."""
        return self.metric if self.higher_is_better else f"{self.metric}_all"


def parse_slo(text: str) -> SLOTarget:
    """``ttft_p95_ms=500`` or ``slo_attainment=0.99`` (one-line error otherwise)."""
    if not isinstance(text, str):
        raise UserError(f"slo must be METRIC=VALUE text (e.g. 'ttft_p95_ms=500') or an SLOTarget, got {text!r}")
    metric, sep, value = str(text).partition("=")
    metric = metric.strip()
    try:
        threshold = float(value)
    except ValueError:
        threshold = math.nan
    if not sep or metric not in SLO_METRICS or not np.isfinite(threshold) or threshold < 0:
        raise UserError(f"bad --slo {text!r}: expected METRIC=VALUE with METRIC one of {', '.join(SLO_METRICS)} "
                        "and a non-negative VALUE, e.g. ttft_p95_ms=500")
    if metric == "slo_attainment" and threshold > 1:
        raise UserError(f"bad --slo {text!r}: slo_attainment is a share of requests, at most 1 (e.g. 0.99)")
    if threshold == 0 and metric in HIGHER_IS_BETTER:
        raise UserError(f"bad --slo {text!r}: every fleet has at least 0, so no budget would be least; give a "
                        "positive target")
    if threshold == 0 and not metric.startswith("queue_"):  # (no wait at all is a target a fleet can meet)
        raise UserError(f"bad --slo {text!r}: no request takes 0 ms, so no budget would meet it; give a positive "
                        "latency")
    return SLOTarget(metric, threshold)


def check_slo_measured(slo: SLOTarget, sc) -> None:
    """A TTFT or TPOT target on a workload with no text-generation model is never measured, so every budget
    would "fail" it: refused before any run, naming the metrics that are."""
    if not slo.metric.startswith(("ttft_", "tpot_")):
        return
    from controlplane.forecast import DEFAULT_MIX
    from sim.run import scenario_catalog

    catalog, wl = scenario_catalog(sc), sc.workload
    models = [wl.trace_model] if wl.is_trace else [m for m, share in (wl.mix or DEFAULT_MIX).items() if share > 0]
    if not any(catalog[m].task == "text-generation" for m in models if m in catalog):
        raise UserError(f"--slo {slo.metric}: {sc.source}'s workload has no text-generation model, so no request "
                        "has a TTFT or TPOT; use an e2e_*, queue_*, slo_attainment or goodput_rps target")


@dataclass(frozen=True)
class Line:
    """One swept deployment: ``edge`` or ``central`` in region set ``baseline``."""

    deployment: str
    baseline: str | None = None

    @property
    def key(self) -> str:
        return self.deployment if self.baseline is None else f"central:{self.baseline}"


@dataclass
class Point:
    """A line at one budget: its fleet and, once run, one summary row per seed."""

    line: Line
    scale: float
    gpus: int
    usd_per_hour: float
    feasible: bool
    why: str = ""
    phase: str = "grid"
    rows: list = field(default_factory=list)

    def mean(self, column: str) -> float:
        vals = [r.get(column) for r in self.rows]
        vals = [float(v) for v in vals if v is not None and np.isfinite(v)]
        return float(np.mean(vals)) if vals else math.nan

    def ci95(self, column: str) -> list | None:
        """Student-t 95% interval of the mean over seeds (None with fewer than two seeds)."""
        from edgepop.stats import t_half_width95

        vals = np.array([float(r[column]) for r in self.rows if r.get(column) is not None
                         and np.isfinite(r[column])])
        if vals.size < 2:
            return None
        half = t_half_width95(vals)
        lo, hi = vals.mean() - half, vals.mean() + half
        if column.endswith("slo_attainment"):  # a share: an interval past 0 or 1 claims values it cannot take
            lo, hi = max(lo, 0.0), min(hi, 1.0)
        return [round(lo, 3), round(hi, 3)]

    def meets(self, slo: SLOTarget, column: str | None = None) -> bool:
        """The mean over seeds meets the SLO; a seed with no figure (a percentile that fell on requests never
        answered) fails it."""
        column = column or slo.column
        vals = [r.get(column) for r in self.rows]
        if not self.feasible or not vals or any(v is None or not np.isfinite(v) for v in vals):
            return False
        return slo.met(float(np.mean(vals)))


@dataclass
class Frontier:
    """What a frontier run produced (also written as frontier.json / frontier.parquet / frontier.png / report.md)."""

    scenario: str
    slo: SLOTarget
    lines: list[Line]
    points: list[Point]
    result: dict
    path: Path
    wall_s: float


def scenario_path(name_or_path: str | Path) -> Path:
    """The file of a scenario given by embedded name or path; a one-line UserError when it is neither."""
    from sim.scenario import SCENARIO_DIR, read_named_toml

    if not isinstance(name_or_path, str | os.PathLike):
        raise UserError(f"a scenario is an embedded name or a path, got {name_or_path!r}")
    path = Path(name_or_path)
    if not path.suffix and (SCENARIO_DIR / f"{name_or_path}.toml").exists():
        return SCENARIO_DIR / f"{name_or_path}.toml"
    read_named_toml(name_or_path, SCENARIO_DIR, "scenario")  # the one-line error when it is neither
    return path.resolve()


def fleet_budget(sc, topo, line: Line, scale: float) -> tuple[int, float, bool, str]:
    """(GPUs, $/hour, feasible, why not) of ``line``'s fleet at inventory ``scale``, without simulating."""
    from controlplane.catalog import Catalog, default_catalog
    from controlplane.fleet import central_fleet, edge_fleet
    from controlplane.forecast import DEFAULT_MIX

    try:
        world = topo.with_gpu_scale(scale)
        if line.deployment == "edge":
            fleet = edge_fleet(world, pops=list(sc.edge.pops) if sc.edge.pops else None)
            one_llm = sc.edge.one_llm_per_gpu
        else:
            from sim.run import central_config

            cfg = central_config(sc)
            like = edge_fleet(world, pops=list(cfg.pops) if cfg.pops else None)
            like = like.without_gpus(str(cfg.placement_options.get("without_gpus", "")))  # as the placement does
            fleet = central_fleet(world, line.baseline, like=like, scale=cfg.gpu_scale, budget=cfg.budget,
                                  node=cfg.node, rack=cfg.rack)
            one_llm = cfg.one_llm_per_gpu
    except UserError as exc:
        return 0, 0.0, False, str(exc)
    gpus, usd = int(fleet.nodes.gpus.sum()), round(float(fleet.nodes.price_usd_hr.sum()), 2)
    catalog = Catalog.load(sc.catalog) if sc.catalog else default_catalog()
    wl = sc.workload
    models = [wl.trace_model] if wl.is_trace else list((DEFAULT_MIX if wl.mix is None else wl.mix).keys())
    per_gpu = fleet.nodes.gpu_memory_gb.to_numpy() * 1e9
    node_gpus = fleet.nodes.gpus.to_numpy()
    llm_gpus = 0
    for m in models:
        spec = catalog[m]
        if not ((per_gpu >= spec.bytes_per_gpu) & (node_gpus >= spec.tensor_parallel)).any():
            return gpus, usd, False, f"{m} fits no node ({spec.tensor_parallel} GPU(s) of one node needed)"
        llm_gpus += spec.tensor_parallel if spec.generative and one_llm else 0
    if llm_gpus > gpus:
        return gpus, usd, False, f"{gpus} GPUs cannot give each of the language models its own GPUs"
    return gpus, usd, True, ""


class _Runner:
    """Runs rounds of points as sweeps into ``work`` (a private scratch folder) and fills in their rows."""

    def __init__(self, base: Path, seeds, requests, engine, workers, work: Path, advance, pool=None):
        self.base, self.seeds, self.requests = base, tuple(seeds), requests
        self.engine, self.workers, self.work, self.advance, self.pool = engine, workers, work, advance, pool
        self.round = 0

    def run(self, points: list[Point]) -> None:
        """Run ``points`` (each seed) in one sweep. The edge and one central line at the same budget share a run:
        one workload, both deployments (as ``edgepop simulate`` does), which also saves generating it twice."""
        from sim.grid import parse_grid
        from sim.sweep import run_sweep

        todo = [p for p in points if p.feasible]
        if not todo:
            return
        jobs: dict[str, dict] = {}  # variant name -> {deployment: point}
        overrides: dict[str, dict] = {}
        for p in todo:
            pair = f"pair@{p.scale:.6g}"
            if p.line.deployment == "edge" or (pair in jobs and "central" not in jobs[pair]):
                name = pair
            else:
                name = f"{p.line.key}@{p.scale:.6g}"
            job = jobs.setdefault(name, {})
            if p.line.deployment in job:  # a second central line at this budget: a run of its own
                name = f"{p.line.key}@{p.scale:.6g}"
                job = jobs.setdefault(name, {})
            job[p.line.deployment] = p
            over = overrides.setdefault(name, {"name": name, "gpu_inventory_scale": float(p.scale)})
            if p.line.baseline is not None:
                over["central.baseline"] = p.line.baseline
        doc = {"base": str(self.base), "seeds": list(self.seeds), "variants": list(overrides.values())}
        if self.requests is not None:
            doc["requests"] = int(self.requests)
        grid = parse_grid(doc, source="frontier", base_dir=self.base.parent)
        grid = replace(grid, variants=tuple(replace(v, deployments=tuple(d for d in ("edge", "central")
                                                                         if d in jobs[v.name]))
                                            for v in grid.variants))
        self.round += 1
        result = run_sweep(grid, engine=self.engine, workers=self.workers, keep_requests=False,
                           out=self.work / f"round-{self.round}", advance=self.advance, pool=self.pool)
        walls = dict(zip((v.id for v in grid.variants), result.variant_wall_s, strict=True))
        for row in result.summary.to_dict("records"):
            jobs[row["variant_name"]][row["deployment"]].rows.append({**row, "run_wall_s": walls[row["variant"]]})


def run_frontier(scenario: str | Path = "default", *, slo: str | SLOTarget = "ttft_p95_ms=500",
                 budgets=DEFAULT_BUDGETS, seeds=None, engine: str = "local", workers: int | None = None,
                 requests: int | None = None, baselines=None, only: str | None = None, tolerance: float = 0.05,
                 max_steps: int = 4, out: str | Path = "edgepop-frontier", progress: bool | None = None,
                 absolute: bool = False) -> Frontier:
    """Sweep budgets, bisect the least budget meeting ``slo`` per line, and write the outputs into ``out``.

    ``budgets``: multiples of the scenario's ``gpu_inventory_scale`` (``absolute=True``: inventory scales as
    given). ``baselines``: central region sets to sweep (default: the scenario's). ``only``: ``edge`` or
    ``central``. ``requests`` overrides the scenario's request count. ``seeds`` default to the scenario's seed.
    Every argument is checked before any work (:func:`sim.frontier_args.checked_arguments`: one-line
    ``UserError``s; numpy numbers taken). An interrupt ends the pool's workers (:func:`sim.pool_worker.stop_pool`).
    """
    from sim.pool_worker import stop_pool
    from sim.scenario import load_scenario
    from sim.sweep import local_pool, progress_bar
    from topology import Topology

    t0 = time.perf_counter()
    args = checked_arguments(budgets=budgets, seeds=seeds, engine=engine, workers=workers,
                             requests=requests, baselines=baselines, tolerance=tolerance, max_steps=max_steps,
                             out=out, progress=progress, absolute=absolute)
    budgets, workers, requests, tolerance, max_steps = (args[k] for k in ("budgets", "workers", "requests",
                                                                          "tolerance", "max_steps"))
    slo = slo if isinstance(slo, SLOTarget) else parse_slo(slo)
    base = scenario_path(scenario)
    sc = load_scenario(str(base))
    check_slo_measured(slo, sc)
    topo = Topology.load(last_mile_ms=sc.last_mile_ms)
    lines = _lines(sc, baselines, only, topo)
    seeds = args["seeds"] or (sc.seed,)
    scales = sorted({round(b if absolute else b * sc.gpu_inventory_scale, 9) for b in budgets})
    if len(scales) < 2 or scales[0] <= 0:  # checked as run: inventory scales to 9 decimals
        raise UserError(f"budgets must be at least two different positive numbers (as inventory scales to 9 "
                        f"decimals), got {budgets!r}: scales {scales!r}")
    if scales[-1] > 100:  # as a scenario's gpu_inventory_scale: beyond, the fleets run to millions of GPUs
        raise UserError(f"budgets: an inventory scale of {scales[-1]:g} is over 100 (x the tier ladder's GPUs)")
    out = output_folder(out, "out", staged=True, writes=FRONTIER_OUTPUTS, command="frontier")  # before the work

    def point(line, scale, phase):
        return Point(line, scale, *fleet_budget(sc, topo, line, scale), phase=phase)

    points = [point(line, s, "grid") for line in lines for s in scales]
    feasible = [p for p in points if p.feasible]
    edge_scales = {p.scale for p in feasible if p.line.deployment == "edge"}
    paired = {p.scale for p in feasible if p.line.deployment == "central" and p.scale in edge_scales
              and p.line == next(q for q in lines if q.deployment == "central")}
    total = (len(feasible) - len(paired)) * len(seeds) + max_steps * len(lines) * len(seeds)
    # Staged beside ``out``, moved in at the end; the rounds' sweeps run in a scratch folder removed before that.
    with staged_output(out, FRONTIER_OUTPUTS, prefix=".edgepop-frontier-", command="frontier") as staged:
        work = staged / ".rounds"
        ray_started, pool, stopped_by = False, None, None
        try:
            ray_started = _start_ray(engine, workers)
            n_workers = workers or os.cpu_count() or 1
            pool = local_pool(n_workers) if engine == "local" and n_workers > 1 else None  # one for every round
            with progress_bar(max(total, 1), progress, "frontier", "runs") as advance:
                runner = _Runner(base, seeds, requests, engine, workers, work, advance, pool)
                runner.run(points)
                for _ in range(max_steps):
                    mids = []
                    for line in lines:
                        mid = _next_mid([p for p in points if p.line == line], slo, tolerance, sc, topo, point)
                        if mid is not None:
                            mids.append(mid)
                    if not mids:
                        break
                    points += mids
                    runner.run(mids)
        except BaseException as exc:
            stopped_by = exc  # an interrupt: the pool's workers are ended, not waited for
            raise
        finally:
            if pool is not None:
                stop_pool(pool, stopped_by)
            if ray_started:
                import ray

                ray.shutdown()
            shutil.rmtree(work, ignore_errors=True)
        result = summarise(sc, slo, lines, points, seeds, requests, engine, scales, tolerance)
        wall = time.perf_counter() - t0
        result["wall_s"] = round(wall, 1)
        write_outputs(Frontier(sc.name, slo, lines, points, result, staged, wall))
    return Frontier(sc.name, slo, lines, points, result, out, wall)


def _lines(sc, baselines, only, topo) -> list[Line]:
    """The edge and one central line per baseline (a string: names separated by commas, or by semicolons when a
    baseline is itself a comma-separated list of region ids)."""
    from topology import baseline as baseline_regions

    if only not in (None, "edge", "central"):
        raise UserError(f"only must be edge or central, got {only!r}")
    if only == "edge" and baselines is not None:
        raise UserError(f"baselines {baselines!r} name central region sets, and only = 'edge' sweeps no central line")
    if baselines is not None and sc.central is None:
        raise UserError(f"baselines {baselines!r} name central region sets: {no_central(sc.name)}")
    lines = [] if only == "central" else [Line("edge")]
    if only != "edge" and sc.central is not None:
        names = [sc.central.baseline] if baselines is None else baselines
        if isinstance(names, str):
            names = names.split(";" if ";" in names else ",")
        if not any(n.strip() for n in names):
            raise UserError(f"baselines: no region set named, got {baselines!r}")
        for name in dict.fromkeys(n.strip() for n in names if n.strip()):
            baseline_regions(name, topo.regions)  # one-line error for an unknown set or region id
            lines.append(Line("central", name))
    if not lines:
        raise UserError(f"only = 'central' asked for: {no_central(sc.name)}; nothing to sweep")
    return lines


def _next_mid(points: list[Point], slo: SLOTarget, tolerance: float, sc, topo, make) -> Point | None:
    """The next budget to try for one line: inside its bracket (largest failing below the least meeting)."""
    done = sorted((p for p in points if p.rows or not p.feasible), key=lambda p: p.scale)
    meeting = [p for p in done if p.meets(slo)]
    if not meeting:
        return None
    hi = meeting[0]
    below = [p for p in done if p.scale < hi.scale]
    if not below:
        return None
    lo = below[-1]
    if within_tolerance(lo.gpus, hi.gpus, tolerance):
        return None
    for scale in (math.sqrt(lo.scale * hi.scale), (lo.scale + hi.scale) / 2):
        p = make(hi.line, round(scale, 9), "bisection")
        if lo.gpus < p.gpus < hi.gpus and all(abs(q.scale - p.scale) > 1e-9 for q in points):
            return p
    return None


def _start_ray(engine: str, workers: int | None) -> bool:
    """One Ray session for every round (a sweep leaves a session it did not start running)."""
    if engine != "ray":
        return False
    from sim.sweep_ray import start_ray

    return start_ray(workers)
