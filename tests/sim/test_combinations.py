"""Features combined at random (seeded): routers, placements, autoscalers, queue limits, techniques, faults, RTT
jitter, last mile, anycast misrouting and demand weighting, on small fleets under light to heavy load.

Each combination must run (no exception), end every request exactly once on each deployment, and give the same
rows and summary when run again in the same process and in another interpreter with another hash seed (nothing
may depend on set or dict order of strings, or on state a first run leaves behind). The features' own tests check
what each one does; these check that they run together.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from controlplane.autoscale import AUTOSCALERS
from controlplane.routing import ROUTERS
from sim.faults import FAULT_POLICIES
from sim.run import run_scenario
from sim.scenario import load_scenario
from sim.techniques.batch_policy import BATCH_POLICIES

ROOT = Path(__file__).resolve().parents[2]
# The shipped policies (a plugin another test registers in this process must not change the draws).
ROUTER_NAMES = ("adapter-aware", "latency-load", "least-ttft", "nearest-balanced", "nearest-with-capacity", "p2c",
                "prefix-aware", "session-affinity")
AUTOSCALER_NAMES = ("none", "reactive", "scheduled")
FAULT_POLICY_NAMES = ("fail", "retry")
BATCH_POLICY_NAMES = ("night", "none")
POPS = ("FRA", "LHR", "IAD", "SJC", "SIN", "NRT", "GRU", "SYD", "JNB", "BOM")
TECHNIQUES = ("prefix_cache", "speculative", "disaggregation", "lora", "chunked_prefill")
CASES = range(10)


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    return repr(value)


def _table(name: str, fields: dict) -> str:
    return f"[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in fields.items())


def scenario_text(case: int) -> str:
    """Combination ``case``: a scenario file's text (only combinations the scenario checks accept)."""
    r = random.Random(case)
    top = {"seed": r.randrange(100), "gpu_inventory_scale": r.choice([0.3, 1.0])}
    if r.random() < 0.3:
        top["jitter"] = True
    if r.random() < 0.3:
        top["last_mile"] = r.choice(["country", "continent"])
    if r.random() < 0.3:
        top["anycast_misroute"] = 0.2
    top["fault_policy"] = r.choice(FAULT_POLICY_NAMES)
    if random.Random(1000 + case).random() < 0.4:  # (its own draw: the others' sequence stays as it was)
        top["demand_weight"] = "internet_users"
    pops = r.sample(POPS, r.randrange(3, 7))
    workload = {"kind": "poisson", "requests": 400, "rps": r.choice([10.0, 50.0, 300.0]),
                "start_utc": "2024-03-20T12:00:00+00:00", "session_fraction": r.choice([0.0, 0.5]),
                "batch_fraction": r.choice([0.0, 0.2]), "adapter_fraction": r.choice([0.0, 0.3])}
    if r.random() < 0.4:  # one language model on a tenth of the GPUs, flooded: queues fill, requests are turned away
        workload.update(mix={"@cf/meta/llama-3.1-8b-instruct": 1.0}, rps=3000.0)
        top["gpu_inventory_scale"] = 0.1

    def deployment(central: bool) -> dict:
        d = {"router": r.choice(ROUTER_NAMES), "autoscaler": r.choice(AUTOSCALER_NAMES),
             "queue_limit": r.choice([1, 4, 64]), "queue_timeout_s": r.choice([0.5, 30.0])}
        if central:
            d.update(placement="central", baseline=r.choice(["global-6", "big3"]))
        else:
            d.update(placement=r.choice(["greedy-demand", "per-pop", "everywhere-fits"]), pops=pops,
                     fill_idle_gpus=r.random() < 0.5, utilisation_cap=r.choice([0.3, 0.7, 1.0]))
        return d

    tech = {name: True for name in TECHNIQUES if r.random() < 0.3}
    if tech.get("disaggregation"):  # (what disaggregation does not combine with: refused by the scenario checks)
        for name in ("prefix_cache", "lora", "chunked_prefill"):
            tech.pop(name, None)
    elif r.random() < 0.5:
        target = r.choice(pops)
        top["faults"] = [r.choice([f"pop:{target}@{r.randrange(0, 5)}+{r.randrange(1, 10)}",
                                   f"node:{target}-0@{r.randrange(0, 5)}+{r.randrange(1, 10)}"])]
    if tech.get("speculative") and tech.get("chunked_prefill"):
        del tech["speculative"]
    tech["batch_policy"] = r.choice(BATCH_POLICY_NAMES)
    if r.random() < 0.3:
        tech["precision"] = r.choice(["fp8", "int8", "int4"])
    text = "".join(f"{k} = {_toml(v)}\n" for k, v in top.items())
    return text + _table("workload", workload) + _table("edge", deployment(False)) + \
        _table("central", deployment(True)) + _table("techniques", tech)


