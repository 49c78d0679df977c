"""GPU types with their published spec figures, and the GPU nodes each PoP holds by tier."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from edgepop.errors import DataFileError, UserError
from topology.tables import DATA_DIR, Field, in_range, number, read_table

positive = in_range(1e-9, 1e9)
GPU_FIELDS = [
    Field("gpu"),
    Field("memory_gb", number, positive),
    Field("mem_bw_gbps", number, positive),
    Field("bf16_tflops", number, positive),
    Field("fp8_int8_tflops", number, positive),
    Field("interconnect_gbps", number, positive),
    Field("tdp_w", number, positive),
    Field("price_usd_hr", number, in_range(0, 1e4)),
]
NODE_SPEC = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9.\-]*)x(\d+)\s*$")
MAX_NODE_GPUS = 16
# GPU generation of the known GPU types (the service-time model's FP8, TF32 and efficiency tables key on it).
ARCHS = {"H100": "hopper", "H200": "hopper", "A100-80GB": "ampere", "A100": "ampere", "A40": "ampere",
         "L40S": "ada", "L4": "ada", "T4": "turing"}
KNOWN_ARCHS = ("ampere", "ada", "hopper", "turing")
_ARCH_WORD = re.compile(r"\b(" + "|".join(KNOWN_ARCHS) + r")\b")


def node_gpus(node) -> int:
    """The GPU count of a ``GPUxCOUNT`` node (1 to MAX_NODE_GPUS), else ValueError: the one check, used where a
    scenario is read and again where it places."""
    m = NODE_SPEC.match(node) if isinstance(node, str) else None
    if m is None or not 1 <= int(m.group(2)) <= MAX_NODE_GPUS:
        raise ValueError(f"node must be GPUxCOUNT with 1 to {MAX_NODE_GPUS} GPUs (e.g. H100x8), got {node!r}")
    return int(m.group(2))


def gpu_arch(name: str, notes: str = "", arch: str = "", where: tuple = ("<GPU table>", None)) -> str:
    """The architecture of a GPU row: its ``arch`` column if given, else the known type's, else the one known
    architecture its notes name; otherwise a DataFileError at ``where`` (path, row) listing the choices (a guess
    from free text picked Hopper for an Ada board and TF32 for a Turing one)."""
    choices = f"give an arch column ({', '.join(KNOWN_ARCHS)}) or use a known GPU name ({', '.join(ARCHS)})"
    arch = (arch or "").strip().lower()
    if arch:
        if arch not in KNOWN_ARCHS:
            raise DataFileError(where[0], where[1], "arch", f"unknown architecture {arch!r} (known: "
                                f"{', '.join(KNOWN_ARCHS)})")
        return arch
    if name in ARCHS:
        return ARCHS[name]
    named = set(_ARCH_WORD.findall((notes or "").lower()))
    if len(named) != 1:
        said = f"its notes name {', '.join(sorted(named))}" if named else "its notes name no architecture"
        raise DataFileError(where[0], where[1], "arch", f"GPU {name!r}: architecture unknown ({said}); {choices}")
    return named.pop()


def load_gpus(path: str | Path | None = None) -> pd.DataFrame:
    """GPU spec table (one row per type), indexed by nothing; column ``gpu`` is the type name. Column ``arch``
    (optional in the file) is filled by :func:`gpu_arch`, so a row whose architecture is unknown fails here."""
    path = Path(path) if path else DATA_DIR / "gpus.csv"
    lines: list = []
    table = read_table(path, GPU_FIELDS, unique="gpu", lines_out=lines)
    notes = table["notes"] if "notes" in table else [""] * len(table)
    given = table["arch"] if "arch" in table else [""] * len(table)
    table["arch"] = [gpu_arch(str(g), str(n or ""), str(a or ""), (path, line))
                     for g, n, a, line in zip(table.gpu, notes, given, lines, strict=True)]
    return table


def parse_node_list(text: str, gpu_types: set[str], where: tuple, table: str = "") -> list[tuple[str, int]]:
    """Parse ``"H100x8;L4x1"`` into [("H100", 8), ("L4", 1)]; ``where`` = (path, row) for errors; ``table``:
    the GPU table the types come from, named when one is unknown (a --gpus file without a type the tiers use)."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        m = NODE_SPEC.match(part)
        if not m:
            raise DataFileError(where[0], where[1], "nodes", f"{part!r} is not of the form GPUxCOUNT")
        gpu, count = m.group(1), int(m.group(2))
        if gpu not in gpu_types:
            raise DataFileError(where[0], where[1], "nodes", f"unknown GPU type {gpu!r} (known: {sorted(gpu_types)}"
                                f"{f', from {table}' if table else ''})")
        if not 1 <= count <= MAX_NODE_GPUS:
            raise DataFileError(where[0], where[1], "nodes", f"{count} GPUs in one node (allowed 1..{MAX_NODE_GPUS})")
        out.append((gpu, count))
    return out


