"""A simulation's files: requests.parquet, utilisation.parquet, summary.json, report.md and its plots, written
into a folder all or nothing (staged in a temporary sibling, then moved into place)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgepop.outputs import MARKER, mark_folder, output_folder, staged_output

if TYPE_CHECKING:
    from sim.run import RunOutput

OUTPUT_NAMES = frozenset({"requests.parquet", "utilisation.parquet", "summary.json", "report.md", "ttft_gain_map.png",
                          "ttft_cdf.png", "utilisation.png", "sensitivity.png",
                          "seeds.png"})  # what write_outputs may write
# The sweeps of --sensitivity and --seeds: an earlier simulate's folder holds the marker write_outputs adds (its
# sweep.json alone does not tell it from the user's own `edgepop sweep --out`), listing the files it wrote; a folder
# without it is the user's (see edgepop.outputs.move_into_place).
FOLDERS = {"sensitivity": f"sensitivity/{MARKER}", "replicates": f"replicates/{MARKER}"}
FLAGS = {"sensitivity": "--sensitivity", "replicates": "--seeds"}  # (named in the marker)


def write_outputs(out: RunOutput, directory: str | Path, folders: dict[str, Path] | None = None) -> Path:
    """Write requests.parquet, summary.json, report.md and plots into ``directory`` (all or nothing).

    ``folders``: finished folders to move in with them, by name (a key of :data:`FOLDERS`) -> where they are now
    (best beside ``directory``, where moving one is a rename); an earlier run's folder of a name not given goes.
    """
    import shutil

    from sim.report import write_report  # (matplotlib: imported when files are written)

    folders = folders or {}
    directory = output_folder(directory, "output folder", staged=True,  # (a file in the way: one line, first)
                              writes=OUTPUT_NAMES | {FOLDERS[name] for name in folders}, command="simulate")
    with staged_output(directory, OUTPUT_NAMES | set(FOLDERS.values()), command="simulate") as tmp:
        for name, path in folders.items():
            shutil.move(str(path), str(tmp / name))
            mark_folder(tmp / name, f"edgepop simulate {FLAGS[name]}")
        t0 = time.perf_counter()
        out.requests.to_parquet(tmp / "requests.parquet", index=False)
        out.utilisation.to_parquet(tmp / "utilisation.parquet", index=False)
        t1 = time.perf_counter()
        write_report(out, tmp)
        perf = out.summary.setdefault("performance", {})
        perf["outputs_s"] = round(time.perf_counter() - t0, 2)  # parquet files, report.md and its plots
        perf["plots_s"] = round(time.perf_counter() - t1, 2)
        (tmp / "summary.json").write_text(json.dumps(out.summary, indent=2, default=json_default))
    return directory


def json_default(o):
    """``json.dumps``'s ``default`` for summaries holding numpy scalars."""
    if isinstance(o, np.integer | np.floating):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o)}")
