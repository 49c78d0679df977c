"""``edgepop replay``: a trace against a live gateway, and the simulator's view of the same requests."""

from __future__ import annotations

import argparse
import os
import sys

from edgepop.rng import seed_arg


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``replay`` to the ``edgepop`` parser."""
    r = subparsers.add_parser(
        "replay", help="send a request trace to a live gateway; compare with the simulator",
        description="Replay a trace (Azure CSV or Mooncake JSONL) from emulated client locations against a live "
        "gateway, record client-side TTFT/TPOT/E2E and where each request's time went, run the same requests "
        "through the simulator (modelling the live host) with a profile measured on it, and print the "
        "comparison and both decompositions side by side.")
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
    r.add_argument("--profile-source", default=None, choices=("host", "gateway", "engine"),
                   help="what to measure when no --profile is given: the live-host profile (the engine alone, "
                        "engines sharing the host, the gateway's own costs; default), service times through the "
                        "live gateway, or the bare LM engine (these two measure no host rows: --host-model off)")
    r.add_argument("--profile-repeats", type=int, default=None,
                   help="measure the profile N times back to back and use each row's median (one measurement "
                        "scatters by 10-40%%; default 1)")
    r.add_argument("--host-model", default=None, choices=("live", "off"),
                   help="live (default): the simulator models the live host (engine iterations, shared cores, "
                        "the gateway's costs); off: every replica has a device of its own")
    r.add_argument("--no-sim", action="store_true", help="only the live side")
    r.add_argument("--repeat-live", action="store_true",
                   help="send the same requests again after the first live run and compare the two as the "
                        "simulation is compared (the live system's own repeatability: the floor under the errors)")
    r.add_argument("--seed", type=seed_arg, default=0, help="seed of the client location and prompt text drawn per "
                   "request (default 0)")
    r.set_defaults(func=run_replay)


def run_replay(args: argparse.Namespace) -> int:
    from edgepop.errors import UserError
    from edgepop.outputs import output_folder
    from sim.live.replay import ReplayOptions
    from sim.live.run import OUTPUTS, replay_and_compare

    check_replay_flags(args)
    # '~/dir' expanded: written there, not to ./~/dir; a folder named like an output file is refused now
    args.out = output_folder(args.out, writes=[n for n in OUTPUTS if "/" not in n])
    if args.repeat_live and (args.out / "repeat").exists() and not (args.out / "repeat").is_dir():
        raise UserError(f"--out {args.out}: {args.out / 'repeat'} is a file, where --repeat-live writes a folder "
                        f"(move it away or choose another --out)")

    opts = ReplayOptions(url=args.live, trace=args.trace, out=args.out, requests=args.requests,
                         time_scale=args.time_scale, model=args.model, max_prompt=args.max_prompt,
                         max_output=args.max_output, token=args.token or os.environ.get("EDGEPOP_TOKEN"),
                         account=args.account, concurrency=args.concurrency, profile=args.profile,
                         profile_source=args.profile_source or "host",
                         profile_repeats=1 if args.profile_repeats is None else args.profile_repeats,
                         simulate=not args.no_sim, seed=args.seed, repeat_live=args.repeat_live)
    report = replay_and_compare(opts, progress=lambda line: print(line, file=sys.stderr, flush=True),
                                host_model=args.host_model != "off")
    print(report)
    return 0


def check_replay_flags(args: argparse.Namespace) -> None:
    """Flags that would be ignored are refused: how to measure a profile when one is given, anything about the
    simulation when ``--no-sim`` leaves it out."""
    from edgepop.errors import UserError

    measuring = [f for f, v in (("--profile-source", args.profile_source), ("--profile-repeats", args.profile_repeats))
                 if v is not None]
    if args.no_sim:
        given = [*measuring, *(["--profile"] if args.profile else []),
                 *(["--host-model"] if args.host_model is not None else [])]
        if given:
            raise UserError(f"replay: {', '.join(given)} {'is' if len(given) == 1 else 'are'} for the simulation, "
                            "which --no-sim leaves out")
    elif args.profile and measuring:
        raise UserError(f"replay: {', '.join(measuring)} say how to measure a profile; --profile gives one")
