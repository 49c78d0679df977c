"""Derived RTT matrices (cities x sites) cached in memory and on disk, keyed by a hash of everything they
depend on, so that a stale matrix can never be used.

Every run needs the same few large matrices (about 19,000 demand cities x 339 PoPs, and x the cloud regions);
computing one takes seconds, reading it back milliseconds. The key of a matrix is a SHA-256 over: the source code
of the latency model (``topology.latency``, ``topology.geo`` and ``topology.borders``, and the version of the
city table points take their countries from), the model's parameters, its all-pairs backbone matrix (by the key of
the links it is computed from, unless it was set by hand), node coordinates and countries, the query
coordinates and the requested site nodes. Change any of them and the key
changes. Files are ``.npy`` under ``$EDGEPOP_CACHE_DIR`` or the user cache directory
(``$XDG_CACHE_HOME/edgepop/rtt``, default ``~/.cache/edgepop/rtt``), written atomically; an unreadable file or
one of the wrong shape is recomputed. ``EDGEPOP_NO_CACHE=1`` turns the disk cache off. Small queries (a single
user) bypass the cache.

The core RTTs between backbone nodes (every ingress PoP x every site of a fleet, which placement and routing read)
are kept the same way, keyed by the model's hash and the two node lists.

The backbone itself is kept the same way under ``backbone/`` in that folder: its links (a distance matrix and a
nearest-neighbour sort of every node), keyed by the code, the nodes, the cable table and the options, and its
all-pairs matrix (seconds of shortest paths at thousands of PoPs), keyed by the code, the parameters, the node
count and every link's ends and cost. The anycast ingress of a set of points (each one's nearest PoP and its RTT)
is kept next to the matrices, keyed by the matrix's key and the last mile, so that a warm run never reads the
users x PoPs matrix.
"""

from __future__ import annotations

import hashlib
import inspect
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np

from topology import borders, geo
from topology.cache_files import cache_dir, write_atomic

MIN_CELLS = 200_000  # below this much work a matrix is cheaper to compute than to hash and look up
_MEMORY: OrderedDict = OrderedDict()
_MEMORY_ENTRIES = 8
_CODE_DIGESTS: dict = {}


# What reading a damaged cache file raises (then it is recomputed): an empty file (a crash or a full disk after the
# rename) is EOFError, a truncated .npz BadZipFile, a missing array KeyError, a bad header ValueError.
UNREADABLE = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile)


def _code_digest(model) -> str:
    """Hash of the source of the model's module, of ``topology.geo``, ``topology.borders`` and this module, and of
    the city table points take their countries from."""
    return _module_digest(inspect.getmodule(type(model)))


def _module_digest(module) -> str:
    got = _CODE_DIGESTS.get(module)
    if got is None:
        h = hashlib.sha256()
        for m in (module, geo, borders, inspect.getmodule(_code_digest)):
            h.update(inspect.getsource(m).encode())
        h.update(borders.cities_version().encode())  # points take their countries from these cities
        got = _CODE_DIGESTS[module] = h.hexdigest()
    return got


def model_digest(model) -> str:
    """Hash of a latency model: code, parameters, backbone matrix, node coordinates and countries (memoised on the
    model, for the arrays it was taken of: a copy of the model given another backbone matrix is hashed again). While the
    backbone matrix is the one the model derives from its links, it is hashed by the key of those inputs
    (:func:`paths_key`), so that a run whose derived matrices are all cached never reads or hashes it (0.2 GB at
    3,000 PoPs)."""
    backbone = model.paths_key if model.paths_key is not None else model.node_ms
    arrays = (backbone, model.node_lat, model.node_lon, model.node_codes)
    got = getattr(model, "_digest", None)
    if got is None or any(x is not y for x, y in zip(got[0], arrays, strict=True)) or got[1] != repr(model.params):
        h = hashlib.sha256(_code_digest(model).encode())
        h.update(repr(model.params).encode())
        for a in arrays:
            if isinstance(a, str):
                h.update(b"paths:" + a.encode())
            else:
                h.update(np.ascontiguousarray(a, dtype=np.float64))
        got = model._digest = (arrays, repr(model.params), h.hexdigest())
    return got[2]


def matrix_key(model, lat: np.ndarray, lon: np.ndarray, site_nodes: np.ndarray) -> str:
    """The cache key of an RTT matrix: a hash of the latency model, the cities' coordinates and the sites."""
    h = hashlib.sha256(model_digest(model).encode())
    for a, dtype in ((lat, np.float64), (lon, np.float64), (site_nodes, np.int64)):
        h.update(np.ascontiguousarray(a, dtype=dtype))
        h.update(b"|")
    return h.hexdigest()


def cached_matrix(model, lat: np.ndarray, lon: np.ndarray, site_nodes: np.ndarray, compute) -> np.ndarray:
    """``compute()`` (a float32 matrix of shape (len(lat), len(site_nodes))), or the same matrix from the cache.

    The returned array is read-only: callers that adjust it make a copy (``m + last_mile``)."""
    shape = (lat.size, site_nodes.size)
    # The work grows with points x backbone nodes (every point is first attached to its nearest nodes), not with
    # the cells: the demand cities x six cloud regions take as long to compute as the cities x the PoPs.
    if shape[0] * (shape[1] + model.node_lat.size) < MIN_CELLS:
        return compute()
    key = matrix_key(model, lat, lon, site_nodes)
    hit = _MEMORY.get(key)
    if hit is not None:
        _MEMORY.move_to_end(key)
        return hit
    folder = cache_dir()
    path = folder / f"{key}.npy" if folder is not None else None
    m = None
    if path is not None and path.is_file():
        try:
            m = np.load(path, allow_pickle=False)
        except UNREADABLE:
            m = None
        if m is not None and (m.shape != shape or m.dtype != np.float32):
            m = None
    if m is None:
        m = np.asarray(compute(), dtype=np.float32)
        if path is not None:
            _write(path, m)
    m.setflags(write=False)
    _MEMORY[key] = m
    while len(_MEMORY) > _MEMORY_ENTRIES:
        _MEMORY.popitem(last=False)
    return m


