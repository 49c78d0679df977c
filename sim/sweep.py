"""``edgepop sweep``: run every variant of a grid (:mod:`sim.grid`) in parallel and gather the results.

    from sim.sweep import run_sweep
    result = run_sweep("policies", engine="local", workers=2, out="sweep-out")
    result.summary          # one row per variant x deployment (also DIR/sweep_summary.parquet)
    result.requests()       # every request row with its variant columns (DIR/sweep.parquet)

Engines: ``local`` runs variants on a spawn-context process pool (``workers`` processes, default the CPU count;
``workers=1`` runs them in this process); ``ray`` runs them as Ray tasks on the cluster at ``RAY_ADDRESS`` or on a
local Ray instance started for the sweep. Each variant is a pure function of its scenario and seed (its own seeded
generators, see :func:`edgepop.rng.streams`), and results are assembled in variant order, so the outputs do not depend on
the engine, the worker count or the order in which variants finish.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from numbers import Integral
from pathlib import Path

import numpy as np
import pandas as pd

from edgepop.errors import MachineError, UserError, raise_if_terminated
from edgepop.outputs import output_folder, staged_output
from sim.grid import Grid, Variant, json_value, load_grid
from sim.sweep_plugins import check_grid_entries
from sim.sweep_variant import VariantTask, run_variant
from sim.trace_files import trace_source

ENGINES = ("local", "ray")
SWEEP_SUMMARY = frozenset({"sweep_summary.parquet", "sweep.json"})  # what a sweep writes without its request rows
SWEEP_OUTPUTS = SWEEP_SUMMARY | {"sweep.parquet", "sweep.png"}  # what a sweep writes


class SweepError(RuntimeError):
    """A variant failed with an unexpected error (a bug, not bad input); the message names the variant and holds
    the worker's traceback."""


class WorkersDied(SweepError, MachineError):
    """A worker process ended without a result (a signal, the out-of-memory killer): the machine's doing, said in
    one line by the CLI."""


@dataclass
class SweepResult:
    """What a sweep produced: the summary table, the output directory and the run's bookkeeping."""

    grid: Grid
    summary: pd.DataFrame
    path: Path
    wall_s: float
    variant_wall_s: list[float] = field(default_factory=list)

    def requests(self, columns: list[str] | None = None) -> pd.DataFrame:
        """Request rows of every variant (``DIR/sweep.parquet``), optionally only some columns."""
        return pd.read_parquet(self.path / "sweep.parquet", columns=columns)


