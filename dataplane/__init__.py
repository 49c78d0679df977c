"""edgepop data plane: real ONNX inference (docs/dataplane.md; its live serving techniques in docs/techniques.md).

Reading guide (start at :mod:`dataplane.service`: ``DataPlane``, models, engines and tasks together):

* models: :mod:`dataplane.registry` - models by name (GPT-2, BERT heads, real MiniLM, ResNet, CTC speech), built
  by the zoo :mod:`dataplane.models` with :mod:`dataplane.graph` and kept by :mod:`dataplane.cache` (on disk,
  keyed by spec); :mod:`dataplane.byom` registers your own ONNX file from a manifest;
* running them: :mod:`dataplane.session` (onnxruntime sessions and providers), :mod:`dataplane.runtime` (a
  session plus its pre- and post-processing), with :mod:`dataplane.tokenization`, :mod:`dataplane.audio`
  (WAV and log-mel features) and :mod:`dataplane.sampling` (temperature, top-k, top-p);
* engines, background threads with thread-safe ``submit``: :mod:`dataplane.engine_lm` (continuous batching over
  the KV cache; the caller's side in :mod:`dataplane.lm_handle`, the cache in :mod:`dataplane.padded_kv`, prefix
  KV reuse in :mod:`dataplane.prefix_cache`) and :mod:`dataplane.engine_batch` (dynamic batching);
* :mod:`dataplane.tasks` - the Workers AI task table (prepare -> run -> shape; its field parsers in
  :mod:`dataplane.task_inputs`), used by :class:`dataplane.service.DataPlane` and by the gateway;
  :mod:`dataplane.errors`: the typed errors a caller can cause;
* :mod:`dataplane.profiler` and :mod:`dataplane.engine_profile` - service-time tables for the simulator
  (``edgepop profile``: :mod:`dataplane.cli`);
* live serving techniques: :mod:`dataplane.speculative` (speculative decoding), :mod:`dataplane.lora` and
  :mod:`dataplane.lora_check` (LoRA adapters in the graph), :mod:`dataplane.quantize` (int8); their commands in
  :mod:`dataplane.cli_live`;
* :mod:`dataplane.gateway` - the live HTTP gateway over these engines, routed by the control plane.

Outside ``dataplane.gateway`` this package imports only ``edgepop``; the gateway alone uses ``controlplane``
and ``topology``.
"""
