from edgepop.cli import build_parser


def test_parser_builds():
    assert build_parser().prog == "edgepop"


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    """``edgepop ... | head``: the pipe closes before the output is written; no error message, no traceback."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "edgepop", "profile", "--list-models"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the interpreter has even started: every write finds the pipe closed
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert err == ""
