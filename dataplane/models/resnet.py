"""Image classifier with the ResNet architecture (basic blocks), input ``pixel_values [B,3,224,224]``.

BatchNorm is folded into each convolution's bias, as deployment exporters do, so the graph holds only
Conv/Relu/Add/MaxPool/GlobalAveragePool/Gemm; output ``logits [B,num_classes]``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from dataplane.graph import GraphBuilder, normal_f32

BUILDER_VERSION = 1


@dataclass(frozen=True)
class ResNetSpec:
    """Stage widths and blocks per stage; ``image_size`` is the square input side."""

    widths: tuple[int, ...]
    blocks: tuple[int, ...]
    num_classes: int = 1000
    image_size: int = 224
    seed: int = 0

    def key(self) -> dict:
        return {"family": "resnet", "builder": BUILDER_VERSION, **asdict(self)}


PRESETS: dict[str, ResNetSpec] = {
    "tiny": ResNetSpec(widths=(16, 32, 64, 128), blocks=(1, 1, 1, 1)),  # ~0.3M params, ~0.1 GFLOP
    "small": ResNetSpec(widths=(64, 128, 256, 512), blocks=(2, 2, 2, 2)),  # ResNet-18: 11.7M, 1.8 GFLOP
}


def build(spec: ResNetSpec, rng: np.random.Generator):
    """The ONNX model with deterministic He-initialised weights drawn from ``rng``."""
    g = GraphBuilder("resnet")
    x = g.input("pixel_values", np.float32, ["batch", 3, spec.image_size, spec.image_size])
    g.output("logits", np.float32, ["batch", spec.num_classes])
    counter = iter(range(10_000))

    def conv(x, c_in, c_out, k, stride, relu=True):
        name = f"conv{next(counter)}"
        w = normal_f32(rng, np.sqrt(2.0 / (c_in * k * k)), (c_out, c_in, k, k))
        y = g.op("Conv", [x, g.weight(name + ".w", w), g.weight(name + ".b", np.zeros(c_out, np.float32))],
                 kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)
        return g.op("Relu", [y]) if relu else y

    x = conv(x, 3, spec.widths[0], 7, 2)
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = spec.widths[0]
    for stage, (width, n_blocks) in enumerate(zip(spec.widths, spec.blocks, strict=True)):
        for b in range(n_blocks):
            stride = 2 if (stage > 0 and b == 0) else 1
            y = conv(conv(x, c_in, width, 3, stride), width, width, 3, 1, relu=False)
            shortcut = x if (stride == 1 and c_in == width) else conv(x, c_in, width, 1, stride, relu=False)
            x = g.op("Relu", [g.op("Add", [y, shortcut])])
            c_in = width
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    fc = normal_f32(rng, 1.0 / np.sqrt(c_in), (spec.num_classes, c_in))
    g.op("Gemm", [x, g.weight("fc.w", fc), g.weight("fc.b", np.zeros(spec.num_classes, np.float32))],
         transB=1, out="logits")
    return g.build(doc=f"edgepop ResNet {spec}")
