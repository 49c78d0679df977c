"""The default frontier with the demand raised, or every service time: a service-time model that overstates capacity.

    python benchmarks/frontier_demand_proxy.py [--kind demand|service|prefill|decode] [--factors 1.2,1.45,1.7]
        [--seeds 1,2,3] [--router least-ttft [--router-option KEY=NUMBER]] [--requests N] [--out DIR]

The calibrated roofline's simulated replica serves 1.2x (one client) to 1.7x (100-250 clients) the requests/s
measured on the engine it was checked against (docs/perf-model.md). Were it that optimistic, every replica would
have that much more work than the simulation gives it. This runs ``edgepop frontier`` (edge and the default
baseline, the default budgets and bisection, ``--seeds``) on copies of the embedded ``default`` scenario whose
``rps`` and ``requests`` are each multiplied by a factor (the same simulated span and diurnal day), and reports per
factor each line's least budget, the largest failing one, and the iso-SLO cost ratio with its kind and range. It
is a proxy, not the bias: the placement sees the higher demand (it would not see a slower replica), and a single
request's prefill and decode keep their speed. ``--requests`` sets the base request count (default: the
scenario's), multiplied by each factor like the rate.

``--kind service`` runs the bias itself instead, at its crudest: the copies keep the default's demand and set
``prefill_time_scale`` and ``decode_time_scale`` to the factor (controlplane/perf_scaled.py), so every prefill and
decode step of every replica takes that many times as long, and the placement plans with those slower replicas.
The measured bias grows with batch and context; a uniform factor does not, so this is the other bracket of the
question, not the answer. ``--kind prefill`` and ``--kind decode`` scale one phase only (the other stays at 1),
to tell which of the two moves the frontier. ``--router NAME`` routes both deployments of every copy by that policy
instead of the default's (its ``window_ms`` kept), e.g. ``least-ttft``, which counts the prefills queued at each
replica. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path

from edgepop.argtypes import int_list, json_line, positive_int


def factor_list(text: str) -> list[float]:
    """``--factors``: comma-separated numbers from 0.1 to 10, e.g. 1.2,1.45."""
    try:
        factors = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated numbers, got {text!r}") from None
    if not factors or not all(0.1 <= f <= 10 for f in factors):
        raise argparse.ArgumentTypeError(f"each factor must be between 0.1 and 10, got {text!r}")
    return factors


def scaled_scenario(factor: float, folder: Path, requests: int | None = None) -> Path:
    """A copy of the embedded ``default`` scenario with its workload's ``rps`` and ``requests`` x ``factor``."""
    import tomllib

    from sim.scenario import SCENARIO_DIR

    text = (SCENARIO_DIR / "default.toml").read_text()
    workload = tomllib.loads(text)["workload"]
    n = round((requests or int(workload["requests"])) * factor)
    rps = float(workload["rps"]) * factor
    text, k1 = re.subn(r"(?m)^requests = \d+", f"requests = {n}", text, count=1)
    text, k2 = re.subn(r"(?m)^rps = [0-9.]+", f"rps = {rps!r}", text, count=1)
    if (k1, k2) != (1, 1):  # (the copy would silently keep the default's load)
        raise RuntimeError("default.toml's [workload] has no 'requests = N' or 'rps = X' line to scale")
    path = folder / f"default_demand_x{factor:g}.toml"
    path.write_text(text)
    return path


def slowed_scenario(factor: float, folder: Path, requests: int | None = None,
                    phases: tuple[str, ...] = ("prefill", "decode")) -> Path:
    """A copy of the embedded ``default`` scenario with every prefill and/or decode step time (``phases``) x
    ``factor`` (``requests``: the copy's request count, default the scenario's)."""
    from sim.scenario import SCENARIO_DIR

    text = (SCENARIO_DIR / "default.toml").read_text()
    if requests is not None:
        text, k = re.subn(r"(?m)^requests = \d+", f"requests = {requests}", text, count=1)
        if k != 1:
            raise RuntimeError("default.toml's [workload] has no 'requests = N' line")
    # top-level fields go before the first table
    head, sep, tail = text.partition("\n[")
    fields = "".join(f"{phase}_time_scale = {factor!r}\n" for phase in phases)
    text = f"{head}\n{fields}{sep}{tail}"
    path = folder / f"default_{'service' if len(phases) == 2 else phases[0]}_x{factor:g}.toml"
    path.write_text(text)
    return path


def router_option(text: str) -> tuple[str, float]:
    """``--router-option``: KEY=NUMBER."""
    key, sep, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = None
    if not sep or not re.fullmatch(r"[a-z_]+", key) or number is None:
        raise argparse.ArgumentTypeError(f"must be KEY=NUMBER, e.g. prefill_estimate_scale=0.69, got {text!r}")
    return key, number


