"""Ctrl-C and a sweep's local process pool, on real ``edgepop sweep`` processes: workers end quietly while they
still import, follow a command that ignores SIGINT, and a worker killed by a signal is named as such."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 300  # only against a hang: every wait below ends on an event, not on a clock


def _start(tmp_path: Path, ignore_sigint: bool = False) -> subprocess.Popen:
    """``edgepop sweep`` of two small variants on two workers, in a process group of its own (as a terminal's
    foreground job is, so that the test can signal all of it as Ctrl-C does)."""
    grid = tmp_path / "g.toml"
    grid.write_text('base = "small"\nrequests = 300\nseeds = [1, 2]\ndeployments = ["edge"]\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

    def child_setup():  # (ignored: as a non-interactive shell starts `cmd &`, inherited over exec)
        os.setsid()
        # set either way: a test run itself started as `cmd &` would otherwise hand its ignored SIGINT on
        signal.signal(signal.SIGINT, signal.SIG_IGN if ignore_sigint else signal.SIG_DFL)

    return subprocess.Popen([sys.executable, "-m", "edgepop", "sweep", "--grid", str(grid), "--workers", "2",
                             "--out", str(tmp_path / "out")], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, preexec_fn=child_setup)


def _workers(pid: int) -> list[int]:
    """The spawned pool workers of process ``pid`` (not multiprocessing's resource tracker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
        if ppid == pid and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


def _wait_for_workers(proc: subprocess.Popen) -> list[int]:
    deadline = time.monotonic() + HANG_GUARD_S
    while len(found := _workers(proc.pid)) < 2:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "no pool workers started"
        time.sleep(0.02)
    return found


@pytest.fixture
def started(tmp_path):
    procs = []

    def start(**kw):
        procs.append(_start(tmp_path, **kw))
        return procs[-1]

    yield start
    for proc in procs:  # whatever a failed assertion left running
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_ctrl_c_while_the_workers_import_prints_no_traceback(started):
    """Workers take seconds to import pandas and the simulator; a Ctrl-C then printed one traceback per worker
    (a KeyboardInterrupt inside an import, before the worker's own handler was installed)."""
    proc = started()
    _wait_for_workers(proc)
    time.sleep(0.3)  # into the workers' imports (the blocked signal makes any moment safe; this one was not)
    os.killpg(proc.pid, signal.SIGINT)
    err = proc.communicate(timeout=HANG_GUARD_S)[1]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert proc.returncode == 130 and err.strip().endswith("edgepop: interrupted"), err


def test_workers_of_a_command_that_ignores_ctrl_c_ignore_it_too(started):
    """A script's ``cmd &`` runs with SIGINT ignored and so carries on through the user's Ctrl-C; its workers
    died of it, and the sweep failed with a worker error blaming memory."""
    proc = started(ignore_sigint=True)
    _wait_for_workers(proc)
    deadline = time.monotonic() + HANG_GUARD_S
    while proc.poll() is None:  # Ctrl-C again and again, before and after the workers' own handler is set
        os.killpg(proc.pid, signal.SIGINT)
        assert time.monotonic() < deadline, "the sweep did not end"
        time.sleep(0.2)
    err = proc.communicate()[1]
    assert proc.returncode == 0 and "Traceback" not in err, err


@pytest.mark.parametrize("sig, said", [(signal.SIGINT, "was interrupted (SIGINT, Ctrl-C)"),
                                       (signal.SIGKILL, "was killed by signal SIGKILL")])
def test_a_worker_ended_by_a_signal_is_named(started, sig, said):
    """Only one worker gets the signal (a `kill` of its pid, the out-of-memory killer): the error says which
    signal ended it, not a guess, in one line (the machine's doing, not a bug: no traceback)."""
    proc = started()
    os.kill(_wait_for_workers(proc)[0], sig)
    err = proc.communicate(timeout=HANG_GUARD_S)[1]
    assert proc.returncode == 1 and f"a sweep worker process {said}" in err, err
    assert err.startswith("edgepop: error: ") and "Traceback" not in err, err
    assert "out of memory, killed" not in err and "if __name__" not in err, err


def test_a_pool_worker_ends_quietly_on_ctrl_c():
    """Ctrl-C reaches every process of the group: a worker ends at once with no traceback of its own, also when
    the signal came while SIGINT was still blocked (held back during its start)."""
    code = ("import os, signal, time\nfrom sim.pool_worker import quiet_on_interrupt\n"
            "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\nos.kill(os.getpid(), signal.SIGINT)\n"
            "quiet_on_interrupt()\ntime.sleep(30)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # (see _start)
    assert proc.returncode == 130 and proc.stderr == ""


def test_dead_workers_are_described_by_their_exit_codes():
    from sim.pool_worker import why_workers_died

    # the pool terminates the survivors (SIGTERM) itself: not a second cause beside the real one
    assert why_workers_died([-signal.SIGTERM, -signal.SIGKILL, None]) == (
        "a sweep worker process was killed by signal SIGKILL (the out-of-memory killer's signal, or kill -9)")
    assert why_workers_died([-signal.SIGTERM]) == "a sweep worker process was killed by signal SIGTERM"
    assert why_workers_died([1]).startswith("a sweep worker process exited with status 1 (a status, not a signal")
    assert "out of memory, killed" in why_workers_died([None, 0])


_SWEEP_FROM_PYTHON = """
import sys
from pathlib import Path

import sim.sweep_variant

_run_variant = sim.sweep_variant.run_variant


def endless_variant(task):  # (also run in the workers, which import this file as their main module)
    while True:  # the real variant, again and again: one that runs far longer than any hang guard
        _run_variant(task)


sim.sweep_variant.run_variant = endless_variant  # before sim.sweep takes it

from sim.frontier import run_frontier
from sim.grid import parse_grid
from sim.sweep import run_sweep

if __name__ == "__main__":
    grid = parse_grid({"base": "small", "requests": 2000, "seeds": [1, 2], "deployments": ["edge"]}, source="g")
    out = Path(sys.argv[1]) / "out"
    try:
        if sys.argv[2] == "sweep":
            run_sweep(grid, workers=2, out=out, progress=False)
        else:
            run_frontier("small", requests=2000, only="edge", budgets=[0.5, 1.0], workers=2, out=out, progress=False)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
"""


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (0 once it is gone)."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("entry", ["sweep", "frontier"])
def test_an_interrupt_of_the_python_process_alone_ends_a_running_sweep(tmp_path, entry):
    """A Jupyter kernel's interrupt is SIGINT to the kernel's process only: the workers never saw it, and
    ``run_sweep`` raised KeyboardInterrupt only once the running variants had finished (minutes at real sizes).
    The workers are now sent SIGINT themselves: the sweep ends without waiting for them, leaving no worker and no
    staging folder (``run_sweep``, and ``run_frontier``, whose pool serves every round). The variants here simulate
    again and again, without end: only the interrupt ends them.
    """
    script = tmp_path / "sweep.py"
    script.write_text(_SWEEP_FROM_PYTHON)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), entry], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # (see _start)
    try:
        workers = _wait_for_workers(proc)
        deadline = time.monotonic() + HANG_GUARD_S
        while min(_cpu_s(w) for w in workers) < 6.0:  # past their imports, into the variants
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the workers did not get going"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGINT)  # this process only, as a kernel interrupt sends it
        out, err = proc.communicate(timeout=60)  # a hang guard: the variants alone take minutes
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130 and out.strip() == "interrupted", err
    assert "Traceback" not in err, err
    deadline = time.monotonic() + 30
    while any(_alive(w) for w in workers):  # (reaped by the pool's shutdown; ended, never left running)
        assert time.monotonic() < deadline, "a worker process was left running"
        time.sleep(0.1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.py"]  # no output, no staging folder
