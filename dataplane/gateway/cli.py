"""``edgepop serve``: the live gateway (the replay against it is ``sim.live``'s ``edgepop replay``)."""

from __future__ import annotations

import argparse
import errno
import sys

from edgepop.errors import UserError
from edgepop.rng import seed_arg

# serve's flags by the GatewayConfig field each sets (errors name the flag a user typed)
_FLAG_OF = {"pops": "--pops", "models": "--models", "db": "--db", "slots": "--slots",
            "queue_timeout_s": "--queue-timeout", "request_timeout_s": "--request-timeout", "router": "--router",
            "seed": "--seed", "delay_scale": "--delay-scale", "threads": "--threads", "provider": "--provider",
            "lm_prefix_cache_mb": "--prefix-cache-mb", "max_wait_s": "--max-wait",
            "neuron_budget_per_day": "--neuron-budget", "drain_timeout_s": "--drain-timeout"}


def _csv(text: str | None) -> list[str] | None:
    """A comma-separated flag as a list (None when the flag is absent; an empty flag is an empty list, which the
    config refuses, rather than the defaults)."""
    return None if text is None else [t.strip() for t in text.split(",") if t.strip()]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``serve`` to the ``edgepop`` parser."""
    p = subparsers.add_parser(
        "serve", help="run the live gateway: Workers AI / OpenAI HTTP API over real ONNX inference",
        description="Serve an emulated edge deployment: a few PoPs with data-plane engines, the control plane "
        "routing each request, and the topology's RTT injected per client location.")
    p.add_argument("--config", help="gateway TOML file (see docs/gateway.md)")
    p.add_argument("--scenario", help="scenario name or file: its seed, last mile and [edge] deployment (placement, "
                   "router and options, autoscaler, queue limits, pops) are served")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8787, help="TCP port (default 8787)")
    p.add_argument("--pops", help="comma-separated PoP ids to emulate (default FRA,LHR,IAD,SJC,NRT,SIN)")
    p.add_argument("--models", help="comma-separated catalog model ids to serve")
    p.add_argument("--default-location", help="lat,lon of clients that send no location header")
    p.add_argument("--tokens", help="API tokens file (TOML/JSON [tokens] table); also $EDGEPOP_TOKENS")
    p.add_argument("--no-auth", action="store_true", help="serve everyone as account 'local' (loopback demos)")
    p.add_argument("--db", help="SQLite file for async batch jobs (default ./edgepop-batch.sqlite)")
    p.add_argument("--no-delay", action="store_true", help="do not inject WAN delays")
    p.add_argument("--delay-scale", type=float, help="multiply injected WAN delays")
    p.add_argument("--slots", type=int, help="concurrent requests per replica (default: catalog max_batch)")
    p.add_argument("--queue-timeout", type=float, help="seconds a request may wait in a queue (3007 after)")
    p.add_argument("--request-timeout", type=float, help="seconds an engine may take (3007 after)")
    p.add_argument("--max-wait", type=float, help="shed requests (429/3040 + Retry-After) whose estimated wait is "
                   "longer than this many seconds (default 2; 0: off)")
    p.add_argument("--no-rate-limit", action="store_true", help="no per-minute limits (default: Workers AI's)")
    p.add_argument("--neuron-budget", type=float, help="neurons each account may spend per UTC day (429/3036 "
                   "after; default 0: no budget)")
    p.add_argument("--drain-timeout", type=float, help="seconds SIGTERM/SIGINT waits for in-flight requests "
                   "(default 30)")
    p.add_argument("--open-ops", action="store_true",
                   help="serve /metrics, /edgepop/deployment and /edgepop/timings without a token")
    p.add_argument("--router", help="routing policy (default nearest-with-capacity, as in the simulator)")
    p.add_argument("--threads", type=int, help="onnxruntime intra-op threads per session (0: one per core)")
    p.add_argument("--prefix-cache-mb", type=int,
                   help="MiB of prompt-prefix KV each LM engine keeps for reuse (0: off, the default)")
    p.add_argument("--provider", choices=("auto", "cpu", "cuda"), help="onnxruntime execution provider")
    p.add_argument("--seed", type=seed_arg, help="seed of the anycast and router draws (the "
                   "simulator's streams for the same seed; default 0)")
    p.add_argument("--no-warm", action="store_true", help="load models on first use instead of at start")
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"),
                   help="the HTTP server's log level (default warning)")
    p.set_defaults(func=run_serve)


def gateway_config(args: argparse.Namespace):
    """The GatewayConfig of ``serve`` flags (file, scenario, flags, tokens: later ones win)."""
    from dataplane.gateway.auth import load_tokens
    from dataplane.gateway.config import load_config, parse_location

    cfg = load_config(args.config)
    over = {}
    if args.scenario:
        over.update(scenario_fields(args.scenario, args.config))
    flags = dict(pops=_csv(args.pops), models=_csv(args.models), db=args.db, slots=args.slots,
                 queue_timeout_s=args.queue_timeout, request_timeout_s=args.request_timeout, router=args.router,
                 seed=args.seed, delay_scale=args.delay_scale, threads=args.threads, provider=args.provider,
                 lm_prefix_cache_mb=args.prefix_cache_mb, max_wait_s=args.max_wait,
                 neuron_budget_per_day=args.neuron_budget, drain_timeout_s=args.drain_timeout)
    over.update({k: v for k, v in flags.items() if v is not None})  # flags given win over the scenario
    if args.default_location:
        over["default_location"] = parse_location(args.default_location, "--default-location")
    if args.no_delay:
        over["delay"] = False
    if args.no_rate_limit:
        over["rate_limit"] = False
    if args.open_ops:
        over["open_ops"] = True
    try:
        cfg = cfg.with_overrides(**over)
    except UserError as exc:
        raise UserError(name_flags(str(exc), flags)) from None
    tokens = {**cfg.tokens, **load_tokens(args.tokens)}
    # (who may call is no value a later config error is about: --no-auth and tokens keep the file's own name)
    cfg = cfg.with_overrides(tokens=tokens, no_auth=True if args.no_auth else None, source=cfg.source)
    cfg.validate("edgepop serve")
    return cfg


def scenario_fields(scenario: str, config: str | None) -> dict:
    """The GatewayConfig fields ``--scenario`` sets: every one its file sets, and the scenario's defaults of the
    others (the simulator's deployment) unless the gateway file ``config`` sets that field itself."""
    import tomllib
    from pathlib import Path

    from sim.scenario import SCENARIO_DIR, parse_scenario, read_named_toml

    doc, path = read_named_toml(scenario, SCENARIO_DIR, "scenario")
    sc = parse_scenario(doc, path.name, base_dir=path.parent)
    e, edge = sc.edge, doc.get("edge", {})
    # gateway field -> (whether the scenario file sets it, its value)
    values = {name: (name in doc, getattr(sc, name))
              for name in ("seed", "last_mile_ms", "last_mile", "gpu_inventory_scale", "anycast_misroute",
                           "demand_weight")}
    values["placement_policy"] = ("placement" in edge, e.placement)
    values.update({name: (name in edge, getattr(e, name)) for name in (
        "router", "autoscaler", "queue_limit", "queue_timeout_s")})
    # a policy's options go with it: a scenario setting the router sets its options too (none, if it names none)
    values.update({f"{name}_options": (name in edge or f"{name}_options" in edge, dict(getattr(e, f"{name}_options")))
                   for name in ("placement", "router", "autoscaler")})
    values["pops"] = ("pops" in edge, list(e.pops) if e.pops else None)
    in_file = set(tomllib.loads(Path(config).read_text(encoding="utf-8-sig"))) if config else set()  # (load_config read it already)
    return {"scenario": sc.name, "scenario_plan": scenario_plan(sc),
            **{k: v for k, (given, v) in values.items() if given or k not in in_file}}


def scenario_plan(sc):
    """The demand and estimate inputs the simulator plans ``sc``'s edge with (its workload generated, as a run
    would: a second or two for the default's 150,000 requests)."""
    from pathlib import Path

    from dataplane.gateway.scenario_plan import EDGE_FIELDS, ScenarioPlan
    from sim.run import prepare

    setup = prepare(sc)
    return ScenarioPlan(perf=sc.perf, prefill_time_scale=sc.prefill_time_scale,
                        decode_time_scale=sc.decode_time_scale, demand_rps=setup.mean_rps, mix=dict(setup.mix),
                        shape=setup.shape, typical_tokens=tuple(setup.typical),
                        deployment={name: getattr(sc.edge, name) for name in EDGE_FIELDS},
                        catalog=str(Path(sc.catalog).absolute()) if sc.catalog else None,
                        pops=tuple(sc.edge.pops) if sc.edge.pops else None)


def name_flags(text: str, flags: dict) -> str:
    """An error about a config field, naming the flag typed beside the field it sets (``flags``: field -> the
    flag's value, None when not given)."""
    for field_, flag in _FLAG_OF.items():
        if flags.get(field_) is not None and f"field {field_!r}" in text:
            text = text.replace(f"field {field_!r}", f"{flag} (field {field_!r})", 1)
    return text


def check_bindable(host: str, port: int) -> None:
    """A one-line error when ``host:port`` cannot be listened on (in use, or not an address of this machine)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UserError(f"--host {host!r}: not an address ({exc.strerror})") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: only a live listener conflicts
        try:
            sock.bind(addr)
        except OSError as exc:
            hint = "another server on that port?" if exc.errno == errno.EADDRINUSE else \
                "is it an address of this machine?" if exc.errno == errno.EADDRNOTAVAIL else "check --host and --port"
            raise UserError(f"cannot listen on {host}:{port} ({exc.strerror}): {hint}") from None


def run_serve(args: argparse.Namespace) -> int:
    import logging

    from dataplane.gateway.app import create_app
    from dataplane.gateway.server import gateway_server

    if not 1 <= args.port <= 65535:  # uvicorn would hang on an out-of-range port instead of failing
        raise UserError(f"--port must be 1-65535, got {args.port}")
    cfg = gateway_config(args)
    check_bindable(args.host, args.port)  # before the batch store opens: a second server must not touch it
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        app = create_app(cfg, warm=not args.no_warm)
    except UserError as exc:  # fields checked against the topology and catalog when the deployment is built
        raise UserError(name_flags(str(exc), {"pops": args.pops, "models": args.models})) from None
    gw = app.state.gateway
    print(f"edgepop gateway on http://{args.host}:{args.port}  pops={','.join(cfg.pops)}  "
          f"replicas={len(gw.backend.placement())}  delay={'off' if not cfg.delay else f'x{cfg.delay_scale:g}'}  "
          f"auth={'off' if cfg.no_auth else f'{len(cfg.tokens)} tokens'}  "
          f"max wait={f'{cfg.max_wait_s:g} s' if cfg.max_wait_s else 'off'}  "
          f"rate limits={'on' if cfg.rate_limit else 'off'}  batch db={gw.batch.store.path}"
          + (f"  (recovered {gw.batch.store.recovered} batch items)" if gw.batch.store.recovered else "")
          + (f"  scenario={cfg.scenario} (planned for {cfg.scenario_plan.demand_rps:.4g} req/s, typical request "
             f"{'/'.join(map(str, cfg.scenario_plan.typical_tokens))} tokens)" if cfg.scenario_plan else ""),
          file=sys.stderr, flush=True)
    backend = gw.backend
    if cfg.scenario_plan is not None and (line := cfg.scenario_plan.mismatch(
            list(backend.catalog.ids), list(cfg.pops), list(backend.topo.pops.id))):
        print(line, file=sys.stderr, flush=True)
    server = gateway_server(app, args.host, args.port, args.log_level)
    server.run()
    if server.should_exit:
        print("edgepop gateway: stopped", file=sys.stderr, flush=True)
    return 0