def cached_node_rtt(model, a: np.ndarray, b: np.ndarray, compute) -> np.ndarray:
    """``compute()``, the core RTT matrix (float64) between backbone nodes ``a`` (rows) and ``b`` (columns), or the
    same matrix from the disk cache (a writable array: callers adjust it in place)."""
    folder = cache_dir()
    shape = (a.size, b.size)
    if folder is None or shape[0] * shape[1] < MIN_CELLS:
        return compute()
    h = hashlib.sha256(model_digest(model).encode())
    h.update(b"node-rtt|")
    for x in (a, b):
        h.update(np.ascontiguousarray(x, dtype=np.int64))
        h.update(b"|")
    return _float64_file(folder / f"{h.hexdigest()}.nodes.npy", shape, compute)


def _float64_file(path: Path, shape: tuple, compute) -> np.ndarray:
    """The float64 matrix of ``shape`` kept at ``path``, or ``compute()`` written there (a file that cannot be
    read, or holds another shape or type, is computed again)."""
    if path.is_file():
        try:
            m = np.load(path, allow_pickle=False)
            if m.shape == shape and m.dtype == np.float64:
                return m
        except UNREADABLE:
            pass
    m = compute()
    _write(path, m)
    return m


def paths_key(model, n: int, i: np.ndarray, j: np.ndarray, ms: np.ndarray) -> str:
    """The key of the all-pairs shortest-path matrix of the graph of ``n`` nodes and links ``i``-``j`` costing
    ``ms``: the code, the parameters, the node count and every link's ends and cost."""
    h = hashlib.sha256(_code_digest(model).encode())
    h.update(repr(model.params).encode())
    h.update(np.int64(n).tobytes())
    for a, dtype in ((i, np.int64), (j, np.int64), (ms, np.float64)):
        h.update(np.ascontiguousarray(a, dtype=dtype))
        h.update(b"|")
    return h.hexdigest()


def cached_paths(key: str, n: int, compute) -> np.ndarray:
    """``compute()``, the all-pairs shortest-path matrix (float64, n x n) whose :func:`paths_key` is ``key``, or
    the same matrix from the disk cache."""
    folder = cache_dir()
    if folder is None or n * n < MIN_CELLS:
        return compute()
    return _float64_file(folder / "backbone" / f"{key}.npy", (n, n), compute)


def cached_argmin(model, lat: np.ndarray, lon: np.ndarray, site_nodes: np.ndarray, add: np.ndarray, compute):
    """``compute()``: per point, the column of the smallest value of its row of the points x ``site_nodes`` matrix
    plus ``add`` (float32, one per point) and that value, ``(index int64, value float32)``; or the same from the
    disk cache, without reading the matrix (a users x PoPs matrix is 0.2 GB at 3,000 PoPs)."""
    folder = cache_dir()
    n = lat.size
    if folder is None or n * site_nodes.size < MIN_CELLS:
        return compute()
    h = hashlib.sha256(matrix_key(model, lat, lon, site_nodes).encode())
    h.update(np.ascontiguousarray(add, dtype=np.float32))
    path = folder / f"{h.hexdigest()}.argmin.npz"
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as z:
                index, value = z["index"], z["value"]
            if index.shape == value.shape == (n,) and index.dtype == np.int64 and value.dtype == np.float32:
                return index, value
        except UNREADABLE:
            pass
    index, value = compute()
    _write(path, {"index": np.asarray(index, np.int64), "value": np.asarray(value, np.float32)})
    return index, value


LINK_COLUMNS = ("i", "j", "km", "kind", "system")
MIN_LINK_NODES = 1000  # below this the links take milliseconds


def cached_links(nodes, cables, options: tuple, compute):
    """``compute()``, the backbone's link table (columns ``LINK_COLUMNS``) over ``nodes`` with the named ``cables``
    and ``options``, or the same table from the disk cache."""
    import pandas as pd

    folder = cache_dir()
    if folder is None or len(nodes) < MIN_LINK_NODES:
        return compute()
    h = hashlib.sha256(_module_digest(inspect.getmodule(compute)).encode())
    h.update(repr(options).encode())
    for c in nodes.columns:
        values = nodes[c].to_numpy()
        h.update(c.encode() + b"|")
        h.update(values.tobytes() if values.dtype.kind == "f" else "\x1f".join(map(str, values)).encode())
    h.update(cables.to_csv(index=False).encode())
    path = folder / "backbone" / f"{h.hexdigest()}.links.npz"
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as z:
                cols = {c: z[c] for c in LINK_COLUMNS}
            if len({len(v) for v in cols.values()}) == 1 and len(cols["i"]):
                return pd.DataFrame({c: v.astype(object) if v.dtype.kind == "U" else v for c, v in cols.items()})
        except UNREADABLE:
            pass
    links = compute()
    if len(links) and not links[["kind", "system"]].isna().any().any():  # text round-trips; a missing value would not
        _write(path, {c: links[c].to_numpy(dtype=str if c in ("kind", "system") else None) for c in LINK_COLUMNS})
    return links


def _write(path: Path, m) -> None:
    """An array, or a dict of arrays as ``.npz``, written atomically."""
    write_atomic(path, lambda fh: np.savez(fh, **m) if isinstance(m, dict) else np.save(fh, m, allow_pickle=False))


def clear_memory() -> None:
    """Forget the in-process copies (tests; the disk cache is untouched)."""
    _MEMORY.clear()
