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
    assert proc.returncode == 143 and err.strip().endswith("edgepop: terminated")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_cli_leaves_rich_as_it_found_it(capsys):
    """``main`` turns rich's closed-pipe exit into 141 for its own run only: a library user's consoles keep
    rich's handling afterwards."""
    from rich.console import Console

    from edgepop.cli import main

    before = Console.on_broken_pipe
    assert main(["place", "--list-policies"]) == 0
    capsys.readouterr()
    assert Console.on_broken_pipe is before
