"""The ``edgepop`` command: one sub-command per research job, registered by the package that owns it.

Each owning package exposes ``<package>.cli.register(subparsers)``, which adds its sub-commands and sets
``func`` on them. The command modules import their machinery inside the command functions, so that
``edgepop topology`` does not pay for onnxruntime.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading

from edgepop import __version__
from edgepop.errors import (
    MachineError,
    Terminated,
    UserError,
    forget_sigterm,
    on_sigterm,
    raise_if_terminated,
)

# Order is the order in `edgepop --help`.
COMMAND_MODULES = ("sim.cli", "sim.cli_frontier", "sim.cli_estimate", "controlplane.cli", "dataplane.cli",
                   "dataplane.gateway.cli", "sim.live.cli", "topology.cli", "sim.cli_validate")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgepop",
        description="Edge AI inference research toolkit: topology, placement, routing, simulation, real inference.",
    )
    parser.add_argument("--version", action="version", version=f"edgepop {__version__}")
    parser.add_argument("--plugin", action="append", metavar="MODULE_OR_FILE.py",
                        help="import a module (a name on the Python path, or a .py file) that registers your own "
                             "policies, before the command runs; repeatable, and read from EDGEPOP_PLUGINS "
                             "(comma-separated) too (docs/extending.md)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    parser.commands = sub.choices  # (name -> sub-command parser: main() has it report a flag it does not know)
    return parser


def _pipe_closed(console) -> None:
    """rich's handler of a closed pipe, as a BrokenPipeError: its own exits with status 1, so a table printed
    through rich ended ``edgepop ... | head`` with 1 where the plain prints end with 141."""
    console.quiet = True
    raise BrokenPipeError


def _run(args) -> int:
    try:
        return int(args.func(args) or 0)
    except Exception:
        # The handler's Terminated raised inside a library can come back as another exception (an import
        # machinery's ImportError or RuntimeError wrapping it): the flag says a SIGTERM ended the run.
        raise_if_terminated()
        raise


def plugin_args(argv: list[str]) -> list[str]:
    """The ``--plugin`` values given before the command (``edgepop --plugin x.py place ...``): read ahead of the
    parser, since a plugin's policies must be registered before a command's options are checked."""
    values, i = [], 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
        if argv[i] == "--plugin" and i + 1 < len(argv):
            values.append(argv[i + 1])
            i += 1
        elif argv[i].startswith("--plugin="):
            values.append(argv[i].removeprefix("--plugin="))
        i += 1
    return values


def _error(exc: BaseException) -> None:
    """One line on stderr; with EDGEPOP_TRACEBACK=1, the whole chained traceback before it."""
    if os.environ.get("EDGEPOP_TRACEBACK", "") not in ("", "0"):
        import traceback

        traceback.print_exception(exc, file=sys.stderr)
    print(f"edgepop: error: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    from edgepop.plugins import load_plugins

    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        load_plugins(plugin_args(argv))
    except UserError as exc:
        _error(exc)
        return 2
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # the sub-command's usage, not the top level's: that is where the flag was looked for
        chosen = parser.commands.get(args.command) if args.command else None
        if any(x == "--plugin" or x.startswith("--plugin=") for x in extra):  # (read before the command only)
            (chosen or parser).error("--plugin goes before the command: edgepop --plugin FILE.py "
                                     f"{args.command or 'COMMAND'} ...")
        (chosen or parser).error(f"unrecognized arguments: {' '.join(extra)}")  # (exits 2)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    # SIGTERM (a scheduler's kill, a timeout) unwinds like Ctrl-C, so a command's clean-up runs: staged output
    # folders are removed, pools shut down. ``serve`` installs its own handlers (graceful drain) while it serves.
    forget_sigterm()
    previous = signal.signal(signal.SIGTERM, on_sigterm) if threading.current_thread() is threading.main_thread() \
        else None
    from rich.console import Console

    rich_handler, Console.on_broken_pipe = Console.on_broken_pipe, _pipe_closed  # (restored below)
    try:
        code = _run(args)
        raise_if_terminated()  # a SIGTERM whose exception a finaliser swallowed still ends with 143
        sys.stdout.flush()  # here, where a closed pipe is caught below, not at exit
        return code
    except Terminated:
        print("edgepop: terminated", file=sys.stderr)
        return 143  # 128 + SIGTERM
    except UserError as exc:
        _error(exc)
        return 2
    except BrokenPipeError:  # the reader went away (``edgepop ... | head``): nothing more to say, and nowhere to
        # say it; stdout is pointed at /dev/null so the interpreter's own flush at exit does not complain either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a process killed by the signal
    except (OSError, MachineError) as exc:  # the machine's, not the user's input: a full disk, a vanished
        # folder, a busy port, a worker process killed
        print(f"edgepop: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("edgepop: interrupted", file=sys.stderr)
        return 130
    finally:
        Console.on_broken_pipe = rich_handler  # (a library user's rich consoles keep rich's own handling)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
