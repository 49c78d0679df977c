"""edgepop data plane: real ONNX inference.

* :mod:`dataplane.registry` - models by name (GPT-2, BERT heads, real MiniLM, ResNet, CTC speech);
  :mod:`dataplane.byom` registers your own ONNX file from a manifest.
* :mod:`dataplane.engine_lm` (continuous batching, KV cache) and :mod:`dataplane.engine_batch`
  (dynamic batching): background-thread engines with thread-safe ``submit``.
* :mod:`dataplane.tasks` - Workers-AI-shaped task functions; :class:`dataplane.service.DataPlane` ties
  models, engines and tasks together.
* :mod:`dataplane.profiler` - the ``edgepop profile`` table for the simulator.

This package never imports ``topology``, ``controlplane`` or ``sim``.
"""
