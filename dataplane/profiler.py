"""Profiler: time real ONNX calls on this machine's provider and write the table the simulator reads.

Columns (exactly): ``model, phase, batch_size, tokens, context, ms, provider, host``.

* ``prefill``: LM prompt of ``tokens`` tokens for each of ``batch_size`` sequences, empty past;
* ``decode``: one LM step (``tokens`` = 1) over a past of ``context`` tokens for ``batch_size`` sequences
  (on CUDA with the past already in GPU memory, as the engine keeps it);
* ``encode``: text encoder over ``batch_size`` sequences of ``tokens`` tokens;
* ``image``: image classifier over ``batch_size`` 224x224 images (``tokens`` = 0);
* ``audio``: speech encoder over ``batch_size`` clips of ``tokens`` feature frames (10 ms each).

``ms`` is the median wall time of one call after a warm-up call; repeats stop early when a cell has used
its time allowance, so large models stay affordable on small machines.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dataplane import registry
from dataplane.errors import UserError
from dataplane.session import SessionConfig

COLUMNS = ["model", "phase", "batch_size", "tokens", "context", "ms", "provider", "host"]
DEFAULT_MODELS = ("gpt2-tiny", "gpt2-small", "minilm-l6-v2", "resnet-small", "ctc-small")


@dataclass(frozen=True)
class ProfileGrid:
    """The points measured per phase, and how hard to measure each."""

    prefill_tokens: tuple[int, ...] = (16, 64, 128, 256, 512)
    prefill_batch: tuple[int, ...] = (1, 4, 8)
    decode_batch: tuple[int, ...] = (1, 4, 8, 16, 32)
    decode_context: tuple[int, ...] = (64, 256, 512, 1000)
    encode_batch: tuple[int, ...] = (1, 8, 32)
    encode_tokens: tuple[int, ...] = (16, 64, 128, 256)
    image_batch: tuple[int, ...] = (1, 4, 16)
    audio_frames: tuple[int, ...] = (500, 1500, 3000)
    audio_batch: tuple[int, ...] = (1, 4)
    repeats: int = 5
    cell_budget_s: float = 3.0


QUICK = ProfileGrid(prefill_tokens=(16, 128), prefill_batch=(1, 4), decode_batch=(1, 8), decode_context=(64, 256),
                    encode_batch=(1, 8), encode_tokens=(16, 64), image_batch=(1, 4), audio_frames=(500,),
                    audio_batch=(1,), repeats=3, cell_budget_s=1.0)


def time_call(fn: Callable[[], object], repeats: int, budget_s: float) -> float:
    """Median milliseconds of ``fn()`` over up to ``repeats`` calls after one warm-up call."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats and (not times or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return float(np.median(times))


def _lm_rows(model, grid: ProfileGrid, rng: np.random.Generator) -> Iterator[tuple]:
    spec = model.spec
    for batch in grid.prefill_batch:
        for tokens in grid.prefill_tokens:
            if tokens >= spec.n_ctx:
                continue
            prompts = [list(rng.integers(0, 256, tokens)) for _ in range(batch)]
            yield "prefill", batch, tokens, 0, time_call(lambda p=prompts: model.prefill(p), grid.repeats,
                                                        grid.cell_budget_s)
    for batch in grid.decode_batch:
        for ctx in grid.decode_context:
            if ctx >= spec.n_ctx:
                continue
            shape = (batch, spec.n_head, ctx, spec.head_dim)
            past = [rng.standard_normal(shape, dtype=np.float32) for _ in model.past_names]
            ids = rng.integers(0, 256, (batch, 1))
            mask = np.ones((batch, ctx + 1), np.int64)
            pos = np.full((batch, 1), ctx, np.int64)
            # On CUDA the engine keeps the KV cache on the GPU between steps (LMEngineConfig.device_kv), so
            # a step is timed the way it runs there: past already on the device, present left there.
            keep = model.on_cuda
            if keep:
                past = model.device_past(past)
            yield "decode", batch, 1, ctx, time_call(
                lambda a=(ids, mask, pos, past), k=keep: model.step(*a, keep_on_device=k), grid.repeats,
                grid.cell_budget_s)


def _encoder_rows(model, grid: ProfileGrid, rng: np.random.Generator) -> Iterator[tuple]:
    vocab = min(model.spec.vocab_size, 1000)
    for batch in grid.encode_batch:
        for tokens in grid.encode_tokens:
            feeds = {"input_ids": rng.integers(3, vocab, (batch, tokens)),
                     "attention_mask": np.ones((batch, tokens), np.int64),
                     "token_type_ids": np.zeros((batch, tokens), np.int64)}
            feeds = {k: v for k, v in feeds.items() if k in model.session.input_names}
            yield "encode", batch, tokens, 0, time_call(lambda f=feeds: model.session.run(f), grid.repeats,
                                                        grid.cell_budget_s)


def _image_rows(model, grid: ProfileGrid, rng: np.random.Generator) -> Iterator[tuple]:
    for batch in grid.image_batch:
        images = [rng.standard_normal((3, model.size, model.size), dtype=np.float32) for _ in range(batch)]
        yield "image", batch, 0, 0, time_call(lambda x=images: model.run(x), grid.repeats, grid.cell_budget_s)


def _audio_rows(model, grid: ProfileGrid, rng: np.random.Generator) -> Iterator[tuple]:
    for batch in grid.audio_batch:
        for frames in grid.audio_frames:
            mel = rng.standard_normal((batch, model.spec.n_mels, frames), dtype=np.float32)
            yield "audio", batch, frames, 0, time_call(lambda m=mel: model.session.run({"mel": m}), grid.repeats,
                                                       grid.cell_budget_s)


_BY_TASK = {
    "text-generation": _lm_rows,
    "text-embeddings": _encoder_rows,
    "text-classification": _encoder_rows,
    "text-reranking": _encoder_rows,
    "image-classification": _image_rows,
    "automatic-speech-recognition": _audio_rows,
}


def profile(models: list[str], grid: ProfileGrid = QUICK, config: SessionConfig | None = None,
            seed: int = 0, progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Measure every model in ``models`` over ``grid``; returns the profile table."""
    rng = np.random.default_rng(seed)
    host = socket.gethostname()
    rows = []
    for name in models:
        card = registry.get_card(name)
        model = registry.load(name, config)
        for phase, batch, tokens, ctx, ms in _BY_TASK[card.task](model, grid, rng):
            rows.append((name, phase, batch, tokens, ctx, round(ms, 4), model.provider, host))
            if progress:
                progress(f"{name:<16} {phase:<8} batch={batch:<3} tokens={tokens:<5} context={ctx:<5} {ms:9.2f} ms")
    return pd.DataFrame(rows, columns=COLUMNS)


TABLE_SUFFIXES = (".csv", ".parquet")


def write_table(table: pd.DataFrame, path: str | Path) -> Path:
    """Write CSV (``.csv``) or Parquet (``.parquet``), all or nothing: into a temporary file beside ``path``,
    renamed onto it once written."""
    path = Path(path)
    if path.suffix not in TABLE_SUFFIXES:
        raise UserError(f"{path}: write a .csv or a .parquet file, not {path.suffix or 'a name with no suffix'}")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".parquet":
            table.to_parquet(tmp, index=False)
        else:
            table.to_csv(tmp, index=False)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return path


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a profile table written by :func:`write_table` (CSV or Parquet)."""
    path = Path(path)
    table = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    if list(table.columns) != COLUMNS:
        raise UserError(f"{path}: not a profile table (columns {list(table.columns)})")
    return table
