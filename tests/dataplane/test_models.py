"""Graphs built from code: KV cache correctness, padding/batching invariance, references, caching."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from kit.plugins import ROOT
from kit.waiting import until

from dataplane import audio, graph, registry
from dataplane.cache import cached_model, spec_key
from dataplane.models import bert, gpt2, minilm, resnet, speech
from dataplane.session import Session
from dataplane.tokenization import ByteEncoderTokenizer, pad_batch
from edgepop.errors import UserError

TOL = 1e-4


def test_param_counts_match_the_presets():
    assert 9e6 < gpt2.PRESETS["tiny"].n_params() < 12e6
    assert 123e6 < gpt2.PRESETS["small"].n_params() < 126e6  # GPT-2 small: 124.4M


def test_kv_cached_decoding_matches_full_recompute(lm):
    rng = np.random.default_rng(1)
    tokens = list(rng.integers(0, 256, 9))
    logits, past, mask = lm.prefill([tokens])
    for step in range(12):
        ref = lm.last_logits(tokens)
        np.testing.assert_allclose(logits[0], ref, atol=TOL, rtol=0)
        nxt = int(np.argmax(logits[0]))
        tokens.append(nxt)
        mask = np.concatenate([mask, np.ones((1, 1), np.int64)], axis=1)
        logits, past = lm.step(np.array([[nxt]]), mask, np.array([[len(tokens) - 1]]), past)
        assert past[0].shape[2] == 9 + step + 1


def test_batched_left_padded_prefill_and_decode_equal_unbatched(lm):
    rng = np.random.default_rng(2)
    prompts = [list(rng.integers(0, 256, n)) for n in (3, 17, 8)]
    logits, past, mask = lm.prefill(prompts)
    for row, p in enumerate(prompts):
        np.testing.assert_allclose(logits[row], lm.last_logits(p), atol=TOL, rtol=0)
    # one batched decode step with per-row positions, against each sequence alone
    nxt = np.argmax(logits, axis=1)
    mask2 = np.concatenate([mask, np.ones((3, 1), np.int64)], axis=1)
    pos = np.array([[len(p)] for p in prompts])
    logits2, _ = lm.step(nxt[:, None], mask2, pos, past)
    for row, p in enumerate(prompts):
        np.testing.assert_allclose(logits2[row], lm.last_logits([*p, int(nxt[row])]), atol=TOL, rtol=0)


def test_tiny_lm_logits_are_not_degenerate(lm):
    logits = lm.last_logits([1, 2, 3])
    assert np.isfinite(logits).all() and logits.std() > 0.01


@pytest.mark.parametrize("head", ["embed", "classify"])
def test_bert_graph_matches_numpy_reference_with_padding(head):
    spec = bert.PRESETS["tiny"].with_head(head)
    w = bert.random_weights(spec, np.random.default_rng(3))
    sess = Session(cached_model(f"t-bert-{head}", spec.key(), lambda: bert.build_graph(spec, w)))
    tok = ByteEncoderTokenizer()
    feeds = pad_batch([tok.encode("short"), tok.encode("a somewhat longer input", "with a pair")])
    got = sess.run(feeds)[0]
    ref = bert.forward_numpy(spec, w, feeds["input_ids"], feeds["attention_mask"], feeds["token_type_ids"])
    np.testing.assert_allclose(got, ref, atol=TOL, rtol=0)
    alone = sess.run(pad_batch([tok.encode("short")]))[0]
    np.testing.assert_allclose(alone[0], got[0], atol=TOL, rtol=0)  # padding does not leak into results


def test_image_classifier_batch_equals_single():
    model = registry.load("resnet-tiny")
    rng = np.random.default_rng(4)
    imgs = [rng.standard_normal((3, 224, 224), dtype=np.float32) for _ in range(3)]
    batched = model.run(imgs)
    for img, row in zip(imgs, batched, strict=True):
        np.testing.assert_allclose(model.run([img])[0], row, atol=1e-5)
        assert abs(row.sum() - 1) < 1e-5


def test_blockwise_normal_weights_are_numpys_draw_bit_for_bit():
    """normal_f32 draws a block at a time: the same float32 values as one draw cast whole, and the generator left
    where one draw leaves it (the next weight's values do not move), over blocks and a ragged tail."""
    shape = (3, graph.NORMAL_BLOCK // 2 + 7)
    a, b = np.random.default_rng(7), np.random.default_rng(7)
    got, want = graph.normal_f32(a, 0.02, shape), b.normal(0, 0.02, shape).astype(np.float32)
    assert got.dtype == np.float32 and got.shape == shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert a.normal() == b.normal()


def test_cache_reuses_same_spec_and_rebuilds_changed_spec():
    spec = resnet.ResNetSpec(widths=(8, 8, 8, 8), blocks=(1, 1, 1, 1), num_classes=10)
    builds = []

    def build(s):
        builds.append(s)
        return resnet.build(s, np.random.default_rng(0))

    p1 = cached_model("t-resnet", spec.key(), lambda: build(spec))
    p2 = cached_model("t-resnet", spec.key(), lambda: build(spec))
    spec2 = resnet.ResNetSpec(widths=(8, 8, 8, 8), blocks=(1, 1, 1, 1), num_classes=11)
    p3 = cached_model("t-resnet", spec2.key(), lambda: build(spec2))
    assert p1 == p2 != p3 and len(builds) == 2
    assert spec_key(spec.key()) != spec_key(spec2.key())
    assert Session(p3).run({"pixel_values": np.zeros((1, 3, 224, 224), np.float32)})[0].shape == (1, 11)


_BUILDER = """
import pathlib, sys, time
from dataplane.cache import cached_model
from dataplane.models import resnet
import numpy as np
spec, d = resnet.ResNetSpec(widths=(8, 8, 8, 8), blocks=(1, 1, 1, 1), num_classes=3), pathlib.Path(sys.argv[1])
def build():
    with open(d / "builds", "a") as f:
        f.write("x")
    (d / "building").touch()
    deadline = time.monotonic() + 120  # a hang guard
    while not (d / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return resnet.build(spec, np.random.default_rng(0))
print(cached_model("t-locked", spec.key(), build))
"""


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs Linux's /proc/locks to see the second wait")
def test_two_processes_asking_for_one_model_build_it_once(tmp_path):
    """The first process builds; the second, asking while the build runs, waits on the cache's lock (seen waiting
    in /proc/locks) and then takes the first's file: one build, one path."""
    env = {**os.environ, "EDGEPOP_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", _BUILDER, str(tmp_path)]

    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    until(lambda: (tmp_path / "building").exists(), "never: the first build started")
    second = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    lock = next((tmp_path / "cache").glob("t-locked-*.lock"))
    inode = f":{lock.stat().st_ino} "
    until(lambda: any("->" in line and inode in line for line in Path("/proc/locks").read_text().splitlines()),
          "never: the second process waiting on the lock")
    (tmp_path / "release").touch()
    outs = [p.communicate(timeout=120)[0].strip() for p in (first, second)]
    assert first.returncode == second.returncode == 0
    assert outs[0] == outs[1] and Path(outs[0]).is_file()
    assert (tmp_path / "builds").read_text() == "x"


def test_a_cache_variable_that_names_a_file_is_one_clear_error(tmp_path, monkeypatch):
    (tmp_path / "notadir").write_text("x")
    monkeypatch.setenv("EDGEPOP_CACHE", str(tmp_path / "notadir"))
    with pytest.raises(UserError, match=re.escape(f"$EDGEPOP_CACHE={tmp_path / 'notadir'} is a file; the model "
                                                  "cache needs a folder")):
        cached_model("t-none", {"k": 1}, lambda: None)
    monkeypatch.setenv("EDGEPOP_CACHE", str(tmp_path / "notadir" / "sub"))
    with pytest.raises(UserError, match=re.escape(f"$EDGEPOP_CACHE={tmp_path / 'notadir' / 'sub'}: cannot create "
                                                  "the model cache folder there (Not a directory)")):
        cached_model("t-none", {"k": 1}, lambda: None)


def test_log_mel_puts_a_tone_in_the_right_band():
    t = np.arange(16000) / 16000
    mels = {f: audio.log_mel(audio.decode_wav(audio.encode_wav(0.5 * np.sin(2 * np.pi * f * t)))) for f in (300, 3000)}
    assert mels[300].shape == (80, 100)
    peak_low, peak_high = (int(m.mean(axis=1).argmax()) for m in (mels[300], mels[3000]))
    assert peak_low < peak_high
    centres = np.argmax(audio.mel_filters(), axis=1) * 16000 / 400  # Hz at each filter's peak
    assert abs(centres[peak_low] - 300) < 60 and abs(centres[peak_high] - 3000) < 300


def test_wav_resampling_and_stereo():
    t = np.arange(8000) / 8000
    stereo = np.repeat(0.3 * np.sin(2 * np.pi * 200 * t), 2)
    import io
    import wave

    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes((stereo * 32767).astype("<i2").tobytes())
    x = audio.decode_wav(buf.getvalue())
    assert len(x) == 16000 and abs(np.abs(x).max() - 0.3) < 0.01


def test_ctc_greedy_decode_merges_repeats_and_drops_blanks():
    idx = {c: i for i, c in enumerate(speech.ALPHABET)}
    path = [0, idx["h"], idx["h"], 0, idx["i"], idx[" "], idx[" "], 0, idx["o"], 0, idx["o"]]
    lp = np.full((len(path), len(speech.ALPHABET)), -10.0)
    lp[np.arange(len(path)), path] = 0.0
    assert speech.ctc_greedy_decode(lp) == "hi oo"


def test_safetensors_reader_roundtrip(tmp_path):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([7, -1], dtype=np.int64)
    bf = np.array([1.5, -2.0], dtype=np.float32)
    bf16 = (bf.view(np.uint32) >> 16).astype("<u2").tobytes()
    blobs = [a.tobytes(), b.tobytes(), bf16]
    offs = np.cumsum([0] + [len(x) for x in blobs])
    header = {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [int(offs[0]), int(offs[1])]},
              "b": {"dtype": "I64", "shape": [2], "data_offsets": [int(offs[1]), int(offs[2])]},
              "c": {"dtype": "BF16", "shape": [2], "data_offsets": [int(offs[2]), int(offs[3])]},
              "__metadata__": {"format": "pt"}}
    h = json.dumps(header).encode()
    (tmp_path / "x.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    out = minilm.read_safetensors(tmp_path / "x.safetensors")
    np.testing.assert_array_equal(out["a"], a)
    np.testing.assert_array_equal(out["b"], b)
    np.testing.assert_array_equal(out["c"], bf)


def test_gpt2_small_kv_cache_matches_recompute():
    """The one test of a 124M model: its real shape builds, runs, and its KV cache is exact."""
    model = registry.load("gpt2-small")
    assert model.spec.n_layer == 12 and model.spec.vocab_size == 50257
    tokens = [464, 5044, 286, 1660, 318]
    logits, past, mask = model.prefill([tokens])
    assert logits.shape == (1, 50257) and past[0].shape == (1, 12, 5, 64)
    for _ in range(3):
        nxt = int(np.argmax(logits[0]))
        tokens.append(nxt)
        mask = np.concatenate([mask, np.ones((1, 1), np.int64)], axis=1)
        logits, past = model.step(np.array([[nxt]]), mask, np.array([[len(tokens) - 1]]), past)
        np.testing.assert_allclose(logits[0], model.last_logits(tokens), atol=TOL, rtol=0)


def _wordlevel_tokenizer():
    """A Hugging Face tokenizer (the ``tokenizers`` library) with BERT's specials: word ``w{i}`` is one token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{f"w{i}": i + 4 for i in range(10)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    return tok


def test_pair_truncation_is_hugging_faces_longest_first():
    """The pair cut is the tokenizers library's: on an odd budget the side that was longer (the second when equal)
    keeps the extra token; the first side kept it (126 and 127 tokens where the library gives 127 and 126)."""
    from dataplane.tokenization import _truncate_pair

    tok = _wordlevel_tokenizer()
    for la in range(0, 22):
        for lb in range(0, 22):
            for budget in range(0, 40):
                tok.enable_truncation(max_length=budget + 3)  # [CLS] a [SEP] b [SEP]
                types = tok.encode(" ".join(["w1"] * la), " ".join(["w2"] * lb)).type_ids
                a, b = _truncate_pair(list(range(la)), list(range(100, 100 + lb)), budget)
                assert (len(a), len(b)) == (types.count(0) - 2, types.count(1) - 1), (la, lb, budget)
                assert a == list(range(len(a))) and b == list(range(100, 100 + len(b)))  # (the ends are cut)
    assert tuple(map(len, _truncate_pair([0] * 200, [0] * 150, 253))) == (127, 126)


def test_a_cut_pairs_full_length_counts_each_token_once(tmp_path):
    """A pair of 403 tokens (specials included) cut to 256 reported 803: its overflowing pieces were summed."""
    from dataplane.tokenization import ByteEncoderTokenizer, WordPieceTokenizer

    _wordlevel_tokenizer().save(str(tmp_path / "tokenizer.json"))
    tok = WordPieceTokenizer(tmp_path / "tokenizer.json", max_length=256)
    q, p = " ".join(["w1"] * 200), " ".join(["w2"] * 200)
    enc = tok.encode(q, p)
    assert (len(enc), enc.full_length) == (256, 403)
    assert tok.encode(q + " " + p).full_length == 402 and tok.encode(q).full_length is None
    assert tok.encode("w1 w2", "w3").full_length is None
    assert ByteEncoderTokenizer(256).encode("a" * 200, "b" * 200).full_length == 403
