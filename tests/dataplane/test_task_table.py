"""The task table is the only definition of a Workers AI task: the synchronous path (``DataPlane.run``) and the
gateway's (``invoke.prepare`` -> ``EngineRun``) must give the same result, and the same error, for the same inputs.

Real ONNX models (the tiny stand-ins). The engines here run one item per batch, so that both paths compute
bit-identical outputs and results can be compared with ``==``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import struct
import threading
import zlib

import numpy as np
import pytest
from PIL import Image

from dataplane import tasks
from dataplane.audio import encode_wav
from dataplane.engine_batch import BatchConfig
from dataplane.errors import CapacityError, DataPlaneError, InvalidInputError
from dataplane.gateway import invoke
from dataplane.service import DataPlane, DataPlaneConfig


def _png(h: int = 30, w: int = 40) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _bomb(side: int = 7000) -> bytes:
    """A PNG whose header claims side x side pixels (7000: over MAX_IMAGE_PIXELS; 60000: over Pillow's own
    decompression-bomb bound too); only its header may ever be read."""
    png = _png(1, 1)  # signature (8), IHDR length and type (8), IHDR data (13), CRC (4), ...
    ihdr = struct.pack(">II", side, side) + png[24:29]
    return png[:16] + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr)) + png[33:]


def _wav(seconds: float = 1.0) -> bytes:
    t = np.arange(int(16000 * seconds)) / 16000
    return encode_wav(0.3 * np.sin(2 * np.pi * 440 * t))


CASES = {  # one request per task
    "text-generation": ("gpt2-tiny", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 7,
                                      "seed": 3}),
    "text-embeddings": ("bert-tiny-embed", {"text": ["one", "two words", "three little words"]}),
    "text-classification": ("bert-tiny-classify", {"text": "great movie"}),
    "text-reranking": ("bert-tiny-rerank", {"query": "q", "contexts": [{"text": "a"}, {"text": "b b"},
                                                                        {"text": "c"}], "top_k": 2}),
    "image-classification": ("resnet-tiny", {"image": list(_png())}),
    "automatic-speech-recognition": ("ctc-tiny", {"audio": _wav()}),
}

BAD = [
    ("gpt2-tiny", "not a dict"),
    ("gpt2-tiny", {"max_tokens": 5}),
    ("gpt2-tiny", {"messages": [{"role": "robot", "content": "x"}]}),
    ("gpt2-tiny", {"prompt": "x", "max_tokens": -1}),
    ("gpt2-tiny", {"prompt": "x", "ignore_eos": "yes"}),
    ("gpt2-tiny", {"prompt": "x", "max_token": 4}),  # misspelt: it was dropped (256 tokens ran)
    ("gpt2-tiny", {"prompt": "x", "stop": ["a"]}),  # ignored, it returned text past the stop sequence
    ("gpt2-tiny", {"prompt": "x" * 600}),  # over the 512-token context: CapacityError
    ("bert-tiny-embed", {"text": ["ok", 3]}),
    ("bert-tiny-embed", {"text": ["x"] * 101}),
    ("bert-tiny-classify", {"text": None}),
    ("bert-tiny-classify", [1, 2]),
    ("bert-tiny-rerank", {"query": "q", "contexts": [{"text": "a"}], "top_k": 0}),
    ("bert-tiny-rerank", {"query": "q", "contexts": ["not an object"]}),
    ("resnet-tiny", {"image": b"definitely not an image"}),
    ("resnet-tiny", {"image": [1, 2, 300]}),
    ("resnet-tiny", {"image": _bomb()}),  # refused from its header: CapacityError
    ("ctc-tiny", {"audio": b"RIFF....WAVEjunk"}),
    ("ctc-tiny", {"audio": b""}),
]


@pytest.fixture(scope="module")
def dp1(_model_cache):
    with DataPlane(DataPlaneConfig(batch=BatchConfig(max_batch=1, max_wait_ms=0))) as plane:
        yield plane


def _gateway(dp, model: str, inputs):
    """The gateway's path without HTTP: prepare, then the engine run; returns the Workers AI result."""
    async def go():
        prep = await invoke.prepare(dp, dp.card(model).task, model, inputs)
        return (await invoke.EngineRun(dp, prep).result()).result

    return asyncio.run(go())


