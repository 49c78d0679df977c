"""Loaded models: a session plus the pre/post-processing that turns task inputs into graph feeds.

Each class exposes a batch-level call that the engines (:mod:`dataplane.engine_lm`,
:mod:`dataplane.engine_batch`) drive; none of them
holds request state, so one instance can serve many engines and threads (onnxruntime's ``run`` is
thread-safe).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnxruntime as ort

from dataplane.audio import decode_wav, log_mel
from dataplane.errors import InvalidInputError
from dataplane.models import speech
from dataplane.models.gpt2 import GPT2Spec
from dataplane.session import Session, SessionConfig
from dataplane.tokenization import ByteTokenizer, Encoding, pad_batch

SYNTHETIC_NOTE = "synthetic weights: real compute, meaningless output"


def left_pad_prompts(prompts: list[list[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``prompts`` left padded to the longest: ``[B,P]`` token ids, attention mask and position ids."""
    t_ = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), t_), np.int64)
    mask = np.zeros((len(prompts), t_), np.int64)
    for row, p in enumerate(prompts):
        ids[row, t_ - len(p):] = p
        mask[row, t_ - len(p):] = 1
    return ids, mask, np.maximum(np.cumsum(mask, axis=1) - 1, 0)


class DeviceKV:
    """Key/value tensors left where the provider computed them (GPU memory on CUDA).

    A decode step on CUDA that took and returned host arrays would copy the whole cache across PCIe twice
    per token (gpt2-small, 8 rows of 256 positions: 150 MB each way). The engine keeps the cache here while
    its batch stays the same and copies it out (:meth:`numpy`) only when rows join or leave."""

    __slots__ = ("values",)

    def __init__(self, values: list):
        self.values = values  # onnxruntime OrtValues, one per past input

    def numpy(self) -> list[np.ndarray]:
        """Host copies, in the model's past order."""
        return [v.numpy() for v in self.values]


class LanguageModel:
    """GPT-2 graph with KV cache: :meth:`prefill` for prompts, :meth:`step` for one token per sequence."""

    def __init__(self, name: str, spec: GPT2Spec, path: Path, config: SessionConfig | None = None,
                 synthetic: bool = True):
        self.name, self.spec, self.synthetic = name, spec, synthetic
        self.session = Session(path, config)
        self.tokenizer = ByteTokenizer(spec.vocab_size)
        self.past_names = [f"past_{kind}.{i}" for i in range(spec.n_layer) for kind in ("key", "value")]

    @property
    def provider(self) -> str:
        return self.session.provider

    @property
    def on_cuda(self) -> bool:
        """Whether the graph runs on CUDA (where a KV cache left on the device saves a PCIe round trip a step)."""
        return self.provider == "CUDAExecutionProvider"

    @property
    def _kv_device(self) -> str:
        return "cuda" if self.on_cuda else "cpu"

    def device_past(self, past: list[np.ndarray]) -> DeviceKV:
        """``past`` copied once into the provider's memory: what a decode step finds there in steady state."""
        return DeviceKV([ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a), self._kv_device, 0)
                         for a in past])

    def empty_past(self, batch: int) -> list[np.ndarray]:
        """Per-layer key/value tensors of past length 0."""
        shape = (batch, self.spec.n_head, 0, self.spec.head_dim)
        return [np.zeros(shape, np.float32) for _ in self.past_names]

    def step(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray,
             past: list[np.ndarray] | DeviceKV, keep_on_device: bool = False
             ) -> tuple[np.ndarray, list[np.ndarray] | DeviceKV]:
        """One forward call; returns last-position logits ``[B,V]`` and the present KV list.

        ``keep_on_device``: return the present KV as a :class:`DeviceKV` left in the provider's memory (GPU
        memory on CUDA), so that the next step takes it without a round trip through host memory; ``past``
        may be one. Logits always come back as a host array."""
        if not keep_on_device and not isinstance(past, DeviceKV):
            feeds = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
            feeds.update(zip(self.past_names, past, strict=True))
            out = self.session.run(feeds)
            return out[0], out[1:]
        sess = self.session.ort
        io = sess.io_binding()
        io.bind_cpu_input("input_ids", np.ascontiguousarray(input_ids))
        io.bind_cpu_input("attention_mask", np.ascontiguousarray(attention_mask))
        io.bind_cpu_input("position_ids", np.ascontiguousarray(position_ids))
        if isinstance(past, DeviceKV):
            for name, value in zip(self.past_names, past.values, strict=True):
                io.bind_ortvalue_input(name, value)
        else:
            for name, arr in zip(self.past_names, past, strict=True):
                io.bind_cpu_input(name, np.ascontiguousarray(arr))
        names = self.session.output_names
        io.bind_output(names[0], "cpu")
        for name in names[1:]:
            io.bind_output(name, self._kv_device)
        sess.run_with_iobinding(io)
        out = io.get_outputs()
        return out[0].numpy(), DeviceKV(list(out[1:]))

    def prefill(self, prompts: list[list[int]]) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
        """Left-pad ``prompts`` into one call; returns logits, present KV and the ``[B,P]`` mask."""
        ids, mask, pos = left_pad_prompts(prompts)
        logits, present = self.step(ids, mask, pos, self.empty_past(len(prompts)))
        return logits, present, mask

    def last_logits(self, tokens: list[int]) -> np.ndarray:
        """Logits after ``tokens``, recomputing the whole sequence without a cache (a reference)."""
        return self.prefill([tokens])[0][0]


