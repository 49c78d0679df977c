"""``edgepop serve`` (the live gateway) and ``edgepop replay`` (a trace against it, plus the simulator's view)."""

from __future__ import annotations

import argparse
import sys


def _csv(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``serve`` and ``replay`` to the ``edgepop`` parser."""
    p = subparsers.add_parser(
        "serve", help="run the live gateway: Workers AI / OpenAI HTTP API over real ONNX inference",
        description="Serve an emulated edge deployment: a few PoPs with data-plane engines, the control plane "
        "routing each request, and the topology's RTT injected per client location.")
    p.add_argument("--config", help="gateway TOML file (see docs/readme/gateway.md)")
    p.add_argument("--scenario", help="scenario name or file: its seed, last mile and edge router are used")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8787)
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
    p.add_argument("--router", help="routing policy (default session-affinity over nearest-with-capacity)")
    p.add_argument("--threads", type=int, help="onnxruntime intra-op threads per session (0: one per core)")
    p.add_argument("--prefix-cache-mb", type=int,
                   help="MiB of prompt-prefix KV each LM engine keeps for reuse (0: off, the default)")
    p.add_argument("--provider", choices=("auto", "cpu", "cuda"), help="onnxruntime execution provider")
    p.add_argument("--seed", type=int)
    p.add_argument("--no-warm", action="store_true", help="load models on first use instead of at start")
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=run_serve)

    r = subparsers.add_parser(
        "replay", help="send a request trace to a live gateway; compare with the simulator",
        description="Replay a trace (Azure CSV or Mooncake JSONL) from emulated client locations against a live "
        "gateway, record client-side TTFT/ITL/E2E, run the same requests through the simulator with a measured "
        "profile, and print the comparison.")
    r.add_argument("--live", required=True, help="gateway base URL (loopback only), e.g. http://127.0.0.1:8787")
    r.add_argument("--trace", required=True, help="trace file (.csv Azure, .jsonl Mooncake)")
    r.add_argument("--out", default="out/replay", help="output directory (default out/replay)")
    r.add_argument("--requests", type=int, default=100, help="replay the first N requests (default 100)")
    r.add_argument("--time-scale", type=float, default=1.0, help="divide inter-arrival times by this")
    r.add_argument("--model", default="@cf/meta/llama-3.2-1b-instruct", help="catalog model to call")
    r.add_argument("--max-prompt", type=int, default=256, help="cap prompt tokens (stand-ins are small)")
    r.add_argument("--max-output", type=int, default=32, help="cap output tokens")
    r.add_argument("--token", help="API token (default $EDGEPOP_TOKEN)")
    r.add_argument("--account", default="local", help="account id in the URL (default local)")
    r.add_argument("--concurrency", type=int, default=64, help="most requests in flight")
    r.add_argument("--profile", help="measured profile table for the simulator (default: measure one now)")
    r.add_argument("--profile-source", default="gateway", choices=("gateway", "engine"),
                   help="what to measure when no --profile is given: service times through the live gateway "
                        "(default) or of the bare LM engine")
    r.add_argument("--no-sim", action="store_true", help="only the live side")
    r.add_argument("--seed", type=int, default=0)
    r.set_defaults(func=run_replay)


def gateway_config(args: argparse.Namespace):
    """The GatewayConfig of ``serve`` flags (file, scenario, flags, tokens: later ones win)."""
    from dataplane.gateway.auth import load_tokens
    from dataplane.gateway.config import load_config, parse_location

    cfg = load_config(args.config)
    over = {}
    if args.scenario:
        from sim.scenario import load_scenario

        sc = load_scenario(args.scenario)
        over.update(scenario=sc.name, seed=sc.seed, last_mile_ms=sc.last_mile_ms, router=sc.edge.router)
        if sc.edge.pops:
            over["pops"] = list(sc.edge.pops)
    flags = dict(pops=_csv(args.pops), models=_csv(args.models), db=args.db, slots=args.slots,
                 queue_timeout_s=args.queue_timeout, request_timeout_s=args.request_timeout, router=args.router,
                 seed=args.seed, delay_scale=args.delay_scale, threads=args.threads, provider=args.provider,
                 lm_prefix_cache_mb=args.prefix_cache_mb)
    over.update({k: v for k, v in flags.items() if v is not None})  # flags given win over the scenario
    if args.default_location:
        over["default_location"] = parse_location(args.default_location, "--default-location")
    if args.no_delay:
        over["delay"] = False
    if args.no_auth:
        over["no_auth"] = True
    cfg = cfg.with_overrides(**over)
    tokens = {**cfg.tokens, **load_tokens(args.tokens)}
    cfg = cfg.with_overrides(tokens=tokens)
    cfg.validate("edgepop serve")
    return cfg


def run_serve(args: argparse.Namespace) -> int:
    import logging

    import uvicorn

    from dataplane.gateway.app import create_app

    cfg = gateway_config(args)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = create_app(cfg, warm=not args.no_warm)
    gw = app.state.gateway
    print(f"edgepop gateway on http://{args.host}:{args.port}  pops={','.join(cfg.pops)}  "
          f"replicas={len(gw.dep.placement)}  delay={'off' if not cfg.delay else f'x{cfg.delay_scale:g}'}  "
          f"auth={'off' if cfg.no_auth else f'{len(cfg.tokens)} tokens'}  batch db={gw.batch.store.path}"
          + (f"  (recovered {gw.batch.store.recovered} batch items)" if gw.batch.store.recovered else ""),
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    return 0


def run_replay(args: argparse.Namespace) -> int:
    import os

    from dataplane.gateway.replay import ReplayOptions, replay_and_compare

    opts = ReplayOptions(url=args.live, trace=args.trace, out=args.out, requests=args.requests,
                         time_scale=args.time_scale, model=args.model, max_prompt=args.max_prompt,
                         max_output=args.max_output, token=args.token or os.environ.get("EDGEPOP_TOKEN"),
                         account=args.account, concurrency=args.concurrency, profile=args.profile,
                         profile_source=args.profile_source,
                         simulate=not args.no_sim, seed=args.seed)
    report = replay_and_compare(opts, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(report)
    return 0
