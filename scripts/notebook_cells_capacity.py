"""Cell sources of the capacity-planning notebook (see ``notebook_cells.py``): the roofline's rates and costs per
model and GPU type, then a sweep of load against fleet size."""

from notebook_params import ENV_READERS  # (the parameters cell's environment readers)

CAPACITY_PLANNING = [
    ("md", """
# Capacity planning

First the calibrated roofline (`controlplane.perf`): how fast each LLM of the catalog runs on each GPU type, how
many requests/s one replica sustains and what a million output tokens costs in GPU time. Then a small sweep
(`sim.sweep`): the scenario's fleet is placed for a fixed planning rate while the offered load grows, giving SLO
attainment and GPU cost per request as load rises, edge vs central.
"""),
    ("params", ENV_READERS + """

SCENARIO = os.environ.get("EDGEPOP_NB_SCENARIO", "small")
REQUESTS = env_int("EDGEPOP_NB_REQUESTS", "2000", 1)  # per load level
LOADS = env_floats("EDGEPOP_NB_LOADS", "25,100,400,1600")  # offered requests/s
PLAN_RPS = env_float("EDGEPOP_NB_PLAN_RPS", "25")  # the rate every placement is sized for
WORKERS = env_int("EDGEPOP_NB_WORKERS", "0", 0) or None  # sweep processes (default: CPU count)
PROMPT_TOKENS, OUTPUT_TOKENS = 512, 128  # request shape of the roofline figures
"""),
    ("code", """
%matplotlib inline
import math
import tempfile

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from controlplane.catalog import default_catalog
from controlplane.perf import Roofline, capacity_rps
from sim.grid import parse_grid
from sim.sweep import run_sweep
from topology import Topology

topo = Topology.load()
roof = Roofline.from_topology(topo)
catalog = default_catalog()
price = dict(zip(topo.gpus.gpu, topo.gpus.price_usd_hr))
llms = [s for s in catalog if s.generative and not s.id.startswith("@edgepop/")]
"""),
    ("code", """
rows = []
for spec in llms:
    batch = spec.max_batch
    if spec.kv_pool_tokens:  # as capacity_rps: the KV pool limits how many sequences decode together
        batch = max(1, min(batch, spec.kv_pool_tokens // (PROMPT_TOKENS + OUTPUT_TOKENS)))
    for gpu in topo.gpus.gpu:
        row = {"model": spec.id.split("/")[-1], "gpu": gpu, "tp": spec.tensor_parallel}
        if roof.memory_per_gpu(spec, gpu)["fits"]:
            step = roof.decode_step_ms(spec, gpu, batch, PROMPT_TOKENS + OUTPUT_TOKENS / 2)
            rps = capacity_rps(roof, spec, gpu, PROMPT_TOKENS, OUTPUT_TOKENS)
            row.update(ttft_ms=roof.prefill_ms(spec, gpu, PROMPT_TOKENS), decode_tokens_s=1e3 * batch / step,
                       capacity_rps=rps, rps_per_gpu=rps / spec.tensor_parallel,
                       usd_per_1m_output_tokens=price[gpu] * spec.tensor_parallel / (rps * OUTPUT_TOKENS * 3600) * 1e6)
        rows.append(row)
roofline = pd.DataFrame(rows)
roofline.dropna().sort_values("usd_per_1m_output_tokens").head(12).round(2)
"""),
    ("code", """
def heatmap(ax, table, title, fmt="{:.0f}", log=True):
    values = table.to_numpy(dtype=float)
    shown = np.log10(values) if log else values
    im = ax.imshow(np.ma.masked_invalid(shown), cmap="magma", aspect="auto")
    ax.set(xticks=range(table.shape[1]), xticklabels=table.columns, yticks=range(table.shape[0]),
           yticklabels=table.index, title=title)
    for (i, j), v in np.ndenumerate(values):
        ax.text(j, i, "n/a" if np.isnan(v) else fmt.format(v), ha="center", va="center", fontsize=7,
                color="0.5" if np.isnan(v) else ("k" if shown[i, j] > np.nanmean(shown) else "w"))
    return im

fig, axes = plt.subplots(1, 3, figsize=(19, 5.5), sharey=True)
for ax, (col, title, fmt) in zip(axes, (
        ("decode_tokens_s", "decode tokens/s per replica (full batch)", "{:.0f}"),
        ("rps_per_gpu", f"requests/s per GPU ({PROMPT_TOKENS}/{OUTPUT_TOKENS} tokens)", "{:.1f}"),
        ("usd_per_1m_output_tokens", "GPU $ per 1M output tokens", "{:.2f}"))):
    heatmap(ax, roofline.pivot(index="model", columns="gpu", values=col)[list(topo.gpus.gpu)], title, fmt)
fig.tight_layout()
"""),
    ("md", """
## Load sweep: SLO attainment and GPU cost

Both deployments are placed for `PLAN_RPS` requests/s (`planning_rps` fixes the rate; the model mix and request
sizes the placement plans for are each run's own, so replica counts move a little between loads) and offered each
load of `LOADS`; every variant is one `run_scenario` on identical arrivals for edge and central. The variants have
the same number of requests, so the highest loads cover the shortest spans (seconds): read their utilisation as
that of a burst, not of a day. GPU cost per request is what the whole
fleet costs while the load is offered (its $/hour over the arrival span) divided by the requests that met their
SLO: an idle fleet is expensive per request, an overloaded one wastes GPU time on requests that miss the SLO.
"""),
    ("code", """
grid = parse_grid({"base": SCENARIO, "requests": REQUESTS,
                   "axes": {"planning_rps": [PLAN_RPS], "workload.rps": LOADS}}, source="capacity-planning")
result = run_sweep(grid, workers=WORKERS, out=tempfile.mkdtemp(prefix="edgepop-capacity-"), progress=False)
s = result.summary
# gpu_usd: the fleet's $/hour over the arrival span, unrounded enough for spans of seconds; slo_met: a count
s["gpu_usd_per_1k_slo_met"] = 1e3 * s.gpu_usd / s.slo_met.where(s.slo_met > 0)
print(f"{len(grid.variants)} variants in {result.wall_s:.1f} s; outputs in {result.path}")
s[["workload.rps", "deployment", "replicas", "ttft_p50_ms", "ttft_p95_ms", "queue_p95_ms", "slo_attainment",
   "rejected", "gpu_utilisation", "gpu_usd_per_1k_slo_met"]].round(3)
"""),
    ("code", """
fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
for name, style in (("edge", "o-"), ("central", "s--")):
    d = s[s.deployment == name].sort_values("workload.rps")
    axes[0].plot(d["workload.rps"], d.slo_attainment, style, label=name)
    axes[1].plot(d["workload.rps"], d.ttft_p95_ms, style, label=name)
    axes[2].plot(d["workload.rps"], d.gpu_usd_per_1k_slo_met, style, label=name)
for ax, (ylabel, title) in zip(axes, (("share of requests", "SLO attainment"), ("ms", "TTFT p95"),
                                      ("$", "GPU cost per 1k requests meeting the SLO"))):
    ax.set(xscale="log", xlabel="offered load (requests/s)", ylabel=ylabel, title=title)
    if ylabel == "$":
        ax.set_yscale("log")
    ax.axvline(PLAN_RPS, color="0.5", lw=0.8, ls=":")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
fig.tight_layout()
"""),
    ("md", """
How much load a deployment absorbs depends on the headroom its placement policy leaves (the `replicas` column):
`greedy-demand` keeps adding replicas while they cut expected RTT, `central` sizes each region's replicas to the
demand it plans for. Sweep `planning_rps`, `edge.placement` or `central.baseline` as further axes to explore that.
"""),
]