class TextEncoder:
    """BERT graph with one head; ``run`` maps encodings to embeddings or logits."""

    def __init__(self, name: str, spec, path: Path, tokenizer, config: SessionConfig | None = None,
                 labels: tuple[str, ...] = (), synthetic: bool = True, output: str | None = None):
        self.name, self.spec, self.tokenizer, self.labels, self.synthetic = name, spec, tokenizer, labels, synthetic
        self.session = Session(path, config)
        self.head = spec.head
        self.output = output or self.session.output_names[0]

    @property
    def provider(self) -> str:
        return self.session.provider

    def encode(self, text: str, pair: str | None = None) -> Encoding:
        """Tokenize one input, validating its type (the engines call this on the caller's thread)."""
        if not isinstance(text, str) or (pair is not None and not isinstance(pair, str)):
            raise InvalidInputError("text inputs must be strings")
        return self.tokenizer.encode(text, pair)

    def run(self, encodings: list[Encoding]) -> list[np.ndarray]:
        """Batched inference; returns one output row per encoding, in order.

        Sequences are sorted by length and cut into buckets whose longest member is at most ~1.3x the
        shortest (+8 tokens), so padding wastes little compute; results do not depend on the bucketing
        because padded positions are masked out. A graph without an ``attention_mask`` input cannot mask
        them (it would pool or attend over ``[PAD]``), so there a bucket holds one length only and no text
        is ever padded: its result never depends on its batch-mates.
        """
        masked = "attention_mask" in self.session.input_names
        order = sorted(range(len(encodings)), key=lambda i: len(encodings[i]))
        buckets: list[list[int]] = []
        for i in order:
            n, first = len(encodings[i]), len(encodings[buckets[-1][0]]) if buckets else 0
            if buckets and (n <= 1.3 * first + 8 if masked else n == first):
                buckets[-1].append(i)
            else:
                buckets.append([i])
        out: list[np.ndarray] = [None] * len(encodings)  # type: ignore[list-item]
        for bucket in buckets:
            for i, row in zip(bucket, self._run_padded([encodings[i] for i in bucket]), strict=True):
                out[i] = row
        return out

    def _run_padded(self, encodings: list[Encoding]) -> list[np.ndarray]:
        feeds = pad_batch(encodings, getattr(self.tokenizer, "pad_id", 0))
        out = self.session.run({k: v for k, v in feeds.items() if k in self.session.input_names}, [self.output])[0]
        if out.ndim == 3:  # a hidden-state output (e.g. a brought-in encoder): masked mean pooling
            m = feeds["attention_mask"][:, :, None].astype(np.float32)
            out = (out * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        if self.head == "embed":  # embeddings are unit vectors whatever the graph ends with (built-ins already
            # are; a brought-in [N,C] output may not be); logits of the other heads are left as they are
            out = out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return list(out)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


MAX_RESIZED_PIXELS = 4_000_000  # beyond, an image is scaled as its centre crop only (memory)


class ImageClassifier:
    """ResNet graph; images are decoded by Pillow, resized (short side 256), centre-cropped, normalised."""

    MEAN = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
    STD = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]

    def __init__(self, name: str, spec, path: Path, config: SessionConfig | None = None,
                 input_name: str = "pixel_values", labels: tuple[str, ...] = (), synthetic: bool = True):
        self.name, self.spec, self.synthetic, self.input_name = name, spec, synthetic, input_name
        self.session = Session(path, config)
        self.labels = labels or tuple(f"class_{i:03d}" for i in range(spec.num_classes))
        if len(self.labels) != spec.num_classes:
            raise ValueError(f"{len(self.labels)} labels for {spec.num_classes} classes")
        self.size = spec.image_size

    @property
    def provider(self) -> str:
        return self.session.provider

    def preprocess(self, data: bytes) -> np.ndarray:
        """Image bytes (PNG, JPEG, anything Pillow opens) -> ``[3,S,S]`` float32."""
        from PIL import Image, UnidentifiedImageError

        try:
            img = Image.open(io.BytesIO(data))
            img = img.convert("RGB")
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise InvalidInputError(f"image bytes could not be decoded ({exc})") from exc
        # Short side to size x 256/224, then the centre size x size crop.
        scale = round(self.size * 256 / 224) / min(img.size)
        width, height = max(self.size, round(img.width * scale)), max(self.size, round(img.height * scale))
        left, top = (width - self.size) // 2, (height - self.size) // 2
        if width * height <= MAX_RESIZED_PIXELS:
            img = img.resize((width, height), Image.Resampling.BILINEAR)
            img = img.crop((left, top, left + self.size, top + self.size))
        else:  # a long thin image (4000 x 1: 92 bytes) would be scaled to millions of pixels: resize only the
            # crop's source box (the same scale and sample positions; pixels may differ by one level of 255)
            fx, fy = img.width / width, img.height / height
            img = img.resize((self.size, self.size), Image.Resampling.BILINEAR,
                             box=(left * fx, top * fy, (left + self.size) * fx, (top + self.size) * fy))
        x = np.asarray(img, dtype=np.float32).transpose(2, 0, 1) / 255.0
        return (x - self.MEAN) / self.STD

    def run(self, images: list[np.ndarray]) -> list[np.ndarray]:
        """Class probabilities for a batch of preprocessed images."""
        logits = self.session.run({self.input_name: np.stack(images).astype(np.float32)})[0]
        while logits.ndim > 2 and logits.shape[-1] == 1:  # [N,C,1,1] heads, as registration allows
            logits = logits[..., 0]
        return list(_softmax(logits))


