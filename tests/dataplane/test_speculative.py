"""Speculative decoding: output equals the target's plain greedy decoding; the Net2Net pair really agrees."""

from __future__ import annotations

import numpy as np
import pytest

from dataplane.errors import InvalidInputError
from dataplane.models import gpt2
from dataplane.models.gpt2_pair import widen_deepen
from dataplane.speculative import generate_greedy, generate_speculative, load_pair


@pytest.fixture(scope="module")
def pair(_model_cache):
    return load_pair()


def test_speculative_equals_greedy_for_several_prompts_and_k(pair):
    target, draft = pair
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, 256, n).tolist() for n in (1, 9, 40)]
    accepted = tried = 0
    for prompt in prompts:
        want = generate_greedy(target, prompt, 24)
        assert len(want) == 24
        for k in (1, 3, 5):
            res = generate_speculative(target, draft, prompt, k=k, max_tokens=24)
            assert res.token_ids == want, (len(prompt), k)
            assert res.rounds == len(res.accepted_per_round) and res.accepted == sum(res.accepted_per_round)
            assert res.rounds < 24 or res.accepted == 0  # accepted proposals save target calls
            accepted, tried = accepted + res.accepted, tried + res.accepted + res.rejections
    assert 0.3 < accepted / tried < 0.95  # the pair agrees often, not always


def test_eos_stops_speculation_like_greedy(pair):
    target, draft = pair
    prompt = np.random.default_rng(2).integers(0, 256, 12).tolist()
    want = generate_greedy(target, prompt, 30)
    target.tokenizer.eos_id, old = want[5], target.tokenizer.eos_id  # pretend the 6th token is EOS
    try:
        res = generate_speculative(target, draft, prompt, k=4, max_tokens=30, stop_on_eos=True)
    finally:
        target.tokenizer.eos_id = old
    assert res.finish_reason == "stop" and res.token_ids == want[:want.index(want[5])]


def test_net2net_without_noise_preserves_the_function():
    spec = gpt2.GPT2Spec(n_layer=2, n_embd=32, n_head=2, n_ctx=16, vocab_size=40)
    w = gpt2.random_weights(spec, np.random.default_rng(0))
    t_spec, t_w = widen_deepen(spec, w, widen=2, depth=3)
    assert (t_spec.n_layer, t_spec.n_embd, t_spec.n_head, t_spec.head_dim) == (6, 64, 4, spec.head_dim)
    import onnxruntime as ort

    def logits(s, weights, all_logits):
        sess = ort.InferenceSession(gpt2.build_graph(s, weights, all_logits).SerializeToString())
        ids = np.array([[3, 1, 4, 1, 5]], np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.arange(5)[None]}
        for i in range(s.n_layer):
            for kind in ("key", "value"):
                feeds[f"past_{kind}.{i}"] = np.zeros((1, s.n_head, 0, s.head_dim), np.float32)
        return sess.run(["logits"], feeds)[0]

    small, big = logits(spec, w, False), logits(t_spec, t_w, True)
    assert big.shape == (1, 5, 40)
    np.testing.assert_allclose(big[:, -1], small, atol=1e-4)


def test_bad_arguments_are_refused(pair):
    target, draft = pair
    with pytest.raises(InvalidInputError):
        generate_speculative(target, draft, [1, 2], k=0)
    with pytest.raises(InvalidInputError):
        generate_speculative(target, draft, [], k=2)


def test_cli_speculate_prints_figures(pair, capsys):
    import json

    from edgepop.cli import main

    assert main(["speculate", "--k", "3", "--max-tokens", "8", "--prompt", "edge"]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["identical_to_greedy"] is True and figures["tokens"] == 8 and figures["k"] == 3
    assert main(["speculate", "--k", "0"]) == 2
    capsys.readouterr()
    assert main(["speculate", "--prompt", "", "--max-tokens", "4"]) == 2  # (was: EOS for a prompt, EOS out)
    assert capsys.readouterr().err.strip() == "edgepop: error: --prompt is empty: give some text to continue"