def run_sweep(grid: str | Path | Grid, *, engine: str = "local", workers: int | None = None,
              out: str | Path = "edgepop-sweep", progress: bool | None = None, keep_requests: bool = True,
              advance=None, pool=None, staging: Path | None = None) -> SweepResult:
    """Run every variant of ``grid`` (an embedded grid name, a grid file or a parsed :class:`Grid`).

    Writes ``out/sweep.parquet`` (request rows with ``variant``, ``seed`` and one column per axis),
    ``out/sweep_summary.parquet`` (one row per variant x deployment), ``out/sweep.png`` (:mod:`sim.sweep_plot`)
    and ``out/sweep.json`` (the grid, the variants and their wall times), all or nothing; without request rows
    (``keep_requests=False``) the summary and sweep.json only. ``progress``: show a bar (default: when stderr is a terminal).
    A variant that fails stops the sweep with an error naming it (``UserError`` for bad input, else
    :class:`SweepError`). ``keep_requests=False`` keeps the summary only (no ``sweep.parquet``); ``advance``,
    when given, is called once per finished variant instead of showing the sweep's own bar. ``pool``: a
    :func:`local_pool` to run on (the local engine), kept open by the caller across several sweeps.
    ``staging``: an existing folder to write the outputs into and leave there, ``out`` untouched (a caller that
    adds files of its own, as the ablation does, then moves them all into place at once).
    """
    grid = grid if isinstance(grid, Grid) else load_grid(grid)
    if engine not in ENGINES:
        raise UserError(f"unknown sweep engine {engine!r} (known: {', '.join(ENGINES)})")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, Integral) or workers <= 0):
        raise UserError(f"workers must be a positive integer, got {workers!r}")
    workers = None if workers is None else int(workers)
    from sim.faults import check_fault_targets
    from sim.run import check_fleet_names, scenario_catalog
    from sim.scenario import no_central
    from topology import Topology

    topo = Topology.load()  # PoP, region and backbone names: the same for every variant
    for v in grid.variants:  # names a variant's own workload, fleets and faults refer to, before any variant runs
        try:                 # (a typo in the last variant would fail it after all the others)
            scenario_catalog(v.scenario)
            check_fleet_names(v.scenario, topo)
            check_fault_targets(v.scenario.faults, topo)
            if v.scenario.central is None and tuple(v.deployments or grid.deployments) == ("central",):
                raise UserError(f"only central asked for: {no_central(v.scenario.name)}; nothing to simulate")
        except UserError as exc:
            raise UserError(f"{grid.source}: variant {v.id} ({v.label}): {exc}") from None
    tasks = [VariantTask(v, grid.requests, grid.duration_s, v.deployments or grid.deployments, keep_requests)
             for v in grid.variants]
    # users' policies the variants use: one no worker process could import is refused here, before any variant
    leaves = engine == "ray" or pool is not None or min(workers or os.cpu_count() or 1, len(tasks)) > 1
    expected = check_grid_entries(grid, leaves)
    if staging is not None:  # a caller's staging folder is the caller's to move in or remove
        out = Path(staging)
        staged = contextlib.nullcontext(out)
    else:  # before the work: a file in the way would lose its results
        out = output_folder(out, "out", staged=True, writes=SWEEP_OUTPUTS if keep_requests else SWEEP_SUMMARY,
                            command="sweep")
        staged = staged_output(out, SWEEP_OUTPUTS, prefix=".edgepop-sweep-", command="sweep")
    t0 = time.perf_counter()
    with staged as tmp:
        sink = _Sink(grid, tmp)
        with progress_bar(len(tasks), progress if advance is None else False) as bar:
            def collect(result: dict) -> None:
                raise_if_terminated()  # a SIGTERM a finaliser swallowed ends the sweep at the next variant
                sink.add(result)
                (advance or bar)()

            if engine == "ray":
                from sim.sweep_ray import run_on_ray  # Ray is optional: imported only when asked for

                run_on_ray(tasks, workers, collect, expected)
            else:
                _run_local(tasks, workers, collect, pool, expected)
        summary = sink.finish()
        if keep_requests:  # (a frontier's or a seed set's inner sweeps keep their summary only: no figure)
            from sim.sweep_plot import plot_sweep

            one_seed = len({v.seed for v in grid.variants}) == 1  # (then no label needs its seed)
            plot_sweep(summary, [v.label.removesuffix(f", seed={v.seed}") if one_seed else v.label
                                 for v in grid.variants], tmp / "sweep.png")
        wall = time.perf_counter() - t0
        (tmp / "sweep.json").write_text(json.dumps(_manifest(grid, engine, workers, wall, sink.wall_s), indent=2,
                                                   default=json_value))
    return SweepResult(grid, summary, out, wall, sink.wall_s)