class SpeechRecognizer:
    """CTC speech graph over log-mel features; greedy CTC decoding to text."""

    def __init__(self, name: str, spec, path: Path, config: SessionConfig | None = None, synthetic: bool = True):
        self.name, self.spec, self.synthetic = name, spec, synthetic
        self.session = Session(path, config)

    @property
    def provider(self) -> str:
        return self.session.provider

    def features(self, data: bytes) -> np.ndarray:
        """WAV bytes -> log-mel ``[n_mels, frames]`` (at most 30 s)."""
        samples = decode_wav(data, max_s=self.spec.max_frames / 100)
        if len(samples) > self.spec.max_frames * 160:
            raise InvalidInputError(f"audio is longer than {self.spec.max_frames // 100} s")
        return log_mel(samples, self.spec.n_mels)

    def run(self, mels: list[np.ndarray]) -> list[str]:
        """Transcripts of a batch of feature arrays, padded with silence to the longest.

        The encoder has no attention mask (as Whisper, which pads to 30 s), so padding can change a
        transcript; the service therefore runs speech one clip per call.
        """
        frames = max(m.shape[1] for m in mels)
        frames += frames % 2
        batch = np.full((len(mels), self.spec.n_mels, frames), -1.5, np.float32)  # -1.5 ~ silence after scaling
        for i, m in enumerate(mels):
            batch[i, :, : m.shape[1]] = m
        log_probs = self.session.run({"mel": batch})[0]
        return [speech.ctc_greedy_decode(lp[: (m.shape[1] + 1) // 2]) for lp, m in zip(log_probs, mels, strict=True)]
