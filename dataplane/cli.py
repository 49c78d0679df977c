"""``edgepop profile``: time real ONNX inference on this machine and write the simulator's profile table; the
parsers of ``lora-check``, ``quantize`` (:mod:`dataplane.cli_live`) and ``speculate``. Commands import the runtime
when they run, not when ``edgepop --help`` builds the parsers."""

from __future__ import annotations

import argparse
import sys

from dataplane import cli_live
from edgepop.outputs import output_file


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the data plane's sub-commands to the ``edgepop`` parser."""
    p = subparsers.add_parser(
        "profile",
        help="measure LM prefill/decode, encoder, image and speech times on this machine",
        description="Time real ONNX inference (models built from code, cached on disk) and write the table "
        "(model, phase, batch_size, tokens, context, ms, provider, host) that the simulator reads.",
    )
    p.add_argument("--models", default=None,
                   help="comma-separated model names (default: gpt2-tiny,gpt2-small,minilm-l6-v2,resnet-small,"
                        "ctc-small); --list-models shows them all")
    p.add_argument("--quick", action="store_true", help="a small grid with few repeats (about a minute)")
    p.add_argument("--out", default=None, help="write the table here (.csv, or .parquet)")
    p.add_argument("--provider", default="auto", choices=("auto", "cpu", "cuda"), help="execution provider")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: one per core)")
    p.add_argument("--list-models", action="store_true", help="list registered models and exit")
    p.set_defaults(func=run_profile)
    cli_live.register(subparsers)  # lora-check and quantize live in their own module
    register_speculate(subparsers)  # (its parser here: dataplane.speculative imports onnx and the runtime)


def run_profile(args: argparse.Namespace) -> int:
    from dataplane import profiler, registry
    from dataplane.errors import InvalidInputError
    from dataplane.session import SessionConfig, threads_problem

    if args.list_models:
        for card in registry.list_models():
            kind = "synthetic" if card.synthetic else "pretrained"
            print(f"{card.name:<22} {card.task:<30} {kind:<10} {card.description}")
        return 0
    if problem := threads_problem(args.threads):
        raise InvalidInputError(f"--threads: {problem}")
    names = ([m.strip() for m in args.models.split(",") if m.strip()] if args.models is not None
             else list(profiler.DEFAULT_MODELS))
    if not names:
        raise InvalidInputError("--models is empty")
    if repeated := sorted({n for n in names if names.count(n) > 1}):  # (it would be measured, and written, twice)
        raise InvalidInputError(f"--models names {', '.join(repeated)} more than once")
    for name in names:
        registry.get_card(name)  # fail fast on a typo, before minutes of measuring
    if args.out:
        args.out = output_file(args.out)  # '~' expanded: written there, not to ./~
        if args.out.suffix not in profiler.TABLE_SUFFIXES:
            raise InvalidInputError(f"--out {args.out}: name a .csv or a .parquet file")
    grid = profiler.QUICK if args.quick else profiler.ProfileGrid()
    config = SessionConfig(provider=args.provider, intra_op_threads=args.threads)
    table = profiler.profile(names, grid, config, progress=lambda line: print(line, file=sys.stderr))
    if args.out:
        path = profiler.write_table(table, args.out)
        print(f"wrote {len(table)} rows to {path}")
    else:
        print(table.to_csv(index=False), end="")
    return 0


def register_speculate(subparsers: argparse._SubParsersAction) -> None:
    """``edgepop speculate``: greedy generation with and without speculation, timed, on the Net2Net pair."""
    p = subparsers.add_parser("speculate", help="speculative decoding on the tiny draft / Net2Net target pair",
                              description="Generate greedily from the Net2Net target with and without the tiny "
                              "draft's speculation; prints the text and one JSON line of figures.")
    p.add_argument("--prompt", default="Edge inference is", help="prompt text (byte tokens)")
    p.add_argument("--k", type=int, default=2, help="draft tokens proposed per round")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--noise", type=float, default=0.2, help="target noise (lower: draft and target agree more)")
    p.set_defaults(func=run_speculate)


def run_speculate(args: argparse.Namespace) -> int:
    """``edgepop speculate`` (:func:`dataplane.speculative.run_cli`)."""
    from dataplane.speculative import run_cli

    return run_cli(args)
