"""LoRA adapters in the ONNX GPT-2: in-graph low-rank path vs a float64 numpy reference, and validation."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from dataplane import lora
from dataplane.models import gpt2
from dataplane.models.gpt2_ref import forward_numpy
from dataplane.session import SessionConfig

SPEC = gpt2.PRESETS["tiny"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    w = gpt2.random_weights(SPEC, np.random.default_rng(7))
    path = tmp_path_factory.mktemp("lora") / "base.onnx"
    onnx.save(gpt2.build_graph(SPEC, w), str(path))
    model = lora.LoraLanguageModel("gpt2-tiny-test", SPEC, path, SessionConfig(provider="cpu"))
    return w, path, model


def _adapter(rank=8, alpha=16.0, seed=1, targets=lora.PROJECTIONS):
    return lora.random_adapter(SPEC, rank, alpha, np.random.default_rng(seed), targets=targets)


def _ids(b=2, t=10, seed=3):
    return np.random.default_rng(seed).integers(0, SPEC.vocab_size, (b, t))


def test_in_graph_lora_matches_numpy_reference_prefill_and_cached_decode(base):
    w, _, model = base
    ad = _adapter()
    ids = _ids(t=11)
    model.adapters = ad
    logits, past, mask = model.prefill([list(r) for r in ids[:, :10]])
    np.testing.assert_allclose(logits, forward_numpy(SPEC, w, ids[:, :10], ad.deltas()), atol=1e-4, rtol=0)
    mask = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
    step, _ = model.step(ids[:, 10:], mask, np.full((2, 1), 10, np.int64), past)
    np.testing.assert_allclose(step, forward_numpy(SPEC, w, ids, ad.deltas()), atol=1e-4, rtol=0)


def test_adapter_changes_outputs_and_base_rows_stay_base(base):
    w, _, model = base
    ad = _adapter(rank=4, alpha=8.0, targets=("attn", "fc"))
    ids = _ids()
    ref_base = forward_numpy(SPEC, w, ids)
    model.adapters = [None, ad]  # one batch, two different models
    mixed = model.prefill([list(r) for r in ids])[0]
    np.testing.assert_allclose(mixed[0], ref_base[0], atol=1e-4, rtol=0)
    np.testing.assert_allclose(mixed[1], forward_numpy(SPEC, w, ids, ad.deltas())[1], atol=1e-4, rtol=0)
    assert np.abs(mixed[1] - ref_base[1]).max() > 0.05  # >500x the tolerance: the adapter really acts


def test_mixed_ranks_in_one_batch_and_alpha_scaling(base):
    w, _, model = base
    a8, a2 = _adapter(rank=8, alpha=4.0, seed=5), _adapter(rank=2, alpha=4.0, seed=6)
    ids = _ids(seed=9)
    model.adapters = [a8, a2]
    got = model.prefill([list(r) for r in ids])[0]
    np.testing.assert_allclose(got[0], forward_numpy(SPEC, w, ids, a8.deltas())[0], atol=1e-4, rtol=0)
    np.testing.assert_allclose(got[1], forward_numpy(SPEC, w, ids, a2.deltas())[1], atol=1e-4, rtol=0)
    doubled = lora.Adapter(a2.rank, 2 * a2.alpha, a2.tensors)
    model.adapters = doubled
    got2 = model.prefill([list(r) for r in ids])[0]
    np.testing.assert_allclose(got2, forward_numpy(SPEC, w, ids, doubled.deltas()), atol=1e-4, rtol=0)
    assert np.abs(got2[1] - got[1]).max() > 0.01


def test_baked_and_merged_variants_agree_with_reference(base, tmp_path):
    from dataplane.runtime import LanguageModel

    w, path, _ = base
    ad = _adapter(seed=11)
    ids = _ids(seed=12)
    ref = forward_numpy(SPEC, w, ids, ad.deltas())
    onnx.save(lora.bake_adapter(onnx.load(str(path)), ad), str(tmp_path / "baked.onnx"))
    onnx.save(gpt2.build_graph(SPEC, lora.merge_weights(w, ad)), str(tmp_path / "merged.onnx"))
    for name in ("baked", "merged"):
        m = LanguageModel(name, SPEC, tmp_path / f"{name}.onnx", SessionConfig(provider="cpu"))
        np.testing.assert_allclose(m.prefill([list(r) for r in ids])[0], ref, atol=1e-4, rtol=0)


def test_adapter_file_round_trip(tmp_path):
    ad = _adapter(rank=32, alpha=32.0)
    back = lora.load_adapter(lora.save_adapter(ad, tmp_path / "a.npz"), SPEC)
    assert (back.rank, back.alpha, back.scale) == (32, 32.0, 1.0)
    assert set(back.tensors) == set(ad.tensors)
    np.testing.assert_array_equal(back.tensors["h3.fc"][1], ad.tensors["h3.fc"][1])


def _write(path, meta, tensors):
    arrays = {"__metadata__": np.array(json.dumps(meta))} if meta is not None else {}
    arrays.update(tensors)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return path


def _bad_cases(tmp_path):
    c = SPEC.n_embd
    a, b = np.zeros((c, 4), np.float32), np.zeros((4, 3 * c), np.float32)
    ok = {"rank": 4, "alpha": 8}
    big_a, big_b = np.zeros((c, 64), np.float32), np.zeros((64, 3 * c), np.float32)
    return {
        "rank": (_write(tmp_path / "r.npz", {"rank": 64, "alpha": 8}, {"h0.attn.lora_A": big_a,
                                                                          "h0.attn.lora_B": big_b}), "'rank' = 64"),
        "shape": (_write(tmp_path / "s.npz", ok, {"h0.attn.lora_A": a, "h0.attn.lora_B": b[:, :c]}), "shape [4, 384]"),
        "proj": (_write(tmp_path / "p.npz", ok, {"h9.attn.lora_A": a, "h9.attn.lora_B": b}), "'h9.attn'"),
        "missing": (_write(tmp_path / "m.npz", ok, {"h0.attn.lora_A": a}), "'h0.attn.lora_B' is missing"),
        "meta": (_write(tmp_path / "n.npz", None, {"h0.attn.lora_A": a, "h0.attn.lora_B": b}), "__metadata__"),
        "alpha": (_write(tmp_path / "al.npz", {"rank": 4, "alpha": -1}, {"h0.attn.lora_A": a, "h0.attn.lora_B": b}),
                  "'alpha' = -1"),
        "nan": (_write(tmp_path / "nan.npz", ok, {"h0.attn.lora_A": a, "h0.attn.lora_B": b * np.nan}), "finite"),
        # finite in the file's float64, infinite in the float32 the model computes in
        "float32": (_write(tmp_path / "f64.npz", ok, {"h0.attn.lora_A": np.full((c, 4), 1e39),
                                                      "h0.attn.lora_B": b}), "beyond float32's range"),
    }


def test_bad_adapters_are_rejected_with_one_line_errors(tmp_path):
    for case, (path, needle) in _bad_cases(tmp_path).items():
        with pytest.raises(lora.AdapterError) as err:
            lora.load_adapter(path, SPEC)
        msg = str(err.value)
        assert needle in msg and str(path) in msg and "\n" not in msg, (case, msg)
    (tmp_path / "junk.npz").write_bytes(b"not a zip file")
    with pytest.raises(lora.AdapterError, match="not a readable .npz"):
        lora.load_adapter(tmp_path / "junk.npz", SPEC)


def test_adapter_size_limit(tmp_path, monkeypatch):
    path = lora.save_adapter(_adapter(rank=2), tmp_path / "a.npz")
    monkeypatch.setattr(lora, "MAX_ADAPTER_BYTES", path.stat().st_size - 1)
    with pytest.raises(lora.AdapterError, match="exceeds the adapter limit"):
        lora.load_adapter(path, SPEC)


def test_cli_lora_check(capsys, tmp_path):
    from edgepop.cli import main

    assert main(["lora-check", "--rank", "4", "--seed", "2"]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["lora_vs_numpy_max_abs"] < 1e-4 and figures["lora_vs_base_max_abs"] > 0.05
    assert figures["mixed_batch_max_abs"] < 1e-4 and figures["merged_vs_numpy_max_abs"] < 1e-4
    path, _ = _bad_cases(tmp_path)["rank"]
    assert main(["lora-check", "--adapter", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("edgepop: error:") and "'rank' = 64" in err and "\n" not in err