def fingerprint(out) -> str:
    """A hash of the run's rows and summary (less its timings)."""
    h = hashlib.sha256(pd.util.hash_pandas_object(out.requests, index=True).to_numpy().tobytes())
    summary = {k: v for k, v in out.summary.items() if k != "performance"}
    h.update(json.dumps(summary, sort_keys=True, default=str).encode())
    return h.hexdigest()


def test_the_draws_name_shipped_policies():
    """The lists above are the shipped registries' names: a new policy joins the combinations."""
    for names, registry in ((ROUTER_NAMES, ROUTERS), (AUTOSCALER_NAMES, AUTOSCALERS),
                            (FAULT_POLICY_NAMES, FAULT_POLICIES), (BATCH_POLICY_NAMES, BATCH_POLICIES)):
        shipped = {n for n in registry.names() if registry.entry(n).target.__module__.split(".")[0] in
                   ("controlplane", "sim")}
        assert set(names) == shipped
    # and the ten combinations draw every router, autoscaler and technique, and faults under both policies
    drawn = [tomllib.loads(scenario_text(case)) for case in CASES]
    assert {d[k]["router"] for d in drawn for k in ("edge", "central")} == set(ROUTER_NAMES)
    assert {d[k]["autoscaler"] for d in drawn for k in ("edge", "central")} == set(AUTOSCALER_NAMES)
    assert {t for d in drawn for t, on in d["techniques"].items() if on is True} == set(TECHNIQUES)
    assert {d["fault_policy"] for d in drawn if d.get("faults")} == set(FAULT_POLICY_NAMES)
    assert {d.get("demand_weight", "population") for d in drawn} == {"population", "internet_users"}


@pytest.mark.parametrize("case", CASES)
def test_a_combination_runs_ends_every_request_once_and_repeats(case, tmp_path):
    path = tmp_path / f"combination{case}.toml"
    path.write_text(scenario_text(case))
    out = run_scenario(load_scenario(path))
    f = out.requests
    n = out.summary["requests"]
    for name, rows in f.groupby("deployment"):
        assert len(rows) == n and rows.request_id.is_unique, name
        assert set(rows.outcome) <= {"ok", "rejected", "failed"}, name
        ok = rows[rows.outcome == "ok"]
        assert ok.ttft_ms.notna().all() and ok.e2e_ms.notna().all(), name
        assert (rows[rows.outcome != "ok"].error_code > 0).all(), name
    assert set(f.deployment) == {"edge", "central"}
    again = run_scenario(load_scenario(path))
    pd.testing.assert_frame_equal(out.requests, again.requests)
    assert fingerprint(out) == fingerprint(again)
    if case < 2:  # another interpreter, another string hash seed: the same rows
        env = {**os.environ, "PYTHONHASHSEED": str(100 + case), "PYTHONPATH": str(ROOT)}
        code = ("import sys; sys.path.insert(0, sys.argv[2]); from sim.run import run_scenario; "
                "from sim.scenario import load_scenario; from test_combinations import fingerprint; "
                "print(fingerprint(run_scenario(load_scenario(sys.argv[1]))))")
        proc = subprocess.run([sys.executable, "-c", code, str(path), str(Path(__file__).parent)], env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip().splitlines()[-1] == fingerprint(out)
