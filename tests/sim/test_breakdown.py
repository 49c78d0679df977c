"""summary.json's per_model and per_gpu_type blocks add up to the deployment they break down."""

import numpy as np

from sim.report import breakdown_lines
from sim.run import run_scenario


def test_per_model_and_per_gpu_type_add_up_to_the_deployment(topo):
    out = run_scenario("small", topo=topo, requests=1500)
    frame = out.requests
    for name in ("edge", "central"):
        block, cap = out.summary["deployments"][name], out.summary["capacity"][name]
        rows = frame[frame.deployment == name]
        models = block["per_model"]
        assert set(models) == set(rows.model.unique())
        assert sum(m["requests"] for m in models.values()) == len(rows)
        assert sum(m["ok"] for m in models.values()) == int((rows.outcome == "ok").sum())
        assert sum(m["replicas"] for m in models.values()) == cap["replicas"]
        for model, m in models.items():
            gen = rows[(rows.model == model) & (rows.task == "text-generation") & (rows.outcome == "ok") & ~rows.batch]
            assert m["gpus"] >= (1 if m["replicas"] else 0)
            if len(gen):
                assert m["ttft_p50_ms"] == round(float(gen.ttft_ms.median()), 2)
                assert m["ttft_p50_ms"] <= m["ttft_p95_ms"]
            else:
                assert m["ttft_p50_ms"] is None and m["e2e_p50_ms_one_shot"] is not None
        types = block["per_gpu_type"]
        assert sum(t["gpus"] for t in types.values()) == cap["gpus"]
        shares = [t["generation_share"] for t in types.values()]
        assert abs(sum(shares) - 1.0) <= 0.005 * len(shares)  # each rounded to two decimals
        busy = np.array([t["busy_share"] for t in types.values()])
        assert ((busy >= 0) & (busy <= 1)).all() and busy.max() > 0
        # the GPU-seconds with work per type, weighted by GPUs, are the deployment's busy GPU-seconds
        gpus = np.array([t["gpus"] for t in types.values()])
        assert abs((busy * gpus).sum() / gpus.sum() - block["gpu_utilisation"]) <= 0.006

    # report.md shows them side by side, edge / central, one row per model and per GPU type
    lines = breakdown_lines(out.summary)
    assert "## Where the gaps come from" in lines and "Each cell gives edge / central." in lines[3]
    edge, central = (out.summary["deployments"][n] for n in ("edge", "central"))
    for model, m in edge["per_model"].items():
        row = next(line for line in lines if line.startswith(f"| {model} |"))
        assert f"| {m['replicas']:,} / {central['per_model'][model]['replicas']:,} |" in row
    models = set(edge["per_model"]) | set(central["per_model"])
    types = set(edge["per_gpu_type"]) | set(central["per_gpu_type"])
    assert sum(line.startswith("| ") for line in lines) == 2 + len(models) + len(types)  # two header rows
