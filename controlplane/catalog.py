"""Model catalog: Workers-AI-style model ids with the figures placement, routing, billing and the simulator need.

The shipped catalog is ``controlplane/data/catalog.toml``; ``Catalog.load(path)`` reads another one. Every field is
validated on load and a bad entry raises one :class:`CatalogError` naming the file, the model and the field.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from edgepop.errors import UserError

CATALOG_FILE = Path(__file__).parent / "data" / "catalog.toml"

TASKS = ("text-generation", "text-embeddings", "text-classification", "text-reranking", "image-classification",
         "automatic-speech-recognition")
PRECISION_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
UNITS = ("token", "image", "audio-minute")
TASK_UNIT = {"image-classification": "image", "automatic-speech-recognition": "audio-minute"}  # others: token
GIB = 1024 ** 3
# CUDA context, activations and allocator slack per GPU a replica spans (vLLM-style deployments leave ~1 GiB).
RUNTIME_OVERHEAD_BYTES = 1 * GIB
MLP_KINDS = ("gated", "plain")  # gated: gate, up and down matrices (SwiGLU/GeGLU); plain: up and down (GELU)
# The MLP each known family has; an entry of another family whose architecture the roofline counts must say
# which (field `mlp`): guessing one makes its body a third bigger or smaller without a word.
FAMILY_MLP = {**dict.fromkeys(("llama", "mistral", "gemma", "qwen2"), "gated"),
              **dict.fromkeys(("gpt2", "gptj", "falcon", "bloom", "opt", "bert", "roberta", "xlm-roberta",
                               "whisper"), "plain")}


class CatalogError(UserError):
    """A catalog file or entry is invalid, or a model id is unknown (Workers AI code 5007)."""

    code = 5007


class UnknownModelError(CatalogError):
    """The model id is not in the catalog (Workers AI error 5007)."""


def kv_footprint(tokens: float, layers: int, sliding_window: int = 0, global_layers: int = 0) -> float:
    """KV cache of a ``tokens``-long sequence in full-layer token equivalents (the unit ``kv_pool_tokens`` counts
    and ``kv_bytes_per_token`` prices): ``(global x L + local x min(L, W)) / layers``, a local layer keeping the
    last ``W = sliding_window`` tokens only; ``tokens`` itself for a model without a sliding window."""
    if not sliding_window or tokens <= sliding_window:  # (returned as given: other models' figures stay identical)
        return tokens
    return (global_layers * tokens + (layers - global_layers) * sliding_window) / layers


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One catalog entry. Sizes in bytes; ``kv_bytes_per_token`` is over all layers, K and V."""

    id: str
    task: str
    family: str
    parameters: float
    precision: str
    context_window: int
    layers: int
    hidden: int
    neurons_per_m_input: float
    stand_in: str
    tensor_parallel: int = 1
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    intermediate: int = 0
    vocab: int = 0
    kv_precision: str = "bf16"
    unit: str = "token"
    gflops_per_unit: float = 0.0
    neurons_per_m_output: float = 0.0
    max_batch: int = 64
    kv_pool_tokens: int = 0
    weight_bytes: float = 0.0
    description: str = ""
    mlp: str = ""  # "gated" or "plain"; the loader fills it from the family (empty: unknown and not needed)
    # Sliding-window attention (Gemma 3): all but ``global_layers`` layers attend to the last ``sliding_window``
    # tokens only, and an engine with a hybrid KV allocator (vLLM >= 0.10) keeps their KV for the window alone.
    sliding_window: int = 0  # tokens (0: every layer is global)
    global_layers: int = 0
    # Speech models whose encoder reads fixed windows (Whisper: 30 s of log-mel frames, a shorter clip padded to
    # it, a longer one cut into windows): ``gflops_per_unit`` is then the compute of one minute of audio, and
    # ``decoder_gflops_per_unit`` the part of it that follows the transcript's length (its decoder), the rest
    # is paid per started window. 0: compute proportional to the audio's length.
    audio_window_s: float = 0.0
    decoder_gflops_per_unit: float = 0.0
    adapters: tuple = field(default=(), compare=False)

    @property
    def generative(self) -> bool:
        return self.task == "text-generation"

    def audio_gflops(self, minutes: float) -> float:
        """Compute (GFLOPs) of one clip of ``minutes`` of audio: per started window for the encoder (and the
        decoder's cross-attention keys and values over it), per minute for the decoder."""
        if not self.audio_window_s:
            return self.gflops_per_unit * minutes
        windows = max(1, math.ceil(minutes * 60.0 / self.audio_window_s - 1e-9))  # (1e-9: 60 s is 2 windows)
        per_window = (self.gflops_per_unit - self.decoder_gflops_per_unit) * self.audio_window_s / 60.0
        return windows * per_window + self.decoder_gflops_per_unit * minutes

    @property
    def bytes_per_param(self) -> float:
        return PRECISION_BYTES[self.precision]

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V for every layer: 2 x layers x kv_heads x head_dim x bytes (0 for models without a KV cache)."""
        if not self.generative:
            return 0.0
        return 2.0 * self.layers * self.kv_heads * self.head_dim * PRECISION_BYTES[self.kv_precision]

    def kv_footprint(self, tokens: float) -> float:
        """KV of a ``tokens``-long sequence in full-layer token equivalents (:func:`kv_footprint`)."""
        return kv_footprint(tokens, self.layers, self.sliding_window, self.global_layers)

    def kv_charge(self, tokens: int) -> int:
        """KV pool tokens a sequence of ``tokens`` reserves: :meth:`kv_footprint` rounded up to a whole token
        (pools count whole tokens, so reservations add and release exactly)."""
        return math.ceil(self.kv_footprint(tokens))

    @property
    def kv_pool_bytes(self) -> float:
        return self.kv_bytes_per_token * self.kv_pool_tokens

    @property
    def replica_bytes(self) -> float:
        """GPU memory one replica needs: weights, its KV pool and runtime overhead on each of its GPUs."""
        return self.weight_bytes + self.kv_pool_bytes + RUNTIME_OVERHEAD_BYTES * self.tensor_parallel

    @property
    def replica_gb(self) -> float:
        return self.replica_bytes / 1e9

    @property
    def bytes_per_gpu(self) -> float:
        return self.replica_bytes / self.tensor_parallel


_REQUIRED = ("task", "family", "parameters", "precision", "context_window", "layers", "hidden",
             "neurons_per_m_input", "stand_in")
_INTS = {"context_window", "layers", "hidden", "tensor_parallel", "heads", "kv_heads", "head_dim", "intermediate",
         "vocab", "max_batch", "kv_pool_tokens", "sliding_window", "global_layers"}
_FLOATS = {"parameters", "gflops_per_unit", "neurons_per_m_input", "neurons_per_m_output", "weight_bytes",
           "audio_window_s", "decoder_gflops_per_unit"}
_STRS = {"task", "family", "precision", "kv_precision", "unit", "stand_in", "description", "mlp"}
_KNOWN = {f.name for f in fields(ModelSpec)} - {"id", "adapters"}


def _entry(path: Path, model_id: str, raw: dict) -> ModelSpec:
    def bad(name, problem):
        return CatalogError(f"{path.name}: model {model_id!r}: field {name!r}: {problem}")

    if not isinstance(raw, dict):
        raise CatalogError(f"{path.name}: model {model_id!r}: expected a table of fields")
    if not re.fullmatch(r"@[\w.\-]+(/[\w.\-]+){1,2}", model_id):
        raise CatalogError(f"{path.name}: model id {model_id!r} is not of the form @owner/vendor/name")
    for name in raw:
        if name not in _KNOWN and name != "adapters":
            raise bad(name, f"unknown field (known: {', '.join(sorted(_KNOWN | {'adapters'}))})")
    for name in _REQUIRED:
        if name not in raw:
            raise bad(name, "missing")
    values = {}
    for name, value in raw.items():
        if name == "adapters":
            continue
        if name in _INTS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise bad(name, f"{value!r} is not a non-negative integer")
        elif name in _FLOATS:
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise bad(name, f"{value!r} is not a non-negative number")
            value = float(value)
        elif name in _STRS and not isinstance(value, str):
            raise bad(name, f"{value!r} is not a string")
        values[name] = value
    if values["task"] not in TASKS:
        raise bad("task", f"{values['task']!r} is not one of {', '.join(TASKS)}")
    for name in ("precision", "kv_precision"):
        if name in values and values[name] not in PRECISION_BYTES:
            raise bad(name, f"{values[name]!r} is not one of {', '.join(PRECISION_BYTES)}")
    if values.get("unit", "token") not in UNITS:
        raise bad("unit", f"{values['unit']!r} is not one of {', '.join(UNITS)}")
    unit = values.get("unit", "token")
    want = TASK_UNIT.get(values["task"], "token")
    if unit != want:  # the perf model reads a request's size in its task's unit (text: tokens)
        raise bad("unit", f"{unit!r} does not fit task {values['task']!r}, which counts {want}s")
    if unit != "token" and not values.get("gflops_per_unit"):  # (else every image or clip would take no compute)
        raise bad("gflops_per_unit", f"required (and positive) for {unit} models")
    for name in ("audio_window_s", "decoder_gflops_per_unit"):
        if values.get(name) and unit != "audio-minute":
            raise bad(name, f"applies to audio-minute models only, not {unit} models")
    if values.get("decoder_gflops_per_unit", 0.0) > values.get("gflops_per_unit", 0.0):
        raise bad("decoder_gflops_per_unit", f"{values['decoder_gflops_per_unit']} is more than gflops_per_unit "
                  f"{values.get('gflops_per_unit', 0.0)}, of which it is a part")
    for name in ("parameters", "context_window", "layers", "hidden", "tensor_parallel", "max_batch"):
        if name in values and values[name] <= 0:
            raise bad(name, "must be positive")
    if values.get("heads") and not values.get("head_dim"):
        if values["hidden"] % values["heads"]:
            raise bad("heads", f"hidden {values['hidden']} is not divisible by {values['heads']} heads")
        values["head_dim"] = values["hidden"] // values["heads"]
    if values["task"] == "text-generation":
        for name in ("heads", "kv_heads", "intermediate", "vocab", "kv_pool_tokens", "neurons_per_m_output"):
            if not values.get(name):
                raise bad(name, "required (and positive) for text-generation")
        if values["heads"] % values["kv_heads"]:
            raise bad("kv_heads", f"{values['heads']} heads are not a multiple of {values['kv_heads']} KV heads")
    _check_sliding_window(values, bad)
    if values["task"] == "text-generation":
        full = math.ceil(kv_footprint(values["context_window"], values["layers"], values.get("sliding_window", 0),
                                      values.get("global_layers", 0)))
        if values["kv_pool_tokens"] < full:  # (vLLM refuses to start such a model too)
            what = (f"the context window {values['context_window']}" if full == values["context_window"] else
                    f"{full}, the full-layer KV equivalent of the context window {values['context_window']}")
            raise bad("kv_pool_tokens", f"{values['kv_pool_tokens']} is below {what}: a replica must hold one "
                      "full-length request")
    if "mlp" in values and values["mlp"] not in MLP_KINDS:
        raise bad("mlp", f"{values['mlp']!r} is not one of {', '.join(MLP_KINDS)}")
    values["mlp"] = values.get("mlp") or FAMILY_MLP.get(values["family"], "")
    # The roofline counts a token model's layers from heads and intermediate; it must know the MLP's matrices.
    if not values["mlp"] and unit == "token" and values.get("heads") and values.get("intermediate"):
        raise bad("family", f"{values['family']!r} is not a known family ({', '.join(sorted(FAMILY_MLP))}); "
                  "give mlp = \"gated\" (gate, up, down) or \"plain\" (up, down)")
    tp = values.get("tensor_parallel", 1)
    if values.get("heads") and tp > 1 and values["heads"] % tp:  # (each GPU holds whole attention heads)
        raise bad("tensor_parallel", f"{tp} does not divide the model's {values['heads']} attention heads")
    values["weight_bytes"] = values.get("weight_bytes") or values["parameters"] * PRECISION_BYTES[values["precision"]]
    if "adapters" in raw:  # LoRA adapters fine-tuned on this model
        values["adapters"] = parse_adapters(path.name, model_id, raw["adapters"], values)
    return ModelSpec(id=model_id, **values)


def _check_sliding_window(values: dict, bad) -> None:
    """``sliding_window`` and ``global_layers`` come together, on a text-generation model with local layers."""
    given = [n for n in ("sliding_window", "global_layers") if n in values]
    if not given:
        return
    if len(given) == 1:
        other = "global_layers" if given[0] == "sliding_window" else "sliding_window"
        raise bad(other, f"missing: {given[0]} needs it (sliding_window: tokens a local layer attends to; "
                  "global_layers: layers that attend to the whole context)")
    if values["task"] != "text-generation":
        raise bad("sliding_window", "only text-generation models have a KV cache to window")
    if values["sliding_window"] <= 0:
        raise bad("sliding_window", f"{values['sliding_window']} must be positive")
    if not 0 < values["global_layers"] < values["layers"]:
        raise bad("global_layers", f"{values['global_layers']} must be between 1 and {values['layers'] - 1} "
                  f"(the model's {values['layers']} layers, at least one of them local)")


class Catalog:
    """The models an experiment can serve, by id. ``catalog[id]`` raises :class:`UnknownModelError` (5007)."""

    def __init__(self, specs: list[ModelSpec], source: str = "<memory>"):
        self.source = source
        self._specs = {s.id: s for s in specs}
        if len(self._specs) != len(specs):
            raise CatalogError(f"{source}: duplicate model ids")

    @classmethod
    def load(cls, path: str | Path | None = None) -> Catalog:
        """Read and validate a catalog TOML file (the shipped one by default)."""
        path = Path(path) if path else CATALOG_FILE
        try:
            # (utf-8-sig: a file saved with a byte-order mark, as some editors do, is still TOML)
            doc = tomllib.loads(path.read_text(encoding="utf-8-sig"))
        except FileNotFoundError:
            raise CatalogError(f"catalog file {str(path)!r} not found") from None
        except IsADirectoryError:
            raise CatalogError(f"catalog file {str(path)!r} is a folder: name a TOML file") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:  # (not UTF-8: not TOML either)
            raise CatalogError(f"{path.name}: not valid TOML: {exc}") from None
        models = doc.get("models")
        if not isinstance(models, dict) or not models:
            raise CatalogError(f"{path.name}: no [models.\"@owner/vendor/name\"] tables")
        return cls([_entry(path, mid, raw) for mid, raw in models.items()], source=path.name)

    def __getitem__(self, model_id: str) -> ModelSpec:
        try:
            return self._specs[model_id]
        except KeyError:
            raise UnknownModelError(f"no model {model_id!r} in the catalog ({len(self._specs)} models; "
                                    "`edgepop place --list-models` lists them)") from None

    def __contains__(self, model_id: str) -> bool:
        return model_id in self._specs

    def __iter__(self):
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    @property
    def ids(self) -> list[str]:
        return list(self._specs)

    def subset(self, ids) -> Catalog:
        """A catalog holding only ``ids`` (each must exist)."""
        return Catalog([self[i] for i in ids], source=self.source)

    def with_adapters(self, adapters: dict) -> Catalog:
        """A copy whose entries ``model id -> (AdapterSpec, ...)`` declare those LoRA adapters instead."""
        return Catalog([replace(s, adapters=tuple(adapters[s.id])) if s.id in adapters else s for s in self],
                       source=self.source)

    def by_task(self, task: str) -> list[ModelSpec]:
        return [s for s in self._specs.values() if s.task == task]

    def to_frame(self):
        """One row per model with the derived sizes, for printing and notebooks."""
        import pandas as pd

        rows = [{"id": s.id, "task": s.task, "precision": s.precision, "params_b": s.parameters / 1e9,
                 "weights_gb": s.weight_bytes / 1e9, "kv_kb_per_token": s.kv_bytes_per_token / 1e3,
                 "replica_gb": s.replica_gb, "tp": s.tensor_parallel, "context": s.context_window,
                 "neurons_in": s.neurons_per_m_input, "neurons_out": s.neurons_per_m_output,
                 "stand_in": s.stand_in} for s in self._specs.values()]
        return pd.DataFrame(rows)


# ---------------------------------------------------------------------- LoRA adapters declared in the catalog
MAX_RANK = 32
MAX_BYTES = 300e6
LORA_BYTES = 2.0  # adapters are shipped in fp16/bf16
_ADAPTER_FIELDS = {"name", "rank", "size_mb"}


@dataclass(frozen=True, slots=True)
class AdapterSpec:
    """One LoRA adapter declared in the catalog for base model ``base`` (the engine-side weights are
    :class:`dataplane.lora.Adapter`)."""

    name: str
    base: str
    rank: int
    size_bytes: float


def attention_lora_bytes(rank: int, layers: int, hidden: int, kv_heads: int, head_dim: int) -> float:
    """Bytes of a rank-``rank`` adapter on the q, k, v and o projections (A and B matrices, fp16)."""
    kv_dim = kv_heads * head_dim
    per_layer = rank * ((hidden + hidden) * 2 + (hidden + kv_dim) * 2)  # q and o: d->d; k and v: d->kv_dim
    return float(per_layer * layers * LORA_BYTES)


def parse_adapters(source: str, model_id: str, raw, shape: dict) -> tuple[AdapterSpec, ...]:
    """Validate a catalog entry's ``adapters`` list (one-line errors naming file, model, adapter and field)."""
    where = f"{source}: model {model_id!r}: adapters"
    if not isinstance(raw, list):
        raise CatalogError(f"{where}: expected a list of tables ([[models.\"...\".adapters]]), got {raw!r}")
    if shape.get("task") != "text-generation":
        raise CatalogError(f"{where}: only text-generation models take LoRA adapters")
    out, names = [], set()
    for i, a in enumerate(raw):
        if not isinstance(a, dict):
            raise CatalogError(f"{where}[{i}]: expected a table, got {a!r}")
        for k in a:
            if k not in _ADAPTER_FIELDS:
                raise CatalogError(f"{where}[{i}]: unknown field {k!r} (known: {', '.join(sorted(_ADAPTER_FIELDS))})")
        name = a.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[\w.\-]+", name):
            raise CatalogError(f"{where}[{i}]: field 'name' must be a non-empty word like 'support-chat', got {name!r}")
        if name in names:
            raise CatalogError(f"{where}[{i}]: duplicate adapter name {name!r}")
        names.add(name)
        rank = a.get("rank")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= MAX_RANK:
            raise CatalogError(f"{where}[{i}] {name!r}: field 'rank' must be an integer in 1..{MAX_RANK}, got {rank!r}")
        if "size_mb" in a:
            mb = a["size_mb"]
            if isinstance(mb, bool) or not isinstance(mb, int | float) or not math.isfinite(mb) or mb <= 0:
                raise CatalogError(f"{where}[{i}] {name!r}: field 'size_mb' must be a positive number, got {mb!r}")
            size = float(mb) * 1e6
        else:
            size = attention_lora_bytes(rank, shape["layers"], shape["hidden"], shape["kv_heads"],
                                        shape.get("head_dim") or shape["hidden"] // shape["heads"])
        if size > MAX_BYTES:
            raise CatalogError(f"{where}[{i}] {name!r}: size {size / 1e6:.1f} MB is over the {MAX_BYTES / 1e6:.0f} MB limit")
        out.append(AdapterSpec(name, model_id, rank, size))
    return tuple(out)


_DEFAULT: Catalog | None = None


def default_catalog() -> Catalog:
    """The shipped catalog (parsed once per process)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Catalog.load()
    return _DEFAULT
