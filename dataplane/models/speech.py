"""Speech recognition: a Whisper-style audio encoder over log-mel features with a CTC head.

Input ``mel [B,n_mels,F]`` (F frames of 10 ms), two Conv1d+GELU layers (the second halves the frame
rate), sinusoidal positions, pre-LayerNorm transformer blocks, then a linear CTC head over
``ALPHABET`` (index 0 is the CTC blank). Output ``log_probs [B,F/2,V]``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from dataplane.graph import GraphBuilder, normal_f32

BUILDER_VERSION = 1
ALPHABET = ("<blank>", " ", "'", *"abcdefghijklmnopqrstuvwxyz")


@dataclass(frozen=True)
class SpeechSpec:
    """Shape of a speech model: encoder layers, width, heads, mel bands, the most frames, weight seed."""
    n_layer: int
    width: int
    n_head: int
    n_mels: int = 80
    max_frames: int = 3000  # 30 s at 10 ms per frame, as Whisper
    seed: int = 0

    def key(self) -> dict:
        return {"family": "ctc", "builder": BUILDER_VERSION, **asdict(self)}


PRESETS: dict[str, SpeechSpec] = {
    "tiny": SpeechSpec(n_layer=4, width=256, n_head=4),  # ~3.3M params
    "small": SpeechSpec(n_layer=6, width=384, n_head=6),  # Whisper-tiny encoder shape, ~11M params
}


def _sinusoids(length: int, channels: int) -> np.ndarray:
    inc = np.log(10000) / (channels // 2 - 1)
    inv = np.exp(-inc * np.arange(channels // 2))
    t = np.arange(length)[:, None] * inv[None, :]
    return np.concatenate([np.sin(t), np.cos(t)], axis=1).astype(np.float32)


def build(spec: SpeechSpec, rng: np.random.Generator):
    """The ONNX model with deterministic weights drawn from ``rng``."""
    g = GraphBuilder("ctc_speech")
    c, h_ = spec.width, spec.n_head
    d_ = c // h_
    mel = g.input("mel", np.float32, ["batch", spec.n_mels, "frames"])
    g.output("log_probs", np.float32, ["batch", "steps", len(ALPHABET)])

    def n(*shape, std=0.02):
        return normal_f32(rng, std, shape)

    def conv1d(x, c_in, stride, name):
        w = n(c, c_in, 3, std=np.sqrt(1.0 / (c_in * 3)))
        y = g.op("Conv", [x, g.weight(name + ".w", w), g.weight(name + ".b", np.zeros(c, np.float32))],
                 kernel_shape=[3], strides=[stride], pads=[1, 1])
        return g.gelu_erf(y)

    x = conv1d(conv1d(mel, spec.n_mels, 1, "conv1"), c, 2, "conv2")
    x = g.op("Transpose", [x], perm=[0, 2, 1])  # [B, steps, C]
    steps = g.op("Gather", [g.op("Shape", [x]), g.const(1)], axis=0)
    pos = g.op("Slice", [g.weight("pos", _sinusoids(spec.max_frames // 2, c)), g.const([0]),
                         g.op("Unsqueeze", [steps, g.const([0])]), g.const([0])])
    x = g.op("Add", [x, pos])
    ones, zeros = np.ones(c, np.float32), np.zeros(c, np.float32)
    split_shape, merge_shape = g.const([0, 0, h_, d_]), g.const([0, 0, c])
    scale = g.const(1.0 / np.sqrt(d_), np.float32)
    for i in range(spec.n_layer):
        p = f"l{i}."
        a = g.layer_norm(x, ones, zeros, p + "ln1", 1e-5)
        q, k, v = (g.op("Transpose", [g.op("Reshape", [g.linear(a, n(c, c), zeros, p + t), split_shape])],
                        perm=[0, 2, 1, 3]) for t in ("q", "k", "v"))
        s = g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])]), scale])
        ctx = g.op("MatMul", [g.op("Softmax", [s], axis=-1), v])
        ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), merge_shape])
        x = g.op("Add", [x, g.linear(ctx, n(c, c), zeros, p + "o")])
        m = g.layer_norm(x, ones, zeros, p + "ln2", 1e-5)
        m = g.linear(g.gelu_erf(g.linear(m, n(c, 4 * c), np.zeros(4 * c, np.float32), p + "fc1")), n(4 * c, c), zeros, p + "fc2")
        x = g.op("Add", [x, m])
    x = g.layer_norm(x, ones, zeros, "ln_post", 1e-5)
    logits = g.linear(x, n(c, len(ALPHABET), std=0.5), np.zeros(len(ALPHABET), np.float32), "ctc")
    g.op("LogSoftmax", [logits], axis=-1, out="log_probs")
    return g.build(doc=f"edgepop CTC speech {spec}")


def ctc_greedy_decode(log_probs: np.ndarray) -> str:
    """Best path decoding of one utterance ``[steps, V]``: argmax, merge repeats, drop blanks."""
    best = log_probs.argmax(-1)
    out, prev = [], -1
    for idx in best:
        if idx != prev and idx != 0:
            out.append(ALPHABET[idx])
        prev = idx
    return " ".join("".join(out).split())