def with_router(path: Path, router: str, options: dict | None = None) -> Path:
    """The scenario copy at ``path`` with both deployments routed by ``router`` (their options kept, ``options``
    added), renamed."""
    text, k = re.subn(r'(?m)^router = "[^"]*"', f'router = "{router}"', path.read_text())
    if k != 2:  # (the copy would silently keep one side's router)
        raise RuntimeError(f"{path.name}: expected one 'router = ...' line in [edge] and one in [central], found {k}")
    extra = "".join(f", {key} = {value!r}" for key, value in (options or {}).items())
    text, k = re.subn(r"(?m)^router_options = \{ *(.*?) *\}$", lambda m: f"router_options = {{ {m.group(1)}{extra} }}",
                      text)
    if options and k != 2:
        raise RuntimeError(f"{path.name}: expected one 'router_options = {{...}}' line on each side, found {k}")
    tag = "".join(f"_{key}{value:g}" for key, value in (options or {}).items())
    out = path.with_name(f"{path.stem}_{router}{tag}.toml")
    out.write_text(text)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=("demand", "service", "prefill", "decode"), default="demand",
                    help="multiply the demand (default), every service time, or the prefill or decode times only "
                         "by each factor")
    ap.add_argument("--factors", type=factor_list, default=[1.2, 1.45, 1.7],
                    help="multiples, comma-separated (default 1.2,1.45,1.7)")
    ap.add_argument("--seeds", type=int_list, default=[1, 2, 3], help="comma-separated seeds (default 1,2,3)")
    ap.add_argument("--router", default=None,
                    help="route both deployments by this policy (default: the scenario's, nearest-balanced)")
    ap.add_argument("--router-option", action="append", type=router_option, default=[], metavar="KEY=NUMBER",
                    help="one more option of --router on both sides, e.g. prefill_estimate_scale=0.69 (repeatable)")
    ap.add_argument("--requests", type=positive_int, default=None,
                    help="base requests per run, x each factor (default: the scenario's)")
    ap.add_argument("--out", default=None, help="folder for the scenario copies and outputs (default: a temporary one)")
    args = ap.parse_args()
    from edgepop.errors import UserError
    from sim.frontier import run_frontier

    folder = Path(args.out or tempfile.mkdtemp(prefix="edgepop-demand-proxy-"))
    folder.mkdir(parents=True, exist_ok=True)
    if args.router is not None:
        from controlplane.routing import ROUTERS

        if args.router not in ROUTERS:
            ap.error(f"--router: unknown routing policy {args.router!r} (known: {', '.join(ROUTERS.names())})")
    elif args.router_option:
        ap.error("--router-option needs --router")
    out: dict = {"benchmark": "frontier_demand_proxy", "kind": args.kind, "router": args.router,
                 "router_options": dict(args.router_option), "seeds": args.seeds, "factors": {}}
    phases = {"service": ("prefill", "decode"), "prefill": ("prefill",), "decode": ("decode",)}.get(args.kind)

    def copy(factor: float, where: Path, requests: int | None) -> Path:
        return scaled_scenario(factor, where, requests) if phases is None else \
            slowed_scenario(factor, where, requests, phases)
    t0 = time.perf_counter()
    for factor in args.factors:
        path = copy(factor, folder, args.requests)
        if args.router is not None:
            path = with_router(path, args.router, dict(args.router_option))
        t1 = time.perf_counter()
        try:
            f = run_frontier(str(path), slo="ttft_p95_ms=500", seeds=args.seeds, out=folder / path.stem,
                             progress=False)
        except UserError as exc:  # a bad --seeds: one line, as edgepop frontier says it
            ap.error(str(exc))
        r = f.result
        out["factors"][f"{factor:g}"] = {
            "least_gpus": {k: d["min_gpus_for_slo"] for k, d in r["deployments"].items()},
            "fails_at_gpus": {k: d.get("fails_at_gpus") for k, d in r["deployments"].items()},
            "iso_slo_cost_ratio": r["iso_slo_cost_ratio"], "iso_slo_gpu_ratio": r["iso_slo_gpu_ratio"],
            "iso_slo_ratio_kind": r["iso_slo_ratio_kind"], "iso_slo_gpu_ratio_range": r["iso_slo_gpu_ratio_range"],
            "wall_s": round(time.perf_counter() - t1, 1)}
        print(f"{args.kind} x{factor:g}: least GPUs {out['factors'][f'{factor:g}']['least_gpus']}, cost ratio "
              f"{r['iso_slo_cost_ratio']} ({r['iso_slo_ratio_kind']})", flush=True)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json_line(out))


if __name__ == "__main__":
    main()
