"""edgepop data plane: real ONNX inference.

* :mod:`dataplane.registry` - models by name (GPT-2, BERT heads, real MiniLM, ResNet, CTC speech);
  :mod:`dataplane.byom` registers your own ONNX file from a manifest.
* :mod:`dataplane.engine_lm` (continuous batching, KV cache) and :mod:`dataplane.engine_batch`
  (dynamic batching): background-thread engines with thread-safe ``submit``.
* :mod:`dataplane.tasks` - the Workers AI task table (prepare -> run -> shape; its field parsers in
  :mod:`dataplane.task_inputs`), used by
  :class:`dataplane.service.DataPlane` (models, engines and tasks together) and by the gateway.
* :mod:`dataplane.profiler` and :mod:`dataplane.engine_profile` - service-time tables for the simulator.
* :mod:`dataplane.gateway` - the live HTTP gateway over these engines, routed by the control plane.

Outside ``dataplane.gateway`` this package imports only ``edgepop``; the gateway alone uses ``controlplane``
and ``topology``.
"""
