"""int8 quantization of registered models with ``onnxruntime.quantization``, and what it costs in accuracy.

* Text models (the real MiniLM encoder, the GPT-2 LM): ``quantize_dynamic`` -- per-channel int8 weights
  for every weight MatMul and embedding Gather, activations quantized per call (no calibration data).
* ResNet: ``quantize_static`` (QDQ, per-channel weights) with activation ranges calibrated on a seeded
  set of images from a :class:`SeededImageReader`.

:func:`quantize_and_measure` reports file size fp32 vs int8, median latency of both on the same inputs
(runs interleaved, so machine noise hits both alike), and output drift: embedding cosine to fp32, LM
logit max-abs / relative error and top-1 agreement over teacher-forced positions, image logit error and
top-1 agreement.
"""

from __future__ import annotations

import copy
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

from dataplane import registry
from dataplane.errors import InvalidInputError
from dataplane.session import Session, SessionConfig, threads_problem
from edgepop.outputs import output_folder

# Drift is measured on these (a mix of topics, lengths and punctuation); all are >= 40 bytes long.
SENTENCES = (
    "A man is playing a guitar on the street corner.",
    "Someone is playing an instrument outside a shop.",
    "The stock market fell sharply today after the announcement.",
    "How do I reset my password if I lost my phone?",
    "I forgot my password, how can I change it quickly?",
    "The recipe needs two cups of flour and one egg.",
    "The cat sleeps on the sofa all afternoon long.",
    "Interest rates were raised by the central bank again.",
    "Edge inference runs the model close to the user.",
    "Latency at the point of presence decides the experience.",
    "Quantization stores weights as eight-bit integers.",
    "The train to Lisbon leaves at seven in the morning.",
    "Photosynthesis turns sunlight into chemical energy.",
    "She scored the winning goal in the final minute!",
    "Please summarise this document in three sentences.",
    "The database migration failed because of a lock timeout.",
    "Rain is expected across the north of the country tomorrow.",
    "Low-rank adapters specialise one base model for many tasks.",
    "He painted the fence blue, then changed his mind.",
    "What is the capital city of Australia, and why there?",
    "Kubernetes schedules containers onto a cluster of nodes.",
    "The orchestra tuned their instruments before the concert.",
    "Our flight was delayed by two hours due to fog.",
    "Translate 'good morning' into French and Spanish, please.",
)


class SeededImageReader(CalibrationDataReader):
    """Calibration batches of seeded normalised images (what the model's preprocessing outputs)."""

    def __init__(self, input_name: str, size: int, count: int, rng: np.random.Generator):
        self._items = iter([{input_name: rng.normal(0, 1, (1, 3, size, size)).astype(np.float32)}
                            for _ in range(count)])

    def get_next(self):
        return next(self._items, None)


def fold_constant_transposes(model: onnx.ModelProto) -> int:
    """Replace each ``Transpose(initializer)`` by a transposed initializer, in place; returns how many.

    GPT-2's tied LM head is ``MatMul(x, Transpose(wte))``; the quantizer only quantizes a MatMul whose
    weight is an initializer, so without this the biggest matmul of a decode step stays fp32 and even
    re-dequantizes the int8 ``wte`` on every call. Folding stores the head separately (int8 file ~3x
    instead of ~4x smaller for gpt2-small) and makes its decode step ~3x faster instead of ~1.05x.
    """
    inits = {i.name: i for i in model.graph.initializer}
    keep, folded = [], 0
    for node in model.graph.node:
        if node.op_type == "Transpose" and node.input[0] in inits:
            arr = numpy_helper.to_array(inits[node.input[0]])
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(arr.transpose(perm)),
                                                                   node.output[0]))
            folded += 1
        else:
            keep.append(node)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    return folded


