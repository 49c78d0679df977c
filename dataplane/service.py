"""The data plane as one object: loaded models plus their engines, created on first use.

By default a model has one engine. A caller that emulates several replicas of a model (the live gateway: one
replica per emulated PoP) names the replica, and each replica gets an engine of its own (its own batch, queue
and KV cache) over the same loaded model, so requests at different replicas never share a batch.

:meth:`DataPlane.run` serves a Workers-AI-shaped request synchronously through the task table of
:mod:`dataplane.tasks` (prepare, submit to the engine, wait, shape). The live gateway holds a :class:`DataPlane`
too and runs the same table's prepare and shape around its own asynchronous engine step
(:mod:`dataplane.gateway.invoke`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from dataplane import registry, tasks
from dataplane.engine_batch import BatchConfig, BatchingEngine
from dataplane.engine_lm import LMEngine, LMEngineConfig
from dataplane.runtime import SYNTHETIC_NOTE
from dataplane.session import SessionConfig


@dataclass(frozen=True)
class DataPlaneConfig:
    """Session settings and engine settings shared by every model."""

    session: SessionConfig = field(default_factory=SessionConfig)
    lm: LMEngineConfig = field(default_factory=LMEngineConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)

    def __post_init__(self):
        # A dict here (batch={"max_batch": 4}) used to be accepted and kill the engine thread at its first batch.
        for name, kind in (("session", SessionConfig), ("lm", LMEngineConfig), ("batch", BatchConfig)):
            value = getattr(self, name)
            if not isinstance(value, kind):
                raise ValueError(f"DataPlaneConfig.{name} must be a {kind.__name__}, got {value!r}")


class DataPlane:
    """Models and their engines; thread-safe."""

    def __init__(self, config: DataPlaneConfig | None = None):
        self.config = config or DataPlaneConfig()
        self._engines: dict[tuple[str, int | None], LMEngine | BatchingEngine] = {}
        self._lora: dict[str, object] = {}  # name -> LoraLanguageModel serving it instead of the plain LM
        self._lock = threading.Lock()

    def card(self, name: str) -> registry.ModelCard:
        return registry.get_card(name)

    def model(self, name: str):
        """The loaded runtime object of ``name``."""
        return self._lora.get(name) or registry.load(name, self.config.session)

    def enable_lora(self, name: str):
        """Serve the text-generation model ``name`` through a :class:`~dataplane.lora.LoraLanguageModel` (same
        weights, per-row adapter inputs), so its engine accepts per-request adapters. Call before the engine
        starts; returns the LoRA model (its ``spec`` validates adapter files)."""
        from dataplane.lora import LoraLanguageModel

        with self._lock:
            if name in self._lora:
                return self._lora[name]
            if any(n == name for n, _ in self._engines):
                raise RuntimeError(f"{name!r} is already served without adapters")
        if self.card(name).task != "text-generation":
            raise ValueError(f"{name!r} is not a text-generation model; LoRA adapters need one")
        base = registry.load(name, self.config.session)
        lm = LoraLanguageModel(name, base.spec, base.session.path, self.config.session)
        with self._lock:
            return self._lora.setdefault(name, lm)

    def engine(self, name: str, replica: int | None = None) -> LMEngine | BatchingEngine:
        """The engine serving ``name`` (an LM engine for text generation, a batching engine otherwise); with
        ``replica``, the engine of that replica of ``name`` (one per replica)."""
        key = (name, replica)
        with self._lock:
            eng = self._engines.get(key)
        if eng is not None:
            return eng
        card, model = self.card(name), self.model(name)
        label = name if replica is None else f"{name}@{replica}"  # the engine thread's name
        if card.task == "text-generation":
            eng = LMEngine(model, self.config.lm, name=label)
        else:
            cfg = self.config.batch
            if card.task == "automatic-speech-recognition":
                cfg = BatchConfig(max_batch=1, max_wait_ms=0)  # no attention mask: padding would change results
            eng = BatchingEngine(model.run, cfg, name=label)
        with self._lock:
            if key in self._engines:  # another thread won the race; keep one engine per model and replica
                eng.close()
            return self._engines.setdefault(key, eng)

    def engines(self) -> list[tuple[str, int | None, LMEngine | BatchingEngine]]:
        """Every started engine as (model name, replica or None, engine)."""
        with self._lock:
            return [(name, replica, eng) for (name, replica), eng in self._engines.items()]

    def run(self, name: str, inputs: dict):
        """Run the task of model ``name`` on Workers-AI-shaped ``inputs``; returns the task's result (with
        ``stream: true``, a text generation returns an iterator of events). A ``lora`` field is refused here:
        adapters are served by the gateway."""
        return tasks.run(self, name, inputs)

    def envelope(self, name: str, result) -> dict:
        """The Workers AI REST envelope around ``result``, with metadata (provider, synthetic weights)."""
        card, model = self.card(name), self.model(name)
        messages = [SYNTHETIC_NOTE] if card.synthetic else []
        return {"result": result, "success": True, "errors": [], "messages": messages,
                "meta": {"model": name, "task": card.task, "provider": model.provider,
                         "synthetic_weights": card.synthetic}}

    def close(self) -> None:
        """Stop every engine."""
        with self._lock:
            engines, self._engines = list(self._engines.values()), {}
        for eng in engines:
            eng.close()

    def __enter__(self) -> DataPlane:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
