"""Run a scenario: one workload, the edge and central deployments on identical arrivals, then the summary.

    from sim.run import run_scenario
    out = run_scenario("default", requests=20_000, seed=3)
    out.requests        # one row per request per deployment
    out.summary         # what summary.json holds
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from controlplane.catalog import Catalog
from edgepop.errors import UserError
from sim.scenario import Scenario, load_scenario, with_overrides
from sim.simulator import Simulation

# One child generator per concern, so changing one (say, routing) never shifts another's draws.
RNG_STREAMS = ("workload", "place_edge", "place_central", "route_edge", "route_central")


def rngs(seed: int) -> dict[str, np.random.Generator]:
    children = np.random.SeedSequence(seed).spawn(len(RNG_STREAMS))
    return {name: np.random.default_rng(c) for name, c in zip(RNG_STREAMS, children, strict=True)}


@dataclass
class RunOutput:
    scenario: Scenario
    requests: pd.DataFrame
    utilisation: pd.DataFrame
    summary: dict
    placements: dict = field(default_factory=dict)
    workload: object = None


def build_perf(spec: str, topo):
    if spec == "roofline":
        from controlplane.perf import Roofline

        return Roofline.from_topology(topo)
    from controlplane.perf_profile import MeasuredProfile

    return MeasuredProfile.load(spec)


def run_scenario(scenario: Scenario | str = "default", *, requests: int | None = None,
                 duration_s: float | None = None, seed: int | None = None, trace: str | None = None,
                 faults=None, topo=None, progress=None, deployments=("edge", "central")) -> RunOutput:
    """Simulate ``scenario`` (an embedded name, a path or a Scenario) with optional overrides."""
    from sim.faults import FaultHandler, parse_fault
    from sim.metrics import deployment_summary, gains
    from sim.workload import generate
    from topology import Topology

    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    wl = {}
    if trace is not None:
        wl.update(trace=str(trace), kind=_trace_kind(trace), requests=None, duration_s=None)
    is_trace = wl.get("kind", sc.workload.kind) != "poisson"
    if requests is not None:
        if requests <= 0:
            raise UserError(f"requests must be positive, got {requests}")
        wl.update(trace_limit=requests) if is_trace else wl.update(requests=requests, duration_s=None)
    if duration_s is not None:
        if is_trace:
            raise UserError("a duration cannot be combined with trace replay (use --requests to limit it)")
        wl.update(duration_s=duration_s, requests=None)
    over = {"workload": wl} if wl else {}
    if seed is not None:
        over["seed"] = seed
    if faults:
        over["faults"] = [parse_fault(f) if isinstance(f, str) else f for f in faults]
    sc = with_overrides(sc, **over) if over else sc
    t_wall = time.perf_counter()
    topo = topo or Topology.load(last_mile_ms=sc.last_mile_ms)
    catalog = Catalog.load(sc.catalog) if sc.catalog else __import__("controlplane.catalog").catalog.default_catalog()
    from sim.perfcache import CachedPerf
    from sim.tech_apply import TechniqueRuntime

    tech = TechniqueRuntime(sc.techniques)  # every call below is the identity when all techniques are off
    catalog = tech.catalog(catalog)
    perf = tech.perf(CachedPerf(build_perf(sc.perf, topo)))
    from sim.cache_techniques import check_block_tokens

    check_block_tokens(sc.techniques, sc.workload)
    r = rngs(sc.seed)
    workload = generate(sc.workload, topo, catalog, r["workload"])
    frame = workload.requests
    span = float(frame.arrival_s.max()) if len(frame) else 0.0
    mean_rps = sc.planning_rps or (len(frame) / max(span, 1e-9) if len(frame) > 1 else 1.0)
    mix = frame.model.value_counts(normalize=True).to_dict()
    gen = frame[frame.task == "text-generation"]
    typical = (int(gen.prompt_tokens.mean()), int(gen.output_tokens.mean())) if len(gen) else (512, 128)
    audio = frame.model.isin([s.id for s in catalog if s.unit == "audio-minute"])
    units = frame.prompt_tokens.where(~audio, frame.prompt_tokens / 60.0)
    shape = {"prompt": units.groupby(frame.model).mean().to_dict(),
             "output": frame.output_tokens.groupby(frame.model).mean().to_dict()}
    start = getattr(sc.workload, "start_utc", None)
    day_s = float(getattr(sc.workload, "day_compression", None) or 86_400.0)
    from sim.deploy import build_deployment

    frames, utils, blocks, placements, sim_stats = [], [], {}, {}, {}
    for name in deployments:
        cfg = sc.edge if name == "edge" else sc.central
        if cfg is None:
            continue
        t0 = time.perf_counter()
        dep, placement, rtt_builder = build_deployment(
            name, cfg, topo, catalog, perf, mean_rps, mix, r[f"place_{name}"], r[f"route_{name}"], typical,
            start, day_s, shape)
        handler = FaultHandler(topo, dep, sc.faults, rtt_builder) if sc.faults else None
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        dep_frame, orig_arrival = tech.workload(name, frame, dep, placement, topo, start, day_s)
        sim = Simulation(dep, dep_frame, perf, faults=sc.faults, fault_policy=sc.fault_policy, sample_s=sc.sample_s,
                         progress=(lambda i, n, _name=name: progress(_name, i, n)) if progress else None,
                         fault_handler=handler, techniques=sc.techniques,
                         engine_factory=tech.engine_factory(name))
        res = sim.run()
        run_s = time.perf_counter() - t0
        duration = max(span, res.sim_end_s)
        blocks[name] = deployment_summary(res.requests, res.utilisation, dep.fleet, duration, sc.slo, catalog,
                                          sim.gpu_busy_seconds())
        if sim.hooks is not None:  # prefix-cache hit ratio, adapter loads
            blocks[name].update(sim.hooks.summary(res.requests))
        blocks[name]["placement"] = {"policy": cfg.placement, "replicas": int(len(placement.table)),
                                     "build_s": round(build_s, 2)}
        tblock = tech.summary(name, res.requests, dep_frame, orig_arrival, dep.fleet, start, day_s)
        if tblock is not None:
            blocks[name]["techniques"] = tblock
        sim_stats[name] = {"sim_wall_s": round(run_s, 3), "sim_requests_per_wall_s": round(len(frame) / run_s, 1)}
        frames.append(res.requests)
        utils.append(res.utilisation)
        placements[name] = placement
    requests_frame = pd.concat(frames, ignore_index=True)
    summary = {"scenario": sc.name, "seed": sc.seed, "requests": int(len(frame)),
               "simulated_span_s": round(span, 2), "deployments": blocks}
    if "edge" in blocks and "central" in blocks:
        summary["gains"] = gains(blocks["edge"], blocks["central"])
    wall = time.perf_counter() - t_wall
    total_sim = sum(s["sim_wall_s"] for s in sim_stats.values())
    summary["performance"] = {"wall_s": round(wall, 2), **{f"{k}_{m}": v for k, s in sim_stats.items()
                                                             for m, v in s.items()},
                              "simulated_requests_per_wall_s": round(len(frames) * len(frame) / max(total_sim, 1e-9), 1)}
    return RunOutput(sc, requests_frame, pd.concat(utils, ignore_index=True), summary, placements, workload)


def _trace_kind(path) -> str:
    return "mooncake" if str(path).endswith((".jsonl", ".json")) else "azure"


def write_outputs(out: RunOutput, directory: str | Path) -> Path:
    """Write requests.parquet, summary.json, report.md and plots into ``directory`` (all or nothing)."""
    import json
    import shutil
    import tempfile

    from sim.report import write_report

    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".edgepop-", dir=directory.parent))
    try:
        out.requests.to_parquet(tmp / "requests.parquet", index=False)
        out.utilisation.to_parquet(tmp / "utilisation.parquet", index=False)
        (tmp / "summary.json").write_text(json.dumps(out.summary, indent=2, default=_json_default))
        write_report(out, tmp)
        if directory.exists():
            for p in tmp.iterdir():
                target = directory / p.name
                if target.is_dir():
                    shutil.rmtree(target)
                p.replace(target)
            tmp.rmdir()
        else:
            tmp.replace(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def _json_default(o):
    if isinstance(o, np.integer | np.floating):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o)}")