def test_cases_cover_every_task_of_the_table():
    assert set(CASES) == set(tasks.TASKS) == set(tasks.TASK_FUNCTIONS)
    assert {m for m, _ in BAD} == {m for m, _ in CASES.values()}


@pytest.mark.parametrize("task", sorted(CASES))
def test_sync_and_gateway_results_are_identical(dp1, task):
    model, inputs = CASES[task]
    assert dp1.card(model).task == task
    sync = dp1.run(model, inputs)
    assert sync == _gateway(dp1, model, inputs)
    assert sync == tasks.TASK_FUNCTIONS[task](dp1, model, inputs)


def test_streamed_generation_is_the_same_text_on_both_paths(dp1):
    model, inputs = CASES["text-generation"]
    whole = dp1.run(model, inputs)
    events = list(dp1.run(model, {**inputs, "stream": True}))

    async def gateway_stream():
        prep = await invoke.prepare(dp1, "text-generation", model, {**inputs, "stream": True})
        stream = invoke.TokenStream(dp1, prep)
        return "".join([piece async for piece, _ in stream.pieces()]), stream.usage()

    text, usage = asyncio.run(gateway_stream())
    assert "".join(e["response"] for e in events) == text == whole["response"]
    assert events[-1] == {"response": "", "usage": whole["usage"]}
    assert usage["total_tokens"] == whole["usage"]["total_tokens"]


@pytest.mark.parametrize("model,inputs", BAD, ids=lambda v: v if isinstance(v, str) else None)
def test_bad_input_gives_the_same_error_on_both_paths(dp1, model, inputs):
    with pytest.raises(DataPlaneError) as sync:
        dp1.run(model, inputs)
    with pytest.raises(DataPlaneError) as gw:
        asyncio.run(invoke.prepare(dp1, dp1.card(model).task, model, inputs))
    assert isinstance(sync.value, InvalidInputError | CapacityError)
    assert (type(sync.value), str(sync.value)) == (type(gw.value), str(gw.value))


def test_an_image_beyond_pillows_bomb_bound_is_too_large_not_undecodable(dp1):
    """Pillow refuses such a header itself: that is still a 413 (too large), not a 400 (undecodable)."""
    with pytest.raises(CapacityError, match="more than 40,000,000 pixels"):
        dp1.run("resnet-tiny", {"image": _bomb(60_000)})


def test_a_long_thin_image_is_scaled_as_its_crop_not_as_a_whole(dp1):
    """A 20,000 x 1 PNG (a few hundred bytes) scaled to a 256-pixel short side would be 5 million pixels wide
    (gigabytes): only its centre crop is scaled. Ordinary images take the plain resize-then-crop path."""
    import resource

    model = dp1.model("resnet-tiny")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    x = model.preprocess(_png(1, 20_000))
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert x.shape == (3, model.size, model.size) and np.isfinite(x).all()
    assert grown_mb < 500, grown_mb  # (the whole-image resize took ~5 GB)
    assert model.preprocess(_png(30, 40)).shape == (3, model.size, model.size)


