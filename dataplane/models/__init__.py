"""Model zoo: architecture-faithful ONNX graphs built from code (GPT-2, BERT, ResNet, CTC speech)."""