def build_nodes(pops: pd.DataFrame, tiers: pd.DataFrame, gpus: pd.DataFrame,
                tiers_path: str | Path = "tiers.csv", gpus_path: str | Path = "") -> pd.DataFrame:
    """One row per GPU node: node_id, pop_id, gpu, gpus, memory_gb (node total), lat, lon. ``gpus_path``: the
    GPU table's file, named when a tier uses a type it lacks.

    Node ids are ``<POP>-<n>`` so that they read naturally in logs (``FRA-0`` is Frankfurt's first node).
    """
    types = set(gpus.gpu)
    per_tier = {}
    line_of = tiers.attrs.get("line_of_tier", {})
    for i, row in enumerate(tiers.itertuples(), start=2):
        per_tier[row.tier] = parse_node_list(row.nodes, types, (tiers_path, line_of.get(row.tier, i)), str(gpus_path))
    mem = dict(zip(gpus.gpu, gpus.memory_gb, strict=True))
    rows = []
    for pop in pops.itertuples():
        for n, (gpu, count) in enumerate(per_tier[pop.tier]):
            rows.append((f"{pop.id}-{n}", pop.id, gpu, count, mem[gpu] * count, pop.lat, pop.lon))
    return pd.DataFrame(rows, columns=["node_id", "pop_id", "gpu", "gpus", "memory_gb", "lat", "lon"])


def check_scale(scale) -> None:
    """A GPU inventory scale is a positive finite number (not a bool, which compares equal to 1)."""
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not np.isfinite(scale) or scale <= 0:
        raise UserError(f"GPU inventory scale must be a positive number, got {scale!r}")


class NoGpusLeft(UserError):
    """An inventory scale so small that no PoP keeps a GPU (a scenario names its file and field)."""


def scale_inventory(nodes: pd.DataFrame, pops: pd.DataFrame, scale: float) -> pd.DataFrame:
    """The node table with ``scale`` x the GPUs, deterministically (the edge GPU inventory knob).

    Every PoP gets ``scale`` x its GPUs, rounded so that the total is ``round(scale x GPUs)``: whole GPUs first,
    the leftover ones to the PoPs with the largest fractional share, larger metros first (so a small scale takes
    GPUs away from small cities first). PoPs of the top tier (megacities) get GPUs in pairs, so that their main
    server always holds a two-GPU tensor-parallel group (the smallest a 70B-class model needs). A PoP's GPUs fill
    its node list in tier order: whole copies of the list, then the first nodes (its main server first) up to
    the count, the last one possibly with fewer GPUs than its type's box. Node ids stay ``<POP>-<n>`` in that
    order, so a PoP's first node keeps its id at any scale.
    """
    check_scale(scale)
    if scale == 1.0 or nodes.empty:
        return nodes
    per_pop = nodes.groupby("pop_id", sort=False).gpus.sum()
    info = pops.set_index("id").reindex(per_pop.index)
    first = nodes.groupby("pop_id", sort=False).gpus.first().reindex(per_pop.index).to_numpy()
    top = info.tier.to_numpy() == info.tier.min()
    unit = np.where(top & (first >= 2), 2, 1)
    share = per_pop.to_numpy(dtype=float) * scale / unit  # in units (pairs for megacities)
    whole = np.floor(share + 1e-9).astype(int)
    left = int(round(float((share * unit).sum()))) - int((whole * unit).sum())
    metro = info.metro_pop.fillna(0).to_numpy()
    for i in np.lexsort((per_pop.index.to_numpy(), -metro, -np.round(share - whole, 9))):
        if left <= 0:
            break
        if unit[i] <= left and share[i] > whole[i] + 1e-9:
            whole[i] += 1
            left -= int(unit[i])
    whole = whole * unit
    target = dict(zip(per_pop.index, whole, strict=True))
    by_pop: dict[str, list[dict]] = {}  # each PoP's node records in table order, PoPs in order of first appearance
    for rec in nodes.to_dict("records"):  # one conversion: per-PoP to_dict costs ~1 ms each at 3,000 PoPs
        by_pop.setdefault(rec["pop_id"], []).append(rec)
    rows = []
    for pop, recs in by_pop.items():
        want = int(target[pop])
        k = 0
        while want > 0:
            rec = dict(recs[k % len(recs)])
            g = min(int(rec["gpus"]), want)
            rec["memory_gb"] = rec["memory_gb"] / rec["gpus"] * g
            rec["gpus"], rec["node_id"] = g, f"{pop}-{k}"
            rows.append(rec)
            want -= g
            k += 1
    if not rows:
        raise NoGpusLeft(f"GPU inventory scale {scale:g} leaves no GPU at all")
    return pd.DataFrame(rows, columns=nodes.columns)
