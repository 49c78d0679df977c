"""onnxruntime sessions: provider choice, thread settings, and the one place that reports which provider ran.

``onnxruntime-gpu`` lists ``CUDAExecutionProvider`` as available even on machines without CUDA libraries,
and asking for it there prints a screen of errors before falling back. So we only request CUDA after a
quiet probe has shown that it really loads: the probe runs once, in a subprocess (its noise goes to
/dev/null), and its answer is cached for the life of the process.
"""

from __future__ import annotations

import ctypes.util
import functools
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from dataplane.errors import InvalidInputError

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}

_PROBE = r"""
import numpy as np, onnx, onnxruntime as ort
from onnx import helper, TensorProto
g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "p",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]); m.ir_version = 10
try:
    ort.preload_dlls()
except Exception:
    pass
s = ort.InferenceSession(m.SerializeToString(), providers=["CUDAExecutionProvider"])
s.run(None, {"x": np.ones(1, np.float32)})
print("PROVIDER=" + s.get_providers()[0])
"""


def _driver_present() -> bool:
    # Cheap pre-check so CPU-only machines never pay for the subprocess probe.
    return Path("/dev/nvidiactl").exists() or ctypes.util.find_library("cuda") is not None or sys.platform == "win32"


@functools.cache
def cuda_available() -> bool:
    """True if onnxruntime can really run a graph on CUDA here (probed once, quietly, in a subprocess)."""
    if "CUDAExecutionProvider" not in ort.get_available_providers() or not _driver_present():
        return False
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "PROVIDER=CUDAExecutionProvider" in proc.stdout


def resolve_provider(choice: str = "auto") -> str:
    """Map ``auto|cpu|cuda`` (or ``$EDGEPOP_PROVIDER`` when ``auto``) to an onnxruntime provider name."""
    choice = (choice or "auto").lower()
    source = ""  # where the choice came from, so an error points at what the user must change
    if choice == "auto":
        env = os.environ.get("EDGEPOP_PROVIDER", "").strip()
        if env:  # set but empty: auto
            choice, source = env.lower(), f" (from $EDGEPOP_PROVIDER={env!r})"
    if choice == "auto":
        return PROVIDERS["cuda"] if cuda_available() else PROVIDERS["cpu"]
    if choice not in PROVIDERS:
        raise InvalidInputError(f"unknown provider '{choice}'{source}; expected one of auto, cpu, cuda")
    if choice == "cuda" and not cuda_available():
        raise InvalidInputError(f"provider 'cuda' was requested{source} but CUDA cannot be loaded on this machine")
    return PROVIDERS[choice]


# Intra-op threads beyond this are a mistake, not a configuration: each is an OS thread with its own stack
# (100,000 asked for made tens of thousands of threads and 17 GB before the machine stalled).
MAX_THREADS = max(256, 8 * (os.cpu_count() or 1))


def threads_problem(value) -> str | None:
    """Why ``value`` is not a usable intra-op thread count (None when it is: 0 means one per core)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_THREADS:
        return f"{value!r} is not an integer from 0 (one per core) to {MAX_THREADS}"
    return None


@dataclass(frozen=True)
class SessionConfig:
    """How to open sessions. ``intra_op_threads=0`` lets onnxruntime use one thread per core.
    ``allow_spinning=False`` makes idle intra-op threads sleep instead of spin-waiting, so two sessions that
    take turns (a speculative draft and its target) do not steal each other's cores.
    ``cuda_tf32``: let CUDA run float32 matrix products on TF32 tensor cores (Ampere and later). onnxruntime
    does so by default, which moves outputs by about 1e-3 from float32 (a 10-bit mantissa): enough to fail
    the reference checks and to make a GPU answer differ from the CPU's. Off here, so both providers compute
    float32; turn it on to measure what TF32 buys."""

    provider: str = "auto"
    intra_op_threads: int = 0
    inter_op_threads: int = 1
    optimization: str = "all"  # "basic" | "extended" | "all"
    allow_spinning: bool = True
    cuda_tf32: bool = False

    def __post_init__(self):
        # checked when built: a bad optimization was a bare KeyError when the first session opened, and bad
        # thread counts reached onnxruntime (the CLI's and the gateway's own checks do not cover API users)
        for name in ("intra_op_threads", "inter_op_threads"):
            if problem := threads_problem(getattr(self, name)):
                raise ValueError(f"SessionConfig.{name}: {problem}")
        if self.optimization not in OPTIMIZATIONS:
            raise ValueError(f"SessionConfig.optimization must be one of {', '.join(OPTIMIZATIONS)}, "
                             f"got {self.optimization!r}")
        p = self.provider
        if p is not None and (not isinstance(p, str) or (p or "auto").lower() not in ("auto", *PROVIDERS)):
            raise ValueError(f"SessionConfig.provider must be one of auto, cpu, cuda, got {p!r}")
        for name in ("allow_spinning", "cuda_tf32"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"SessionConfig.{name} must be true or false, got {getattr(self, name)!r}")


OPTIMIZATIONS = ("basic", "extended", "all")
_OPT = {
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


class Session:
    """An ``InferenceSession`` plus the provider that actually runs it (``provider``)."""

    def __init__(self, path: str | Path, config: SessionConfig | None = None):
        self.config = config or SessionConfig()
        self.path = Path(path)
        opts = ort.SessionOptions()
        opts.log_severity_level = 3  # errors only: keep fallbacks and shape hints off the console
        opts.intra_op_num_threads = self.config.intra_op_threads
        opts.inter_op_num_threads = self.config.inter_op_threads
        opts.graph_optimization_level = _OPT[self.config.optimization]
        if not self.config.allow_spinning:
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        wanted = resolve_provider(self.config.provider)
        if wanted == PROVIDERS["cpu"]:
            providers: list = [wanted]
        else:
            providers = [(wanted, {"use_tf32": "1" if self.config.cuda_tf32 else "0"}), PROVIDERS["cpu"]]
        self.ort = ort.InferenceSession(str(self.path), sess_options=opts, providers=providers)
        self.input_names = [i.name for i in self.ort.get_inputs()]
        self.output_names = [o.name for o in self.ort.get_outputs()]

    @property
    def provider(self) -> str:
        """The execution provider that runs this session (the first one onnxruntime kept)."""
        return self.ort.get_providers()[0]

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> list[np.ndarray]:
        """Run the graph; ``outputs`` defaults to all outputs in graph order."""
        return self.ort.run(outputs, feeds)
