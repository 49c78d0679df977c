"""One sweep variant, run in a worker process (local pool or Ray): simulate it and flatten its summary.

Each variant is a pure function of its scenario and seed (its own seeded generators, see :func:`edgepop.rng.streams`),
so where it runs does not change what it produces.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass

from edgepop.errors import UserError
from sim.gains import HEADLINE_LOSSES
from sim.grid import Variant
from sim.run import run_scenario

# Summary percentiles copied per deployment: (summary.json block, percentile) -> column.
LATENCIES = {"ttft_ms": ("p50", "p90", "p95", "p99"), "tpot_ms": ("p50", "p95"), "itl_ms": ("p50", "p99"),
             "e2e_ms": ("p50", "p95", "p99"), "network_rtt_ms": ("p50", "p95"), "queue_ms": ("p50", "p95")}
DEPLOYMENT_FIGURES = ("slo_attainment", "goodput_rps", "gpu_utilisation", "mean_slot_utilisation", "gpus",
                      "gpu_hours", "gpu_usd", "neurons", "neuron_usd")
# summary.json capacity.<deployment> key -> column.
CAPACITY = {"usd_per_hour": "usd_per_hour", "capacity_rps": "capacity_rps",
            "capacity_tokens_per_s": "capacity_tokens_per_s", "utilisation_mean": "gpu_busy_mean",
            "utilisation_peak_hour": "gpu_busy_peak_hour", "wait_p95_ms": "wait_p95_ms",
            "wait_p95_ms_peak_hour": "wait_p95_ms_peak_hour"}
GAINS = ("ttft_ms_p50_reduction_pct", "ttft_ms_p95_reduction_pct", "ttft_ms_p99_reduction_pct",
         "tpot_ms_p50_reduction_pct", "e2e_ms_p50_reduction_pct", "e2e_ms_generation_p50_reduction_pct",
         "e2e_ms_one_shot_p50_reduction_pct", "network_rtt_ms_p50_reduction_pct", "slo_attainment_delta")
GAINS_CI = tuple(k for k, _ in HEADLINE_LOSSES)  # the gains with a 95% interval


@dataclass(frozen=True)
class VariantTask:
    """What a worker needs for one variant (picklable: plain data and the validated Scenario)."""

    variant: Variant
    requests: int | None
    duration_s: float | None
    deployments: tuple[str, ...]
    keep_requests: bool = True  # False: send back the summary only (no request rows to pickle and write)


_TOPOLOGIES: dict = {}  # per worker process: Topology by last mile (loading one takes about a second)


def _topology(last_mile_ms: float, last_mile: str = "fixed"):
    if (last_mile_ms, last_mile) not in _TOPOLOGIES:
        from topology import Topology

        _TOPOLOGIES[last_mile_ms, last_mile] = Topology.load(last_mile_ms=last_mile_ms, last_mile=last_mile)
    return _TOPOLOGIES[last_mile_ms, last_mile]


def run_variant(task: VariantTask) -> dict:
    """Simulate one variant (runs in a worker). Never raises: failures come back as ``{"error": ...}`` so both
    engines report them the same way."""
    v = task.variant
    t0 = time.perf_counter()
    try:
        out = run_scenario(v.scenario, requests=task.requests, duration_s=task.duration_s, seed=v.seed,
                           topo=_topology(v.scenario.last_mile_ms, v.scenario.last_mile), deployments=task.deployments)
    except UserError as exc:
        return {"id": v.id, "error": str(exc), "user_error": True}
    except Exception as exc:  # noqa: BLE001  (reported with its traceback by the parent)
        return {"id": v.id, "error": f"{type(exc).__name__}: {exc}", "user_error": False,
                "traceback": traceback.format_exc()}
    skipped = {name: block["faults"]["skipped"] for name, block in out.summary["deployments"].items()}
    return {"id": v.id, "summary": summary_rows(out.summary), "faults_skipped": skipped,
            "requests": out.requests if task.keep_requests else None, "wall_s": time.perf_counter() - t0}


def summary_rows(summary: dict) -> list[dict]:
    """One flat row per deployment of a run's summary.json: latency percentiles, SLO, GPU use, cost, gains."""
    gains = summary.get("gains") or {}
    rows = []
    for name, block in summary["deployments"].items():
        row = {"deployment": name, "requests": block["requests"], **block["outcomes"]}
        for metric, pcts in LATENCIES.items():
            for p in pcts:
                row[f"{metric[:-3]}_{p}_ms"] = block[metric][p]
        row.update({k: block[k] for k in DEPLOYMENT_FIGURES})
        row["slo_met"] = block.get("slo_met")  # a count: costs per SLO-met request divide by it exactly
        for metric in ("ttft", "tpot", "e2e", "queue"):  # a request not answered misses a latency SLO
            for p, v in block.get(f"{metric}_ms_counting_failures", {}).items():
                row[f"{metric}_{p}_ms_all"] = v
        ok = block["outcomes"]["ok"]
        row["gpu_usd_per_1k_ok"] = 1000.0 * block["gpu_usd"] / ok if ok else None
        row["placement"] = block["placement"]["policy"]
        row["router"] = block["routing"]["router"]
        row["replicas"] = block["placement"]["replicas"]
        row["gpus_placed"] = block["placement"]["gpus_placed"]
        # (false where a time-budgeted solver's clock, not its work limit, decided the plan: machine-dependent)
        row["placement_deterministic"] = bool(block["placement"].get("deterministic", True))
        row["simulated_span_s"] = summary["simulated_span_s"]
        row["faults_skipped"] = "; ".join(block["faults"]["skipped"])  # each 'SPEC: why'; "" when none
        row["gpu_busy_hours"] = block["gpu_busy_hours"]
        cap = summary.get("capacity", {}).get(name, {})
        row.update({column: cap.get(key) for key, column in CAPACITY.items()})
        for cont, c in block.get("per_continent", {}).items():  # the frontier's per-continent SLO figures
            for k in ("ttft_p50_ms", "ttft_p95_ms", "ttft_requests", "slo_attainment", "requests", "ok"):
                row[f"continent_{cont}_{k}"] = c.get(k)
        if "batch_completion_s" in block:
            row["batch_completion_p50_s"] = block["batch_completion_s"]["p50"]
            row["batch_completion_p95_s"] = block["batch_completion_s"]["p95"]
        if "prefix_cache" in block:  # techniques that were on (sim.techniques)
            row["prefix_token_hit_ratio"] = block["prefix_cache"]["token_hit_ratio"]
        if "lora" in block:
            row["adapter_loads"] = block["lora"]["adapter_loads"]
            row["adapter_requests"] = block["lora"]["adapter_requests"]
            row["adapter_load_ms"] = block["lora"]["adapter_load_ms"]
        tech = block.get("techniques", {})
        if "disaggregation" in tech:
            row["kv_transfer_ms_mean"] = tech["disaggregation"]["kv_transfer_ms_mean"]
        if "batch_served_at_night_share" in tech:
            row["batch_served_at_night_share"] = tech["batch_served_at_night_share"]
        # The edge's gain over central belongs to the variant: repeated on each of its rows, empty without both.
        row.update({f"gain_{k}": gains.get(k) for k in GAINS})
        ci = gains.get("ci95") or {}
        for k in GAINS_CI:  # every row has them, empty without an interval: the schema does not hang on the sizes
            row[f"gain_{k}_ci95_lo"], row[f"gain_{k}_ci95_hi"] = ci.get(k) or (None, None)
        rows.append(row)
    return rows