def local_pool(workers: int):
    """A process pool for the local engine. Spawn, not fork: a forked child would inherit threads (rich's
    refresher, BLAS pools) in unknown states. Its initializer lives in a module of its own with no heavy imports
    (see :mod:`sim.pool_worker`); it imports the modules of the policies registered from outside edgepop so far
    (:func:`edgepop.plugins.worker_modules`)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from edgepop.plugins import unshippable, worker_modules
    from sim.pool_worker import start_worker

    main = sys.modules.get("__main__")
    if getattr(main, "__file__", None) and getattr(getattr(main, "__spec__", None), "name", None) is None \
            and unshippable("__main__"):
        # A script read from standard input: spawned workers would run __main__ again from its '<stdin>' path
        # and die (a misleading "missing __main__ guard" then), whatever the grid uses.
        raise UserError(f"a sweep with {workers} worker processes cannot start from a script read from standard "
                        f"input (its workers would run it again, and it has no file): run the script from a file, "
                        "or with workers=1")
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=start_worker, initargs=(worker_modules(),))


def _run_local(tasks: list[VariantTask], workers: int | None, collect, pool=None, expected=()) -> None:
    import contextlib

    from sim.pool_worker import run_task, sigint_blocked, stop_pool, why_workers_died

    workers = min(workers or os.cpu_count() or 1, len(tasks))
    if workers <= 1 and pool is None:
        for task in tasks:
            collect(run_variant(task))
        return
    from concurrent.futures import FIRST_COMPLETED, wait
    from concurrent.futures.process import BrokenProcessPool

    with (contextlib.nullcontext(pool) if pool is not None else local_pool(workers)) as pool:
        failed = None  # (variant id, error) of the lowest failing variant: reported whatever finished first
        try:  # (a Ctrl-C held back while the workers start is raised as the block ends: inside the try)
            with sigint_blocked():  # a spawn pool starts its workers in submit(), in this thread
                pending = {pool.submit(run_task, t, expected[i] if expected else (), run_variant)
                           for i, t in enumerate(tasks)}
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in sorted(done, key=lambda f: f.result()["id"]):
                    try:
                        collect(fut.result())
                    except (UserError, SweepError) as exc:
                        # Start no more; the running ones end, and every variant below this one has started
                        # (the pool takes them in order), so the lowest failure among them is the grid's first.
                        pending = {f for f in pending if not f.cancel()}
                        if failed is None or fut.result()["id"] < failed[0]:
                            failed = (fut.result()["id"], exc)
        except BrokenProcessPool:
            # the pool's own record of its workers (a private attribute; without it the message is a guess),
            # read once shutdown has joined them all and so knows every exit code
            workers = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=True)
            raise WorkersDied(why_workers_died([p.exitcode for p in workers])) from None
        except BaseException as exc:
            stop_pool(pool, exc)  # start no more; on an interrupt, end the running ones too
            raise
        if failed is not None:
            raise failed[1]


class _Sink:
    """Receives variant results in any order; writes each variant's request rows to its own part file at once
    (memory stays at about one variant) and assembles everything in variant order at the end."""

    def __init__(self, grid: Grid, tmp: Path):
        self.grid, self.tmp = grid, tmp
        self.parts = tmp / "parts"
        self.parts.mkdir()
        self.rows: dict[int, list[dict]] = {}
        self.walls: dict[int, float] = {}

    def _columns(self, variant: Variant) -> dict:
        cols = {"variant": variant.id, "seed": variant.seed}
        if self.grid.names:
            cols["variant_name"] = variant.name
        for key, value in variant.values.items():
            cols[key] = self.grid.axis_column(key)[self.grid.axes[key].index(value)]
        return cols

    def add(self, result: dict) -> None:
        variant = self.grid.variants[result["id"]]
        if "error" in result:
            msg = f"{self.grid.source}: variant {variant.id} ({variant.label}) failed: {result['error']}"
            if result["user_error"]:
                raise UserError(msg)
            raise SweepError(f"{msg}\n--- worker traceback ---\n{result['traceback']}")
        cols = self._columns(variant)
        frame = result["requests"]
        if frame is not None:
            frame = pd.concat([pd.DataFrame(cols, index=frame.index), frame], axis=1)
            frame.to_parquet(self.parts / f"variant-{variant.id:06d}.parquet", index=False)
        self.rows[variant.id] = [{**cols, **row} for row in result["summary"]]
        self.walls[variant.id] = round(result["wall_s"], 3)
        self._warn_unapplied(variant, result.get("faults_skipped") or {})

    def _warn_unapplied(self, variant: Variant, skipped: dict) -> None:
        """One line on stderr for a variant with faults that none of its deployments applied (a node id no fleet
        has, a start after the run): it ran as if they were not there."""
        from sim.faults import fault_spec

        unapplied = []
        for f in variant.scenario.faults:
            spec = fault_spec(f)
            why = {name: line.removeprefix(f"{spec}: ") for name, lines in skipped.items() for line in lines
                   if line.startswith(f"{spec}: ")}
            if skipped and len(why) == len(skipped):
                unapplied.append(f"{spec} ({'; '.join(f'{n}: {w}' for n, w in why.items())})")
        if unapplied:
            print(f"warning: {self.grid.source}: variant {variant.id} ({variant.label}): fault not applied: "
                  + ", ".join(unapplied), file=sys.stderr)

    @property
    def wall_s(self) -> list[float]:
        return [self.walls[i] for i in sorted(self.walls)]

    def finish(self) -> pd.DataFrame:
        ids = sorted(self.rows)
        assert ids == list(range(len(self.grid.variants))), "every variant reports exactly once"
        files = [f for f in (self.parts / f"variant-{i:06d}.parquet" for i in ids) if f.exists()]
        if files:
            self._write_requests(files)
        shutil.rmtree(self.parts)
        summary = pd.DataFrame([row for i in ids for row in self.rows[i]])
        summary = summary.fillna(np.nan).infer_objects()  # None (no data) -> NaN in numeric columns
        summary.to_parquet(self.tmp / "sweep_summary.parquet", index=False)
        return summary

    def _write_requests(self, files: list[Path]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.unify_schemas([pq.read_schema(f) for f in files], promote_options="permissive")
        with pq.ParquetWriter(self.tmp / "sweep.parquet", schema) as writer:
            for f in files:  # variants may differ in columns (a technique's own): missing ones are null
                t = pq.read_table(f)
                for field in schema:
                    if field.name not in t.column_names:
                        t = t.append_column(field, pa.nulls(len(t), field.type))
                writer.write_table(t.select(schema.names).cast(schema))


def _manifest(grid: Grid, engine: str, workers: int | None, wall: float, walls: list[float]) -> dict:
    return {"grid": grid.source, "base": grid.base, "description": grid.description, "engine": engine,
            "workers": workers, "requests": grid.requests, "duration_s": grid.duration_s,
            "deployments": list(grid.deployments), "seeds": list(grid.seeds), "axes": grid.axes,
            "wall_s": round(wall, 2),
            "names": list(grid.names), "baseline": grid.baseline,
            # the trace files the variants replay (each once), named and hashed as simulate's summary.json does
            "traces": [trace_source(w) for w in {(w.trace, w.kind): w for w in (v.scenario.workload
                                                                                 for v in grid.variants)
                                                 if w.is_trace}.values()],
            "variants": [{"variant": v.id, "name": v.name, "seed": v.seed, "values": v.values, "wall_s": w}
                         for v, w in zip(grid.variants, walls, strict=True)]}


class progress_bar:
    """Items done / total on stderr, with elapsed time; a no-op when disabled (``None``: when stderr is a
    terminal). Entering it gives the function that advances it by one."""

    def __init__(self, total: int, enabled: bool | None, name: str = "sweep", unit: str = "variants"):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        enabled = console.is_terminal if enabled is None else enabled
        self.bar = Progress(TextColumn(f"[bold]{name}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
                            TimeElapsedColumn(), console=console, transient=True, disable=not enabled)
        self.total, self.name = total, name

    def __enter__(self):
        self.bar.__enter__()
        task = self.bar.add_task(self.name, total=self.total)
        return lambda: self.bar.advance(task)

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)