def test_prepared_sizes_what_the_control_plane_admits(dp1):
    gen = tasks.TASKS["text-generation"].prepare(dp1, "gpt2-tiny", {"prompt": "Hi", "max_tokens": 900,
                                                                    "ignore_eos": True})
    assert (gen.units, gen.output_tokens, gen.input_units, gen.items) == (2, 510, 2.0, [[72, 105]])
    assert gen.params.stop_on_eos is False and gen.stream is False
    model, inputs = CASES["text-embeddings"]
    emb = tasks.TASKS["text-embeddings"].prepare(dp1, model, inputs)
    lengths = [len(dp1.model(model).encode(t)) for t in inputs["text"]]
    assert (emb.units, emb.input_units, len(emb.items)) == (max(lengths), float(sum(lengths)), 3)
    rr = tasks.TASKS["text-reranking"].prepare(dp1, *CASES["text-reranking"])
    assert rr.extra == {"top_k": 2}
    img = tasks.TASKS["image-classification"].prepare(dp1, *CASES["image-classification"])
    assert (img.units, img.input_units) == (1, 1.0)
    asr = tasks.TASKS["automatic-speech-recognition"].prepare(dp1, "ctc-tiny", {"audio": _wav(2.0)})
    assert asr.units == 2 and asr.input_units == pytest.approx(2 / 60, rel=0.02)


def test_heavy_prepares_run_off_the_event_loop(dp1, monkeypatch):
    heavy = {name for name, row in tasks.TASKS.items() if row.heavy}
    assert heavy == {"image-classification", "automatic-speech-recognition"}
    threads = {}
    for name, row in list(tasks.TASKS.items()):
        def spy(model, stand_in, inputs, _row=row, _name=name):
            threads[_name] = threading.get_ident()
            return _row.prepare_fn(model, stand_in, inputs)

        monkeypatch.setitem(tasks.TASKS, name, dataclasses.replace(row, prepare_fn=spy))

    async def prepare_all():
        for task, (model, inputs) in CASES.items():
            await invoke.prepare(dp1, task, model, inputs)
        return threading.get_ident()

    loop_thread = asyncio.run(prepare_all())
    assert set(threads) == set(tasks.TASKS)
    assert {name for name, tid in threads.items() if tid != loop_thread} == heavy


def test_lora_is_refused_on_the_synchronous_path_for_every_task(dp1):
    for model, inputs in CASES.values():
        with pytest.raises(InvalidInputError, match="field 'lora'"):
            dp1.run(model, {**inputs, "lora": "legal"})


def test_wrong_model_for_a_task_and_unserved_task(dp1):
    with pytest.raises(InvalidInputError, match="serves text-generation, not text-embeddings"):
        tasks.text_embeddings(dp1, "gpt2-tiny", {"text": "x"})
    with pytest.raises(InvalidInputError, match="serves text-embeddings, not text-generation"):
        asyncio.run(invoke.prepare(dp1, "text-generation", "bert-tiny-embed", {"prompt": "x"}))
    with pytest.raises(InvalidInputError, match="'telepathy' is not served"):
        asyncio.run(invoke.prepare(dp1, "telepathy", "gpt2-tiny", {}))


def test_a_streamed_wav_that_ends_inside_a_frame_is_read_to_its_last_whole_frame():
    """A header of 0xFFFFFFFF frames (ffmpeg writing to a pipe) and data cut one byte into a frame."""
    from dataplane.audio import decode_wav, encode_wav

    wav = bytearray(encode_wav(np.zeros(16_000, dtype=np.float32)) + b"\x00")
    wav[4:8] = wav[40:44] = b"\xff\xff\xff\xff"
    assert len(decode_wav(bytes(wav), 30.0)) == 16_000  # (numpy refused the odd byte count: a raw ValueError)


def test_a_wav_whose_chunk_size_runs_past_the_end_is_invalid_input(dp1):
    """Python's wave raises a bare RuntimeError (no message) for a chunk longer than the file: it escaped as one."""
    wav = bytearray(_wav())
    wav[16:20] = (10**6).to_bytes(4, "little")  # the fmt chunk's size
    with pytest.raises(InvalidInputError, match=r"^audio is not a readable PCM WAV file \(a chunk's size runs past "
                                                r"the end of the file\)$"):
        dp1.run("ctc-tiny", {"audio": bytes(wav)})
