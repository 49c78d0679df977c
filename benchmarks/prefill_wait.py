"""Where a TTFT tail comes from: each language model's own prefill time against the time its prompt waited at its
replica, per deployment.

    python benchmarks/prefill_wait.py [--scenario default] [--inventory-scale X] [--prefill-scale F]
                                      [--decode-scale F] [--edge-utilisation-cap C] [--router NAME]
                                      [--requests N] [--seed S]

Runs the scenario (with the given overrides) and, for the text-generation requests that ended ok, splits each one's
``prefill_ms`` (from joining its replica to its first token) into its *own* prefill (the run's service-time model,
scales included, for its prompt alone on its node's GPU type at the model's tensor-parallel degree) and the rest:
waiting behind other prompts prefilled before or with it on that replica. A replica that serves its city alone
makes a long prompt wait more often than a region's replicas pooled behind one router, and the wait grows with
every prefill's length. Prints per deployment and model its replicas and GPUs (the placement's), the requests, TTFT
p50/p95, own prefill p50/p95 and the wait's mean, p50 and p95 (ms), and the deployment's TTFT p95 over all of
them. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from edgepop.argtypes import json_line, positive_int


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not (np.isfinite(value) and 0 < value <= 100):
        raise argparse.ArgumentTypeError(f"must be in (0, 100], got {text!r}")
    return value


def _ms(x) -> float:
    return round(float(x), 1) + 0.0  # (+ 0.0: a rounding error below zero prints 0.0, not -0.0)


def split(out, perf, catalog) -> dict:
    """Per deployment: its TTFT p95 over ok text-generation requests, and per model the split of their prefill
    (``perf``: the run's memoised model, a :class:`controlplane.perf_cached.CachedPerf`, as its replicas read it)."""
    frame = out.requests
    gen = frame[(frame.task == "text-generation") & (frame.outcome == "ok")]
    result: dict = {}
    for dep, d in gen.groupby("deployment", sort=True):
        nodes = out.placements[dep].fleet.nodes
        gpu_of = dict(zip(nodes.node_id, nodes.gpu, strict=True))
        block = {"ttft_p95_ms": _ms(d.ttft_ms.quantile(0.95)), "models": {}}
        for model, m in d.groupby("model", sort=True):
            spec = catalog[model]
            fns = {gpu: perf.prefill_fn(spec, gpu) for gpu in {gpu_of[n] for n in m.node.unique()}}
            own = np.array([fns[gpu_of[n]](int(t))
                            for n, t in zip(m.node.tolist(), m.prompt_tokens.tolist(), strict=True)])
            wait = m.prefill_ms.to_numpy() - own
            held = out.summary["deployments"][dep]["per_model"].get(model, {})
            block["models"][model] = {
                "requests": int(len(m)), "replicas": held.get("replicas"), "gpus": held.get("gpus"),
                "ttft_p50_ms": _ms(m.ttft_ms.median()), "ttft_p95_ms": _ms(m.ttft_ms.quantile(0.95)),
                "own_prefill_p50_ms": _ms(np.median(own)),
                "own_prefill_p95_ms": _ms(np.quantile(own, 0.95)),
                # (the least is 0 up to rounding: a replica's lone prefill takes exactly the model's time)
                "wait_min_ms": _ms(wait.min()), "wait_mean_ms": _ms(wait.mean()), "wait_p50_ms": _ms(np.median(wait)),
                "wait_p95_ms": _ms(np.quantile(wait, 0.95))}
        result[str(dep)] = block
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="default", help="embedded scenario name or TOML file (default: default)")
    ap.add_argument("--inventory-scale", type=positive_float, default=None,
                    help="the scenario's gpu_inventory_scale (default: its own)")
    ap.add_argument("--prefill-scale", type=positive_float, default=None, help="prefill_time_scale (default: its own)")
    ap.add_argument("--decode-scale", type=positive_float, default=None, help="decode_time_scale (default: its own)")
    ap.add_argument("--edge-utilisation-cap", type=positive_float, default=None,
                    help="[edge] utilisation_cap: the share of each replica's capacity the placement plans to use "
                         "(default: the scenario's)")
    ap.add_argument("--router", default=None,
                    help="route both deployments by this policy, their router options kept (default: the scenario's)")
    ap.add_argument("--requests", type=positive_int, default=None, help="requests (default: the scenario's)")
    ap.add_argument("--seed", type=int, default=None, help="seed (default: the scenario's)")
    args = ap.parse_args()
    from controlplane.perf_models import build_run_perf
    from edgepop.errors import UserError
    from sim.run import run_scenario, scenario_catalog, scenario_topology
    from sim.scenario import load_scenario

    try:
        sc = load_scenario(args.scenario)
        sc = replace(sc, **{k: v for k, v in (("gpu_inventory_scale", args.inventory_scale),
                                              ("prefill_time_scale", args.prefill_scale),
                                              ("decode_time_scale", args.decode_scale)) if v is not None})
        if args.edge_utilisation_cap is not None:
            if args.edge_utilisation_cap > 1:
                ap.error(f"--edge-utilisation-cap must be at most 1, got {args.edge_utilisation_cap:g}")
            sc = replace(sc, edge=replace(sc.edge, utilisation_cap=args.edge_utilisation_cap))
        if args.router is not None:
            from sim.scenario import check_scenario

            sc = check_scenario(replace(sc, edge=replace(sc.edge, router=args.router),
                                        central=sc.central and replace(sc.central, router=args.router)))
        out = run_scenario(sc, requests=args.requests, seed=args.seed)
    except UserError as exc:
        ap.error(str(exc))
    # the run's own model, memoised as its replicas read it (a lone prompt's prefill is exactly this)
    perf = build_run_perf(sc.perf, scenario_topology(sc), sc.prefill_time_scale, sc.decode_time_scale)
    result = split(out, perf, scenario_catalog(sc))
    for dep, block in result.items():
        print(f"{dep}: TTFT p95 {block['ttft_p95_ms']} ms")
        for model, r in block["models"].items():
            print(f"  {model}: {r['replicas']} replicas on {r['gpus']} GPUs, {r['requests']:,} requests, "
                  f"TTFT p50/p95 {r['ttft_p50_ms']}/{r['ttft_p95_ms']}, own "
                  f"prefill {r['own_prefill_p50_ms']}/{r['own_prefill_p95_ms']}, wait mean {r['wait_mean_ms']} "
                  f"p50 {r['wait_p50_ms']} p95 {r['wait_p95_ms']} ms")
    print(json_line({"benchmark": "prefill_wait", "scenario": sc.name, "seed": out.summary["seed"],
                     "edge_utilisation_cap": sc.edge.utilisation_cap, "router": sc.edge.router,
                     "requests": out.summary["requests"], "gpu_inventory_scale": sc.gpu_inventory_scale,
                     "prefill_time_scale": sc.prefill_time_scale, "decode_time_scale": sc.decode_time_scale,
                     "deployments": result}))


if __name__ == "__main__":
    main()
