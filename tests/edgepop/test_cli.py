import pytest

from edgepop.cli import build_parser


def test_parser_builds():
    assert build_parser().prog == "edgepop"


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    """``edgepop ... | head``: the pipe closes before the output is written; no error message, no traceback."""
    import subprocess
    import sys

    # plain prints, and a table printed through rich (whose own handler exited with status 1)
    for argv in (["profile", "--list-models"], ["estimate", "--model", "@cf/meta/llama-3.1-8b-instruct", "--gpu", "L4"]):
        proc = subprocess.Popen([sys.executable, "-m", "edgepop", *argv], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.close()  # before the interpreter has even started: every write finds the pipe closed
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 141, argv
        assert err == "", argv


def test_sigterm_unwinds_a_command_and_its_staged_outputs_go(tmp_path):
    """A scheduler's kill (SIGTERM) unwinds like Ctrl-C: the sweep's staged folder beside --out is removed."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "edgepop", "sweep", "--grid", "policies", "--workers", "1",
                             "--out", str(tmp_path / "out")], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300  # a hang guard only: the sweep stages its folder within seconds
    while not any(p.name.startswith(".edgepop-sweep-") for p in tmp_path.iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=300)[1].decode()
    assert proc.returncode == 143 and err.strip().endswith("edgepop: terminated"), (proc.returncode, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == [], err


def _swallowed_sigterm():
    """The SIGTERM handler run inside a weakref callback, as Python may run it: its exception is printed as
    "ignored" and dropped (seen in a sweep: the command ran on and wrote its outputs)."""
    import gc
    import weakref

    from edgepop.errors import on_sigterm

    class Thing:
        pass

    thing = Thing()
    ref = weakref.ref(thing, lambda _ref: on_sigterm())
    del thing
    gc.collect()
    return ref


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped exception, on purpose
def test_a_sigterm_swallowed_by_a_finaliser_still_ends_the_command(tmp_path, monkeypatch, capsys):
    """The handler's flag outlives its dropped exception: no output is moved into place, and the command ends with
    143 rather than 0."""
    import edgepop.cli as cli
    from edgepop.errors import Terminated, forget_sigterm
    from edgepop.outputs import move_into_place

    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / "summary.json").write_text("{}")
    try:
        _swallowed_sigterm()
        with pytest.raises(Terminated):
            move_into_place(staged, tmp_path / "out")
        assert not (tmp_path / "out").exists() and (staged / "summary.json").exists()
    finally:
        forget_sigterm()

    parser = build_parser()
    parser.set_defaults(func=lambda args: (_swallowed_sigterm(), 0)[1])
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert cli.main([]) == 143
    assert capsys.readouterr().err.strip().endswith("edgepop: terminated")
    monkeypatch.undo()
    assert cli.main(["place", "--list-policies"]) == 0  # the next command starts with the flag cleared


def test_the_cli_leaves_rich_as_it_found_it(capsys):
    """``main`` turns rich's closed-pipe exit into 141 for its own run only: a library user's consoles keep
    rich's handling afterwards."""
    from rich.console import Console

    from edgepop.cli import main

    before = Console.on_broken_pipe
    assert main(["place", "--list-policies"]) == 0
    capsys.readouterr()
    assert Console.on_broken_pipe is before


@pytest.mark.parametrize(("argv", "prog"), [(["frontier", "--slo-ms", "-1"], "edgepop frontier"),
                                            (["validate", "--bogus"], "edgepop validate")])
def test_an_unknown_flag_after_a_subcommand_gets_that_subcommands_usage(capsys, argv, prog):
    from edgepop.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {prog} ")
    errors = [line for line in err.splitlines() if "error:" in line]
    assert errors == [f"{prog}: error: unrecognized arguments: {' '.join(argv[1:])}"]
