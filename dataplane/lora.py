"""LoRA adapters on the GPT-2 ONNX LM: low-rank deltas computed inside the graph, swappable per request.

A LoRA adapter changes a projection ``y = x @ W + b`` into ``y = x @ W + b + (alpha / r) * (x @ A) @ B``
with ``A [in, r]`` and ``B [r, out]``, ``r <= 32``. Workers AI serves many adapters on one base model, so
the default here is *in-graph and unmerged*: :func:`add_lora_inputs` rewrites the base graph so every
targeted projection gets a low-rank side path whose ``A`` / ``B`` are **graph inputs** of shape
``[batch, in, lora_rank]`` / ``[batch, lora_rank, out]``. One session then serves any adapter, and even a
different adapter per batch row (a batched MatMul, as multi-LoRA servers do); a row with no adapter gets
zeros. ``alpha / r`` is folded into ``B`` when the feeds are built, so the graph needs no scale input.
:func:`bake_adapter` (A/B as initializers) and :func:`merge_weights` (``W + alpha/r A@B``, a copy) are
the two single-adapter alternatives.

Adapter files are ``.npz`` (safetensors-like: named raw tensors plus a JSON ``__metadata__`` entry with
``rank`` and ``alpha``); tensors are ``h{i}.{attn|proj|fc|fc_proj}.lora_A`` / ``.lora_B``.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dataplane.cache import cached_model
from dataplane.errors import DataPlaneError
from dataplane.models.gpt2 import GPT2Spec
from dataplane.models.gpt2_ref import PROJECTIONS
from dataplane.runtime import DeviceKV, LanguageModel
from dataplane.session import SessionConfig

MAX_RANK = 32  # the Workers AI limit on adapter rank
MAX_ALPHA = 1e4  # alpha / rank is folded into float32 weights: far larger scales overflow to inf and NaN
MAX_ADAPTER_BYTES = 300 * 1024 * 1024  # and on adapter file size
FORMAT = "edgepop-lora"


class AdapterError(DataPlaneError):
    """An adapter file is unreadable or does not fit the base model (rank, shapes, size, values)."""

    code = "invalid_adapter"


@dataclass
class Adapter:
    """A LoRA adapter: per projection name (``"h0.attn"``) the pair ``(A [in,r], B [r,out])``."""

    rank: int
    alpha: float
    tensors: dict[str, tuple[np.ndarray, np.ndarray]]
    name: str = "adapter"
    meta: dict = field(default_factory=dict)

    @property
    def scale(self) -> float:
        """The LoRA scaling ``alpha / rank``."""
        return self.alpha / self.rank

    def deltas(self) -> dict[str, tuple[np.ndarray, np.ndarray, float]]:
        """``{projection: (A, B, scale)}``, the form :func:`dataplane.models.gpt2_ref.forward_numpy` takes."""
        return {k: (a, b, self.scale) for k, (a, b) in self.tensors.items()}


def projection_shapes(spec: GPT2Spec) -> dict[str, tuple[int, int]]:
    """``(in, out)`` of every projection an adapter may target."""
    c = spec.n_embd
    io = {"attn": (c, 3 * c), "proj": (c, c), "fc": (c, 4 * c), "fc_proj": (4 * c, c)}
    return {f"h{i}.{t}": io[t] for i in range(spec.n_layer) for t in PROJECTIONS}


def random_adapter(spec: GPT2Spec, rank: int, alpha: float, rng: np.random.Generator,
                   targets: Sequence[str] = PROJECTIONS, std: float = 0.02, name: str = "random") -> Adapter:
    """A seeded adapter with both factors non-zero (a trained adapter's B is non-zero too)."""
    tensors = {}
    for proj, (n_in, n_out) in projection_shapes(spec).items():
        if proj.split(".", 1)[1] in targets:
            tensors[proj] = (rng.normal(0, std, (n_in, rank)).astype(np.float32),
                             rng.normal(0, std, (rank, n_out)).astype(np.float32))
    return Adapter(rank, float(alpha), tensors, name=name)


def save_adapter(adapter: Adapter, path: str | Path) -> Path:
    """Write ``adapter`` as an uncompressed ``.npz`` with a JSON metadata entry."""
    path = Path(path)
    meta = {**adapter.meta, "format": FORMAT, "version": 1, "rank": adapter.rank, "alpha": adapter.alpha}
    arrays = {"__metadata__": np.array(json.dumps(meta))}
    for proj, (a, b) in adapter.tensors.items():
        arrays[f"{proj}.lora_A"], arrays[f"{proj}.lora_B"] = a, b
    with open(path, "wb") as fh:  # a file handle stops numpy from appending ".npz" to the name
        np.savez(fh, **arrays)
    return path


def load_adapter(path: str | Path, spec: GPT2Spec) -> Adapter:
    """Read and validate an adapter file against the base model ``spec`` (one-line AdapterError if bad)."""
    path = Path(path)
    if not path.is_file():
        raise AdapterError(f"{path}: adapter file not found")
    size = path.stat().st_size
    if size > MAX_ADAPTER_BYTES:
        raise AdapterError(f"{path}: size {size} bytes exceeds the adapter limit of {MAX_ADAPTER_BYTES} bytes")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise AdapterError(f"{path}: not a readable .npz adapter ({type(exc).__name__})") from None
    if "__metadata__" not in arrays:
        raise AdapterError(f"{path}: missing '__metadata__' entry (JSON with rank and alpha)")
    try:
        meta = json.loads(str(arrays.pop("__metadata__")))
        rank, alpha = meta["rank"], meta["alpha"]
    except (ValueError, KeyError, TypeError) as exc:
        raise AdapterError(f"{path}: field '__metadata__' is not JSON with rank and alpha ({exc})") from None
    tensors: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for key in arrays:
        proj, _, part = key.rpartition(".")
        if part not in ("lora_A", "lora_B"):
            raise AdapterError(f"{path}: tensor '{key}' is not named <projection>.lora_A or .lora_B")
        tensors.setdefault(proj, (arrays.get(f"{proj}.lora_A"), arrays.get(f"{proj}.lora_B")))
    adapter = Adapter(rank, alpha, tensors, name=str(meta.get("name", path.stem)), meta=meta)
    validate_adapter(adapter, spec, where=str(path))
    return adapter


def validate_adapter(adapter: Adapter, spec: GPT2Spec, where: str = "adapter") -> None:
    """Check rank (1..32), alpha, projection names, factor shapes and finiteness against ``spec``."""
    r = adapter.rank
    if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or not 1 <= r <= MAX_RANK:
        raise AdapterError(f"{where}: field 'rank' = {r!r} must be an integer in 1..{MAX_RANK}")
    a_ = adapter.alpha
    if isinstance(a_, bool) or not isinstance(a_, (int, float)) or not np.isfinite(a_) or not 0 < a_ <= MAX_ALPHA:
        raise AdapterError(f"{where}: field 'alpha' = {a_!r} must be a positive number up to {MAX_ALPHA:g}")
    if not adapter.tensors:
        raise AdapterError(f"{where}: the adapter has no lora_A/lora_B tensors")
    shapes = projection_shapes(spec)
    for proj, (a, b) in adapter.tensors.items():
        if proj not in shapes:
            raise AdapterError(f"{where}: tensor '{proj}' names no projection of the base model "
                               f"(expected h0..h{spec.n_layer - 1} . {'|'.join(PROJECTIONS)})")
        n_in, n_out = shapes[proj]
        for part, t, want in (("lora_A", a, (n_in, r)), ("lora_B", b, (r, n_out))):
            if t is None:
                raise AdapterError(f"{where}: tensor '{proj}.{part}' is missing")
            if tuple(t.shape) != want:
                raise AdapterError(f"{where}: tensor '{proj}.{part}' has shape {list(t.shape)}, "
                                   f"expected {list(want)} for rank {r}")
            if t.dtype.kind != "f" or not np.isfinite(t).all():
                raise AdapterError(f"{where}: tensor '{proj}.{part}' must be finite floats (dtype {t.dtype})")
            with np.errstate(over="ignore"):  # the graph holds float32: a float64 value past its range is inf there
                fits32 = np.isfinite(t.astype(np.float32)).all()
            if not fits32:
                raise AdapterError(f"{where}: tensor '{proj}.{part}' holds values beyond float32's range "
                                   f"(|x| > {np.finfo(np.float32).max:.3g}), which the model computes in")


# ----- graph rewriting -------------------------------------------------------------------------------------
def _rewrite(model: onnx.ModelProto, factors: dict[str, tuple[str, str]]) -> onnx.ModelProto:
    """Copy ``model``, adding ``y += (x @ A) @ B`` after each MatMul whose weight is ``<proj>.w``."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes, seen = [], set()
    for node in out.graph.node:
        nodes.append(node)
        proj = node.input[1][:-2] if node.op_type == "MatMul" and node.input[1].endswith(".w") else None
        if proj not in factors:
            continue
        a_name, b_name = factors[proj]
        y = node.output[0]
        node.output[0] = f"{y}.base"
        xa = helper.make_node("MatMul", [node.input[0], a_name], [f"{y}.lora_xa"], name=f"{proj}.lora_xa")
        d = helper.make_node("MatMul", [f"{y}.lora_xa", b_name], [f"{y}.lora_delta"], name=f"{proj}.lora_xab")
        add = helper.make_node("Add", [f"{y}.base", f"{y}.lora_delta"], [y], name=f"{proj}.lora_add")
        nodes += [xa, d, add]
        seen.add(proj)
    if seen != set(factors):
        raise ValueError(f"projections not found in the graph: {sorted(set(factors) - seen)}")
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out  # callers add the factor inputs/initializers, then check


def add_lora_inputs(model: onnx.ModelProto, spec: GPT2Spec, targets: Sequence[str] = PROJECTIONS):
    """The base graph with per-row adapter inputs ``lora_A.<proj>`` / ``lora_B.<proj>`` on ``targets``."""
    shapes = {p: s for p, s in projection_shapes(spec).items() if p.split(".", 1)[1] in targets}
    out = _rewrite(model, {p: (f"lora_A.{p}", f"lora_B.{p}") for p in shapes})
    for proj, (n_in, n_out) in shapes.items():
        out.graph.input.extend([
            helper.make_tensor_value_info(f"lora_A.{proj}", TensorProto.FLOAT, ["batch", n_in, "lora_rank"]),
            helper.make_tensor_value_info(f"lora_B.{proj}", TensorProto.FLOAT, ["batch", "lora_rank", n_out]),
        ])
    onnx.checker.check_model(out)
    return out


def bake_adapter(model: onnx.ModelProto, adapter: Adapter) -> onnx.ModelProto:
    """The base graph with one adapter's factors as initializers (still unmerged: the side path stays)."""
    factors, inits = {}, []
    for proj, (a, b) in adapter.tensors.items():
        factors[proj] = (f"lora_A.{proj}", f"lora_B.{proj}")
        inits += [numpy_helper.from_array(np.ascontiguousarray(a, np.float32), f"lora_A.{proj}"),
                  numpy_helper.from_array(np.ascontiguousarray(b * adapter.scale, np.float32), f"lora_B.{proj}")]
    out = _rewrite(model, factors)
    out.graph.initializer.extend(inits)
    onnx.checker.check_model(out)
    return out


def merge_weights(w: dict[str, np.ndarray], adapter: Adapter) -> dict[str, np.ndarray]:
    """A copy of the base weights with ``W + alpha/r * A @ B`` merged in (zero extra cost per token)."""
    merged = dict(w)
    for proj, (a, b) in adapter.tensors.items():
        merged[proj + ".w"] = (w[proj + ".w"] + adapter.scale * (a.astype(np.float64) @ b)).astype(np.float32)
    return merged


def adapter_salt(adapter: Adapter | None) -> bytes:
    """A digest of the adapter's rank, alpha and factors (``b""`` for the base model).

    Prefix-cache entries are namespaced by it: the same tokens have different KV under different adapters.
    Memoised on the adapter object, which is treated as immutable once served.
    """
    if adapter is None:
        return b""
    salt = getattr(adapter, "_salt", None)
    if salt is None:
        h = hashlib.blake2b(f"lora:{adapter.rank}:{adapter.alpha!r}".encode(), digest_size=16)
        for proj in sorted(adapter.tensors):
            for t in adapter.tensors[proj]:
                h.update(proj.encode())
                h.update(np.ascontiguousarray(t, np.float32).tobytes())
        salt = h.digest()
        adapter._salt = salt
    return salt


def adapter_feeds(spec: GPT2Spec, rows: Sequence[Adapter | None],
                  targets: Sequence[str] = PROJECTIONS) -> dict[str, np.ndarray]:
    """Graph feeds for one batch: row ``i`` uses ``rows[i]`` (None: the base model, zero factors).

    Ranks are zero-padded to the batch's largest, which leaves each row's product unchanged.
    """
    r = max([a.rank for a in rows if a is not None], default=1)
    feeds = {}
    for proj, (n_in, n_out) in projection_shapes(spec).items():
        if proj.split(".", 1)[1] not in targets:
            continue
        a_feed = np.zeros((len(rows), n_in, r), np.float32)
        b_feed = np.zeros((len(rows), r, n_out), np.float32)
        for i, ad in enumerate(rows):
            if ad is not None and proj in ad.tensors:
                a, b = ad.tensors[proj]
                a_feed[i, :, : ad.rank] = a
                b_feed[i, : ad.rank] = b * ad.scale
        feeds[f"lora_A.{proj}"], feeds[f"lora_B.{proj}"] = a_feed, b_feed
    return feeds


class LoraLanguageModel(LanguageModel):
    """A :class:`~dataplane.runtime.LanguageModel` whose graph takes adapters as inputs.

    ``adapters`` (None, one :class:`Adapter`, or one entry per batch row) is used by :meth:`step`, so the
    existing prefill/decode code drives it unchanged; :meth:`step_with` takes them per call.
    """

    def __init__(self, name: str, spec: GPT2Spec, base_path: Path, config: SessionConfig | None = None,
                 targets: Sequence[str] = PROJECTIONS):
        self.targets = tuple(targets)
        # Keyed by the base file's bytes, so a different base never reuses a stale rewritten graph.
        digest = hashlib.sha256(Path(base_path).read_bytes()).hexdigest()[:16]
        key = {**spec.key(), "lora_targets": list(self.targets), "base_sha256": digest}
        path = cached_model(f"{name}-lora", key, lambda: add_lora_inputs(onnx.load(str(base_path)), spec,
                                                                            self.targets))
        super().__init__(name, spec, path, config)
        self.adapters: Adapter | Sequence[Adapter | None] | None = None
        self._feeds: tuple[list, dict] = ([], {})  # last (rows, feeds): decode steps reuse the same rows

    def step(self, input_ids, attention_mask, position_ids, past, keep_on_device: bool = False):
        """:meth:`step_with` the model's ``adapters``. The KV cache stays in host memory here (the adapter
        inputs go with every call): ``keep_on_device`` is accepted and ignored, a device-resident ``past``
        is copied back."""
        if isinstance(past, DeviceKV):
            past = past.numpy()
        return self.step_with(input_ids, attention_mask, position_ids, past, self.adapters)

    def step_with(self, input_ids, attention_mask, position_ids, past, adapters):
        """One forward call with ``adapters`` (see the class docstring); returns logits and present KV."""
        b_ = input_ids.shape[0]
        rows = list(adapters) if isinstance(adapters, (list, tuple)) else [adapters] * b_
        if len(rows) != b_:
            raise AdapterError(f"{len(rows)} adapters for a batch of {b_} rows")
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        feeds.update(zip(self.past_names, past, strict=True))
        last_rows, last_feeds = self._feeds
        if len(last_rows) != len(rows) or any(a is not b for a, b in zip(last_rows, rows, strict=True)):
            last_feeds = adapter_feeds(self.spec, rows, self.targets)
            self._feeds = (rows, last_feeds)  # adapters are treated as immutable once served
        feeds.update(last_feeds)
        out = self.session.run(feeds)
        return out[0], out[1:]