def quantize_file(src: str | Path, dst: str | Path, family: str, rng: np.random.Generator | None = None,
                  calibration: int = 16, input_name: str = "pixel_values", image_size: int = 224,
                  fold_transposes: bool = True) -> Path:
    """Write the int8 version of ``src`` to ``dst``: dynamic for text models, static QDQ for ResNet.

    ``fold_transposes`` (text models) first folds constant Transposes so a tied LM head is quantized too.
    """
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    # Written in a folder of its own beside ``dst`` and renamed into place: a run that fails or is interrupted
    # leaves no truncated model under the output's name (nor the folded intermediate).
    work = Path(tempfile.mkdtemp(prefix=".edgepop-quantize-", dir=dst.parent))
    try:
        if family != "resnet" and fold_transposes:
            model = onnx.load(str(src))
            if fold_constant_transposes(model):
                src = work / (dst.stem + ".folded-fp32.onnx")
                onnx.save(model, str(src))
        staged = work / dst.name
        if family == "resnet":
            reader = SeededImageReader(input_name, image_size, calibration, rng or np.random.default_rng(0))
            quantize_static(str(src), str(staged), reader, quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        else:
            # Per-channel scales: per-tensor int8 drops MiniLM's embedding cosine to ~0.965, per-channel 0.993.
            quantize_dynamic(str(src), str(staged), weight_type=QuantType.QInt8, per_channel=True)
        staged.replace(dst)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dst


def int8_copy(model, dst: str | Path, family: str, config: SessionConfig | None = None, **kw):
    """A shallow copy of a loaded runtime model whose session runs the int8 version of its graph.

    Works for any graph built on the base, e.g. a :class:`dataplane.lora.LoraLanguageModel`: its LoRA side
    path has non-constant factors, so it stays fp32 while the base projections become int8.
    """
    q = copy.copy(model)  # same pre/post-processing and adapter state, the int8 graph underneath
    q.session = Session(quantize_file(model.session.path, dst, family, **kw), config or model.session.config)
    return q


def _median_ms(fns: dict, repeats: int) -> dict[str, float]:
    """Median wall time per callable, running them interleaved after one warm-up each."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def embedding_drift(fp32, int8, sentences=SENTENCES) -> dict:
    """Cosine similarity of int8 to fp32 embeddings (both unit length) over ``sentences``."""
    encs = [fp32.encode(s) for s in sentences]
    a, b = np.stack(fp32.run(encs)), np.stack(int8.run(encs))
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return {"cosine_mean": float(cos.mean()), "cosine_min": float(cos.min()), "sentences": len(sentences)}


def head_drift(fp32, int8, sentences=SENTENCES) -> dict:
    """Logit error of int8 vs fp32 for a scoring head (reranking, classification) over ``sentences``: the largest
    absolute change and the relative L2 error. (A cosine of one or two logits says nothing: it is about +-1.)"""
    encs = [fp32.encode(s) for s in sentences]
    a = np.stack(fp32.run(encs)).astype(np.float64)
    b = np.stack(int8.run(encs)).astype(np.float64)
    return {"logit_max_abs": float(np.abs(b - a).max()),
            "logit_rel_l2": float(np.linalg.norm(b - a) / max(np.linalg.norm(a), 1e-12)),
            "top1_agreement": float((a.argmax(-1) == b.argmax(-1)).mean()) if a.ndim > 1 and a.shape[-1] > 1
            else None, "sentences": len(sentences)}


def lm_position_logits(model, ids: np.ndarray, n_prompt: int = 4) -> np.ndarray:
    """Logits ``[B, T-n_prompt+1, V]`` after each prefix of ``ids``: a prefill, then cached steps."""
    logits, past, mask = model.prefill([list(r) for r in ids[:, :n_prompt]])
    out = [logits]
    for t in range(n_prompt, ids.shape[1]):
        mask = np.concatenate([mask, np.ones((len(ids), 1), np.int64)], axis=1)
        logits, past = model.step(ids[:, t : t + 1], mask, np.full((len(ids), 1), t, np.int64), past)
        out.append(logits)
    return np.stack(out, axis=1)


def lm_drift(fp32, int8, sentences=SENTENCES, length: int = 40) -> dict:
    """Logit error and top-1 agreement of int8 vs fp32 at every position of ``sentences`` (teacher forced)."""
    ids = np.array([fp32.tokenizer.encode(s)[:length] for s in sentences], np.int64)
    a, b = lm_position_logits(fp32, ids), lm_position_logits(int8, ids)
    return {
        "logit_max_abs": float(np.abs(a - b).max()),
        "logit_rel_l2": float(np.linalg.norm(a - b) / np.linalg.norm(a)),
        "top1_agreement": float((a.argmax(-1) == b.argmax(-1)).mean()),
        "positions": int(a.shape[0] * a.shape[1]),
    }


def image_drift(fp32, int8, rng: np.random.Generator, count: int = 16) -> dict:
    """Logit error and top-1 agreement on seeded images that were not in the calibration set."""
    x = rng.normal(0, 1, (count, 3, fp32.size, fp32.size)).astype(np.float32)
    a = fp32.session.run({fp32.input_name: x})[0]
    b = int8.session.run({int8.input_name: x})[0]
    return {"logit_max_abs": float(np.abs(a - b).max()),
            "logit_rel_l2": float(np.linalg.norm(a - b) / np.linalg.norm(a)),
            "top1_agreement": float((a.argmax(-1) == b.argmax(-1)).mean()), "images": count}


def quantize_and_measure(name: str, out_dir: str | Path, repeats: int = 20, threads: int = 1,
                         seed: int = 0, fold_transposes: bool = True) -> dict:
    """Quantize registered model ``name`` into ``out_dir`` and return size, speed-up and drift figures."""
    if repeats < 1:
        raise InvalidInputError(f"repeats must be >= 1 (got {repeats})")
    if problem := threads_problem(threads):
        raise InvalidInputError(f"threads: {problem}")
    card = registry.get_card(name)
    if card.family not in ("gpt2", "bert", "resnet"):
        raise InvalidInputError(f"model '{name}': quantize supports gpt2, bert and resnet models, not "
                                f"'{card.family}'")
    # ('~' expanded) checked before loading and quantizing, once the inputs are known to be good
    out_dir = output_folder(out_dir, writes=(f"{name}.int8.onnx",))
    config = SessionConfig(provider="cpu", intra_op_threads=threads)
    fp32 = registry.load(name, config)
    rng = np.random.default_rng(seed)
    src = fp32.session.path
    int8 = int8_copy(fp32, Path(out_dir) / f"{name}.int8.onnx", card.family, config, rng=rng,
                     image_size=getattr(fp32, "size", 224), fold_transposes=fold_transposes)
    dst = int8.session.path
    fig = {"model": name, "method": "static-qdq" if card.family == "resnet" else "dynamic",
           "fp32_bytes": src.stat().st_size, "int8_bytes": dst.stat().st_size, "threads": threads,
           "repeats": repeats, "int8_path": str(dst),
           "fold_transposes": fold_transposes and card.family != "resnet"}
    fig["size_ratio"] = fig["fp32_bytes"] / fig["int8_bytes"]
    if card.family == "bert":
        encs = [fp32.encode(s) for s in SENTENCES[:8]]
        ms = _median_ms({"fp32": lambda: fp32.run(encs), "int8": lambda: int8.run(encs)}, repeats)
        drift = embedding_drift if card.task == "text-embeddings" else head_drift
        fig.update(drift(fp32, int8), workload="8 sentences")
    elif card.family == "gpt2":
        ids = rng.integers(0, fp32.spec.vocab_size, (1, 64))
        _, past, mask = fp32.prefill([list(ids[0])])
        step = (ids[:, :1], np.ones((1, 65), np.int64), np.full((1, 1), 64, np.int64))
        ms = _median_ms({"fp32": lambda: fp32.prefill([list(ids[0])]), "int8": lambda: int8.prefill([list(ids[0])]),
                         "fp32_decode": lambda: fp32.step(*step, past), "int8_decode": lambda: int8.step(*step, past)},
                        repeats)
        fig["decode_ms_fp32"], fig["decode_ms_int8"] = ms["fp32_decode"], ms["int8_decode"]
        fig["decode_speedup"] = ms["fp32_decode"] / ms["int8_decode"]
        fig.update(lm_drift(fp32, int8), workload="prefill 64 tokens; decode 1 token after 64")
    else:
        img = rng.normal(0, 1, (1, 3, fp32.size, fp32.size)).astype(np.float32)
        ms = _median_ms({"fp32": lambda: fp32.run([img[0]]), "int8": lambda: int8.run([img[0]])}, repeats)
        fig.update(image_drift(fp32, int8, rng), workload="1 image")
    fig.update(ms_fp32=ms["fp32"], ms_int8=ms["int8"], speedup=ms["fp32"] / ms["int8"])
    return fig
