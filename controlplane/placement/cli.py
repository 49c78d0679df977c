"""``edgepop place``: place model replicas on the GPU fleet with a named policy and report coverage and memory.

The command's parser is :func:`controlplane.cli.register` (kept out of this package, which imports every policy).
"""

from __future__ import annotations

import argparse
import json
import tomllib
from datetime import UTC, datetime
from pathlib import Path

from edgepop.console import table_console
from edgepop.errors import UserError
from edgepop.outputs import native_output_to_stderr, output_folder, staged_output

OUTPUT_NAMES = frozenset({"placement.parquet", "summary.json"})  # what run writes into --out


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from controlplane.catalog import Catalog, default_catalog
    from controlplane.placement import PlacementProblem, check_policy_name, get_policy, policy_names
    from controlplane.placement.base import run_policy

    catalog = Catalog.load(args.catalog) if args.catalog else default_catalog()
    if args.list_policies:
        print(json.dumps(policy_names()) if args.json else "\n".join(policy_names()))
        return 0
    if args.list_models:
        return _list_models(catalog, args.json)
    if not args.policy:
        raise UserError("--policy is required (one of: " + ", ".join(policy_names()) + ")")
    check_policy_name(args.policy)  # before the options: an option's error must not hide a misspelt policy
    options = {}
    if args.baseline is not None:
        if args.policy != "central":
            raise UserError("--baseline applies to --policy central only")
        options["baseline"] = args.baseline
    if args.time_limit is not None:
        if args.policy != "ilp":
            raise UserError("--time-limit applies to --policy ilp only")
        options["time_limit_s"] = args.time_limit
    if not 0 < args.rps <= 1e9:  # (NaN fails too)
        raise UserError(f"--rps must be a positive number of requests/s up to 1e9, got {args.rps!r}")
    if args.candidates_k is not None and args.candidates_k < 1:
        raise UserError(f"--candidates-k must be at least 1, got {args.candidates_k}")
    policy = get_policy(args.policy, **options)  # bad options fail before the topology loads

    from topology import Topology

    if args.out:
        args.out = output_folder(args.out, staged=True, writes=OUTPUT_NAMES, command="place")  # ('~' expanded)
    topo = Topology.load().with_demand_weight(args.demand_weight)
    problem = PlacementProblem.build(topo, catalog, total_rps=args.rps, mix=_mix(args, catalog),
                                     when_utc=_when(args.at), candidates_k=args.candidates_k,
                                     utilisation_cap=args.utilisation_cap)
    if args.json:
        with native_output_to_stderr():  # (the solver's own prints would break the JSON on stdout)
            placement = run_policy(policy, problem, np.random.default_rng(args.seed))
    else:
        from rich.console import Console

        with Console(stderr=True).status(f"placing {len(problem.models)} models with {args.policy}..."):
            placement = run_policy(policy, problem, np.random.default_rng(args.seed))
    summary = placement.summary()
    summary["seed"] = args.seed
    if args.demand_weight != "population":  # (absent by population, the default)
        summary["demand_weight"] = args.demand_weight
    if args.out:
        with staged_output(args.out, OUTPUT_NAMES, command="place") as tmp:  # both files or neither
            placement.table.assign(gpu_index=placement.table.gpu_index.map(list)).to_parquet(
                tmp / "placement.parquet", index=False)
            (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_tables(summary, args.out)
    return 0


def _mix(args, catalog) -> dict[str, float] | None:
    if args.models is not None:
        ids = [m.strip() for m in args.models.split(",") if m.strip()]
        if not ids:
            raise UserError("--models: no model ids given")
        if repeated := sorted({m for m in ids if ids.count(m) > 1}):  # (split equally: a repeat would get no more)
            raise UserError(f"--models names {', '.join(repeated)} more than once: give shares with --mix")
        for m in ids:
            catalog[m]
        return {m: 1.0 for m in ids}
    if args.mix:
        path = args.mix
        try:
            text = path.read_text(encoding="utf-8-sig")
        except OSError as exc:
            raise UserError(f"--mix {str(path)!r}: cannot read ({exc.strerror})") from None
        except UnicodeDecodeError as exc:
            raise UserError(f"--mix {str(path)!r}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        try:
            raw = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            raise UserError(f"--mix {str(path)!r}: not valid {'TOML' if path.suffix == '.toml' else 'JSON'}: "
                            f"{exc}") from None
        if not isinstance(raw, dict) or not raw:
            raise UserError(f"--mix {str(path)!r}: expected a table of model id -> share")
        for model, share in raw.items():
            if isinstance(share, bool) or not isinstance(share, int | float):
                raise UserError(f"--mix {str(path)!r}: share of {model!r} is {share!r}, not a number")
        from controlplane.forecast import normalise_mix

        try:  # (checked here, where the file is known: a negative share, an unknown id, all zero)
            normalise_mix(raw, catalog)
        except UserError as exc:
            raise UserError(f"--mix {str(path)!r}: {str(exc).removeprefix('model mix: ')}") from None
        return {m: float(s) for m, s in raw.items()}
    if args.catalog:  # the built-in mix names the shipped catalog's models, which another catalog may lack
        from controlplane.forecast import DEFAULT_MIX

        missing = [m for m in DEFAULT_MIX if m not in catalog]
        if missing:
            raise UserError(f"--catalog {str(args.catalog)!r} has no model {missing[0]!r}, which the default mix "
                            "uses: pass --models or --mix with this catalog's model ids")
    return None


def _when(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UserError(f"--at {text!r} is not an ISO 8601 time (e.g. 2025-06-01T18:00)") from None
    when = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    if not 1900 <= when.year <= 2200:  # (the demand model shifts it by time zones: it must stay a date)
        raise UserError(f"--at {text!r}: the year must be in 1900-2200")
    return when


def _list_models(catalog, as_json: bool) -> int:
    frame = catalog.to_frame()[["id", "task", "precision", "replica_gb", "tp"]]
    if as_json:
        print(json.dumps(frame.round(3).to_dict("records"), indent=2))
        return 0
    from rich.table import Table

    t = Table(title=f"{len(frame)} models ({catalog.source})")
    for col in ("id", "task", "precision", "replica GB", "GPUs"):
        t.add_column(col, justify="left" if col in ("id", "task", "precision") else "right")
    for r in frame.itertuples():
        t.add_row(r.id, r.task, r.precision, f"{r.replica_gb:.1f}", str(r.tp))
    table_console().print(t)
    return 0


def print_tables(s: dict, out: Path | None) -> None:
    from rich.table import Table

    con = table_console()
    cov = list(s["coverage"])
    t = Table(title=f"{s['policy']} on {s['fleet']}: {s['replicas']} replicas, {s['total_rps']:g} req/s; share of "
                    "demand whose nearest replica is within")
    for col in ("model", "req/s", "replicas", "sites", *(c.replace("within_", "<=") for c in cov), "served",
                "mean RTT ms"):
        t.add_column(col, justify="left" if col == "model" else "right")
    for model, r in s["models"].items():
        rtt = "-" if r["mean_rtt_ms"] is None else f"{r['mean_rtt_ms']:.1f}"
        t.add_row(model, f"{r['demand_rps']:.1f}", str(r["replicas"]), str(r["sites"]),
                  *(f"{r[c]:.1%}" for c in cov), f"{r['served_share']:.1%}", rtt)
    t.add_row("all", f"{s['total_rps']:g}", str(s["replicas"]), "", *(f"{s['coverage'][c]:.1%}" for c in cov),
              f"{s['served_share']:.1%}", f"{s['mean_served_rtt_ms']:.1f}", style="bold")
    con.print(t)
    m = Table(title="GPU memory committed")
    for col in ("GPU", "used GB", "total GB", "share"):
        m.add_column(col, justify="left" if col == "GPU" else "right")
    for gpu, r in s["memory"]["by_gpu"].items():
        m.add_row(gpu, f"{r['used_gb']:,.0f}", f"{r['total_gb']:,.0f}", f"{r['share']:.1%}")
    mem = s["memory"]
    m.add_row("all", f"{mem['used_gb']:,.0f}", f"{mem['total_gb']:,.0f}", f"{mem['used_gb'] / mem['total_gb']:.1%}",
              style="bold")
    con.print(m)
    con.print(f"expected RTT per request (unserved at the penalty): {s['objective_ms']:.3f} ms; "
              f"unserved {s['unserved_rps']:.1f} req/s")
    if s["dropped_replicas"]:
        con.print(f"[yellow]{s['dropped_replicas']} planned replica(s) did not fit their GPUs and were dropped[/]")
    brief = {k: s["solver"][k] for k in ("baseline", "mode", "plan", "status", "milp_gap", "lower_bound_ms",
                                         "solve_s") if s["solver"].get(k) is not None}
    if brief:
        con.print("solver: " + ", ".join(f"{k}={v}" for k, v in brief.items()) + " (all figures: --json)")
    if out:
        con.print(f"wrote {out / 'placement.parquet'} and {out / 'summary.json'}")
